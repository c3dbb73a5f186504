"""The backend's behaviour around the numbers: entry point, graph breaks, dynamic shapes,
inference, failures and reporting."""

import copy
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters

import gact_fx
import gact_fx.partitioner
from gact_fx.runtime import ops

from .helpers import MLP, baseline_backend, compiled_grads, flat_grad, model_case, projection_loss, relative_error


def test_the_entry_point_takes_options_and_fills_last_report():
    model, inputs = model_case("mlp")
    compiled = torch.compile(model, backend="gact", options={"bits": 4, "min_numel": 1024}, fullgraph=True)
    projection_loss(compiled(*inputs)).backward()
    report = gact_fx.last_report()
    assert report.records[-1].config.core.bits == 4
    assert {r.bits for r in report.rows if r.stored == "compressed"} == {4, 1}  # floats, and the ReLU mask
    assert "total activations" in report.table()


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(64, 256), nn.Linear(256, 256), nn.Linear(256, 10)

    def forward(self, x):
        h = F.gelu(self.a(x))
        torch._dynamo.graph_break()
        return self.c(torch.tanh(self.b(h)))


def test_activations_crossing_a_graph_break_are_compressed():
    model, x = Broken(), torch.randn(32, 64)
    (expected,), _ = compiled_grads(model, (x,), baseline_backend(), fullgraph=False)
    counters.clear()
    backend = gact_fx.backend(bits=8)
    (got,), _ = compiled_grads(model, (x,), backend, fullgraph=False)
    assert len(backend.records) == 2 == counters["stats"]["unique_graphs"]
    crossing = [r for r in backend.records[1].rows if r.kind == "graph input"]
    assert crossing and all(r.stored == "compressed" for r in crossing)
    assert relative_error(got, expected) < 2e-2


@pytest.mark.parametrize("how", ["dynamic=True", "mark_dynamic"])
def test_dynamic_batch_sizes_compile_once(how):
    model = MLP()
    backend, reference = gact_fx.backend(bits=8), baseline_backend()
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    kwargs = {"dynamic": True} if how == "dynamic=True" else {}
    compiled = torch.compile(ours, backend=backend, fullgraph=True, **kwargs)
    compiled_reference = torch.compile(theirs, backend=reference, fullgraph=True, **kwargs)
    counters.clear()
    for batch in (4, 6, 9, 16):
        x = torch.randn(batch, 64)
        if how == "mark_dynamic":
            torch._dynamo.mark_dynamic(x, 0)
        for m, c in ((ours, compiled), (theirs, compiled_reference)):
            m.zero_grad()
            projection_loss(c(x)).backward()
        assert relative_error(flat_grad(ours), flat_grad(theirs)) < 2e-2
    assert len(backend.records) == 1
    assert counters["stats"]["unique_graphs"] == 2  # one per backend, for all four sizes


def test_a_failing_pass_is_an_error_not_a_silent_fallback(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("planner exploded")

    monkeypatch.setattr(gact_fx.partitioner, "plan_compression", broken)
    model, inputs = model_case("mlp")
    compiled = torch.compile(model, backend=gact_fx.backend())
    with pytest.raises(Exception, match="planner exploded"):
        compiled(*inputs)


def test_a_model_with_only_tiny_tensors_runs_and_says_why(caplog):
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    backend = gact_fx.backend(bits=2)
    with caplog.at_level(logging.INFO, logger="gact_fx"):
        compiled = torch.compile(model, backend=backend, fullgraph=True)
        compiled(torch.randn(3, 4)).sum().backward()
    assert backend.report().num_compressed == 0
    assert any("nothing compressed" in m and "< min_numel=4096" in m for m in caplog.messages)
    assert all(p.grad is not None for p in model.parameters())


@pytest.fixture
def quantize_calls(monkeypatch):
    calls = []
    original = ops.encode_permuted
    monkeypatch.setattr(ops, "encode_permuted", lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


@pytest.mark.parametrize("context", ["no_grad", "inference_mode", "eval+no_grad"])
def test_inference_pays_nothing(context, quantize_calls):
    model, inputs = model_case("mlp")
    backend = gact_fx.backend(bits=2)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    if context == "eval+no_grad":
        compiled.eval()
    guard = torch.inference_mode() if context == "inference_mode" else torch.no_grad()
    with guard:
        compiled(*inputs)
    assert backend.records == [] and quantize_calls == []
    compiled.train()
    projection_loss(compiled(*inputs)).backward()
    assert len(backend.records) == 1 and quantize_calls  # training still compresses


def test_dropout_masks_are_stored_losslessly():
    from .helpers import tiny_gpt2

    model, inputs = tiny_gpt2(dropout=0.1), (torch.randint(0, 128, (4, 32)),)
    (expected,), _ = compiled_grads(model, inputs, baseline_backend())
    backend = gact_fx.backend(bits=32)
    (got,), _ = compiled_grads(model, inputs, backend)
    assert torch.equal(got, expected)
    masks = [r for r in backend.report().rows if r.dtype == "bool" and r.stored == "compressed"]
    assert masks and all(r.bits == 1 for r in masks)


@pytest.mark.parametrize("bits", [32, 8])
def test_inductor_path(bits):
    model, inputs = model_case("mlp")
    (expected,), _ = compiled_grads(model, inputs, baseline_backend("inductor"))
    backend = gact_fx.backend(bits=bits, compiler="inductor")
    (got,), _ = compiled_grads(model, inputs, backend)
    (record,) = backend.records
    assert record.compiler == "inductor" and record.compressions
    if bits == 32:
        assert torch.equal(got, expected)
    else:
        assert 0 < relative_error(got, expected) < 2e-2


@pytest.mark.parametrize("options", [dict(compiler="inductor"), dict(lowering="aten", rounding="stochastic")],
                         ids=["inductor", "aten-lowering"])
def test_dynamic_shapes_compile_once(options):
    model = MLP()
    backend = gact_fx.backend(bits=8, **options)
    compiled = torch.compile(model, backend=backend, dynamic=True, fullgraph=True)
    counters.clear()
    for batch in (4, 7, 12):
        projection_loss(compiled(torch.randn(batch, 64))).backward()
    assert len(backend.records) == 1 and counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_models_compress(dtype):
    model, (x,) = model_case("mlp")
    model, x = model.to(dtype), x.to(dtype)
    (expected,), _ = compiled_grads(model, (x,), baseline_backend())
    exact = gact_fx.backend(bits=32)
    (got,), _ = compiled_grads(model, (x,), exact)
    assert torch.equal(got, expected)
    rows = [r for r in exact.report().rows if r.stored == "compressed" and r.dtype != "bool"]
    assert rows and {r.dtype for r in rows} == {str(dtype).removeprefix("torch.")}
    (got,), _ = compiled_grads(model, (x,), gact_fx.backend(bits=8))
    assert relative_error(got.float(), expected.float()) < 3e-2


def test_a_warm_compile_cache_still_reports():
    # AOTAutograd's cache would skip the partitioner on a hit; gact turns it off.
    model, inputs = model_case("mlp")
    first = gact_fx.backend(compiler="inductor")
    compiled_grads(model, inputs, first)
    torch._dynamo.reset()
    second = gact_fx.backend(compiler="inductor")
    compiled_grads(model, inputs, second)
    assert first.report().num_compressed == second.report().num_compressed > 0


def test_the_inductor_partitioner_has_a_config_dependent_cache_key():
    import pickle

    from gact_fx.config import GactConfig
    from gact_fx.inductor_partitioner import InductorGactPartitioner
    from gact_fx.partitioner import GactPartitioner

    def key(**options):
        inner = GactPartitioner(GactConfig.from_options(options), graph_index=0, compiler="inductor", on_record=print, allocate_slot=int)
        return InductorGactPartitioner(inner)

    assert key(bits=8).uuid() == key(bits=8).uuid() != key(bits=4).uuid()
    restored = pickle.loads(pickle.dumps(key(bits=8)))
    assert restored.uuid() == key(bits=8).uuid()


def test_dynamo_reset_starts_the_shared_backends_afresh():
    model, inputs = model_case("mlp")
    projection_loss(torch.compile(model, backend="gact")(*inputs)).backward()
    assert gact_fx.last_report().num_compressed > 0
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="no graph has been compiled"):
        gact_fx.last_report()


def test_max_pooling_compiles_on_the_eager_path():
    # Inductor's max_pool2d decomposition needs torch._inductor.lowering imported.
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.MaxPool2d(3, 2, 1), nn.Flatten(), nn.Linear(8 * 7 * 7, 10))
    x = torch.randn(4, 3, 16, 16)
    (expected,), _ = compiled_grads(model, (x,), baseline_backend())
    (got,), _ = compiled_grads(model, (x,), gact_fx.backend(bits=32))
    assert torch.equal(got, expected)


def test_exceptions_dynamo_would_fall_back_on_become_errors(monkeypatch):
    from torch._subclasses.fake_tensor import DynamicOutputShapeException

    def broken(*args, **kwargs):
        raise DynamicOutputShapeException(torch.ops.aten.nonzero.default)

    monkeypatch.setattr(gact_fx.partitioner, "plan_compression", broken)
    model, inputs = model_case("mlp")
    compiled = torch.compile(model, backend=gact_fx.backend())  # no fullgraph: Dynamo could fall back
    with pytest.raises(Exception, match="Refusing to let Dynamo fall back"):
        compiled(*inputs)


@pytest.mark.parametrize("name", ["mlp", pytest.param("conv", marks=pytest.mark.slow)])
def test_the_aten_lowering_through_inductor(name):
    model, inputs = model_case(name)
    (expected,), _ = compiled_grads(model, inputs, baseline_backend("inductor"))
    exact = gact_fx.backend(bits=32, lowering="aten", rounding="stochastic")
    (got,), _ = compiled_grads(model, inputs, exact)
    assert exact.records[0].compiler == "inductor"
    # Inductor fuses the decode into the consumers, which may reorder float sums.
    assert relative_error(got, expected) < 1e-5
    (got,), _ = compiled_grads(model, inputs, gact_fx.backend(bits=8, lowering="aten", rounding="stochastic"))
    assert 0 < relative_error(got, expected) < 2e-2




def test_the_aten_lowering_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="needs compiler='inductor'"):
        gact_fx.backend(lowering="aten", compiler="eager")
    with pytest.raises(ValueError, match="needs bits fixed at compile time"):
        gact_fx.backend(lowering="aten", avg_bits=2)
    with pytest.raises(ValueError, match="plain blobs in traced code: pass rounding='stochastic'"):
        gact_fx.backend(lowering="aten")  # the default rounding is dithered


@pytest.mark.parametrize("options, warned", [({"bits": 4}, False), ({"bits": 4, "nonlinear_bits": 4}, True),
                                             ({"bits": 4, "overrides": {"*": 4}}, True),
                                             ({"avg_bits": 3, "nonlinear_bits": 4}, True), ({"avg_bits": 3}, False)])
def test_query_and_key_below_8_bits_are_stored_with_a_warning(caplog, options, warned):
    from gact_fx.bench.tasks import CharGPT

    model, tokens = CharGPT(dim=64, layers=1, heads=2, context=64), torch.randint(0, 256, (4, 64))
    backend = gact_fx.backend(min_numel=0, **options)
    with caplog.at_level(logging.WARNING, logger="gact_fx"):
        torch.compile(model, backend=backend)(tokens).sum().backward()
    exponential = [r for r in backend.report().rows if r.use == "exponential" and r.dtype != "bool"]
    assert exponential  # attention's query and key
    message = [m for m in caplog.messages if "reads through an exponential" in m]
    assert bool(message) == warned, caplog.messages
    if warned:
        assert "biases the gradient" in message[0] and "below 8 bits" in message[0]
