"""Saved tensors affine in another saved tensor are rebuilt in the backward (``passes.affine``)."""

import torch
from torch import nn

import gact_fx
from gact_fx.passes.affine import recompute_affine
from gact_fx.passes.saved import find_saved
from gact_fx.runtime.ops import blob_nbytes

from ..helpers import (TransformerBlock, dynamic_batch_steps, flat_grad, floor_ratio, one_graph_step, relative_error,
                       squared_loss_grad)
from .graphs import Builder, FakeTensorMode, aten


def siblings_pair():
    """``h = x @ w.t()``; saved: ``h``, ``h * h`` (not affine in h), ``3 h + 1`` (affine)
    and ``h + x`` (affine, but ``x`` is a graph input the forward does not save)."""
    mode = FakeTensorMode()
    x, w = torch.randn(32, 64), torch.randn(64, 64)
    f = Builder(mode)
    fx_, fw_ = f.input("x", x), f.input("w", w)
    h = f(aten.mm.default, fx_, f(aten.t.default, fw_))
    square = f(aten.mul.Tensor, h, h)
    affine = f(aten.add.Tensor, f(aten.mul.Tensor, h, 3.0), 1.0)
    shifted = f(aten.add.Tensor, h, fx_)
    out = f(aten.add.Tensor, f(aten.add.Tensor, square, affine), shifted)
    fw = f.output(out, h, square, affine, shifted)

    b = Builder(mode)
    bh, bsquare, baffine, bshifted = (b.input(n, torch.randn(32, 64)) for n in ("mm", "mul", "add", "add_1"))
    tangent = b.input("tangents_1", torch.randn(32, 64))
    grad = b(aten.mul.Tensor, b(aten.mul.Tensor, b(aten.mul.Tensor, tangent, bsquare), baffine), bh)
    bw = b.output(b(aten.mul.Tensor, grad, bshifted), None)
    return fw, bw


def test_only_the_affine_sibling_is_rebuilt_and_the_backward_computes_the_same():
    fw, bw = siblings_pair()
    reference_bw = torch.fx.GraphModule(bw, bw.graph.__deepcopy__())  # before the rewrite
    saved = find_saved(fw, bw, 1)
    assert [v.node.name for v in saved.tensors] == ["mm", "mul", "add", "add_1"]
    assert recompute_affine(fw, bw, saved, static=()) == 1
    after = find_saved(fw, bw, 1)
    assert [v.node.name for v in after.tensors] == ["mm", "mul", "add_1"]  # 3 h + 1 is no longer saved
    assert fw.graph.find_nodes(op="call_function", target=aten.mm.default)[0].meta["gact"]["carries"] == 32 * 64
    rebuilt = [n for n in bw.graph.nodes if n.meta.get("gact", {}).get("role") == "rebuilt"]
    assert [n.target for n in rebuilt] == [aten.mul.Tensor, aten.add.Tensor]

    x, w, tangent = torch.randn(32, 64), torch.randn(64, 64), torch.randn(32, 64)
    out, *kept = fw(x, w)
    h = x @ w.t()
    expected = reference_bw(h, h * h, 3 * h + 1, h + x, tangent)
    got = bw(*kept, tangent)
    torch.testing.assert_close(got[0], expected[0])


def test_nothing_lossy_nothing_rebuilt():
    fw, bw = siblings_pair()
    assert recompute_affine(fw, bw, find_saved(fw, bw, 1), quantized=set(), static=()) == 0


class PreNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.ln, self.fc2 = nn.Linear(32, 64), nn.LayerNorm(64), nn.Linear(64, 32)

    def forward(self, x):
        return self.fc2(self.ln(self.fc1(x)))


X = torch.randn(256, 32, generator=torch.Generator().manual_seed(0))


def pre_norm() -> PreNorm:
    torch.manual_seed(0)
    return PreNorm()


def compile_step(**options):
    return one_graph_step(pre_norm, X, **options)


def test_a_layer_norm_output_is_rebuilt_from_its_normalised_input_one_blob_fewer():
    on, grad = compile_step(bits=8)
    off, _ = compile_step(bits=8, recompute_affine=False)
    rebuilt = [r for r in on.rows if r.stored.startswith("rebuilt in the backward from ")]
    assert len(rebuilt) == 1 and rebuilt[0].bytes_after == 0 and rebuilt[0].shape == (256, 64)
    one_blob = blob_nbytes(256 * 64, torch.float32, 8, 256, dithered=True)  # the default rounding
    assert on.activation_bytes_after == off.activation_bytes_after - one_blob
    (carrier,) = [c for c in on.records[0].compressions if c.carried_numel]
    assert carrier.carried_numel == 256 * 64 and carrier.source == rebuilt[0].stored.rsplit(" ", 1)[1]
    assert relative_error(grad, squared_loss_grad(pre_norm(), X)) < 2e-2


def test_32_bits_rebuilds_nothing_and_stays_bit_exact():
    report, grad = compile_step(bits=32)
    _, baseline = compile_step(enabled=False)
    assert not [r for r in report.rows if r.stored.startswith("rebuilt")]
    assert torch.equal(grad, baseline)


def test_an_override_keeps_its_tensor_stored():
    report, _ = compile_step(bits=2, overrides={"ln:layer_norm*": 8})  # its output and statistics
    assert not [r for r in report.rows if r.stored.startswith("rebuilt")]
    bits = {c.source: c.bits for c in report.records[0].compressions}
    assert bits["add_1"] == 8 and bits["addmm"] == 2  # the output stays, at its own bits


def test_rebuilt_tensors_keep_2_bits_unbiased():
    draws = []
    torch._dynamo.reset()
    model = pre_norm()
    step = torch.compile(model, backend=gact_fx.backend(compiler="eager", min_numel=0, bits=2), fullgraph=True)
    for _ in range(16):
        model.zero_grad(set_to_none=True)
        step(X).pow(2).sum().backward()
        draws.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    exact = squared_loss_grad(model, X)
    assert floor_ratio(draws, exact) <= 1.5


def test_a_dynamic_batch_is_rebuilt_without_specialising_it():
    """The pass compares symbolic sizes without a guard: one graph serves every batch."""
    torch._dynamo.reset()
    backend = gact_fx.backend(compiler="eager", min_numel=0, bits=8)
    counters = torch._dynamo.utils.counters
    counters.clear()
    model = pre_norm()
    step = torch.compile(model, backend=backend, fullgraph=True, dynamic=True)
    for batch in (256, 96, 160):
        x = X[:batch].clone()  # not a view: a view's base size would be guarded on
        model.zero_grad(set_to_none=True)
        step(x).pow(2).sum().backward()
        assert relative_error(flat_grad(model), squared_loss_grad(pre_norm(), x)) < 2e-2
    assert counters["stats"]["unique_graphs"] == 1
    assert [r for r in backend.report().rows if r.stored.startswith("rebuilt in the backward from ")]


# ``recompute_projections``: through a matmul by a parameter (attention's value).
XS = torch.randn(8, 32, 64, generator=torch.Generator().manual_seed(1))


def block() -> TransformerBlock:
    torch.manual_seed(0)
    return TransformerBlock()


def block_step(**options):
    return one_graph_step(block, XS, **options)


def rebuilt_rows(report):
    return [r for r in report.rows if r.stored.startswith("rebuilt in the backward from ")]


def test_the_value_is_rebuilt_through_the_qkv_projection_one_blob_fewer():
    on, grad = block_step(bits=8, recompute_projections=True)
    off, _ = block_step(bits=8, recompute_projections=False)
    extra = {(r.name, r.shape) for r in rebuilt_rows(on)} - {(r.name, r.shape) for r in rebuilt_rows(off)}
    assert extra == {("select_2", (8, 4, 32, 16))}  # the value; query and key (read through exp) stay stored
    (value,) = [r for r in rebuilt_rows(on) if r.name == "select_2"]
    assert value.bytes_before == 0  # a view of the QKV output, whose bytes the query's row counts
    assert {r.name for r in on.rows if r.use == "exponential"} == {"select", "select_1"}
    value_blob = blob_nbytes(8 * 32 * 64, torch.float32, 8, 256, dithered=True)
    assert on.activation_bytes_after == off.activation_bytes_after - value_blob
    assert on.activation_bytes_before == off.activation_bytes_before
    assert relative_error(grad, squared_loss_grad(block(), XS)) < 2e-2


def test_projections_are_rebuilt_by_default_not_when_off_nor_at_32_bits():
    report, _ = block_step(bits=8)
    assert [r for r in rebuilt_rows(report) if r.name == "select_2"]
    report, _ = block_step(bits=8, recompute_projections=False)
    assert not [r for r in rebuilt_rows(report) if r.name == "select_2"]
    report, grad = block_step(bits=32, recompute_projections=True)
    _, baseline = block_step(enabled=False)
    assert not rebuilt_rows(report)
    assert torch.equal(grad, baseline)


def test_a_value_stored_at_more_bits_than_its_carrier_is_not_rebuilt_from_it():
    report, _ = block_step(bits=8, recompute_projections=True, overrides={"input": 2})  # the carrier
    assert not [r for r in rebuilt_rows(report) if r.name == "select_2"]
    assert {r.name: r.bits for r in report.rows if r.bits}["select_2"] == 8
    report, _ = block_step(bits=2, recompute_projections=True, overrides={"qkv:linear[[]2]": 8})  # the value
    assert {r.name: r.bits for r in report.rows if r.bits}["select_2"] == 8


def test_the_rebuilt_value_keeps_2_bits_unbiased():
    model = block()
    backend = gact_fx.backend(compiler="eager", min_numel=0, bits=2, recompute_projections=True)
    torch._dynamo.reset()
    step = torch.compile(model, backend=backend, fullgraph=True)
    draws = []
    for _ in range(16):
        model.zero_grad(set_to_none=True)
        step(XS).pow(2).sum().backward()
        draws.append(flat_grad(model))
    assert [r for r in rebuilt_rows(backend.report()) if r.name == "select_2"]
    exact = squared_loss_grad(block(), XS)
    assert floor_ratio(draws, exact) <= 1.5


def test_a_dynamic_batch_rebuilds_the_value_without_specialising_it():
    backend = dynamic_batch_steps(block, XS, bits=8, recompute_projections=True)
    assert [r for r in rebuilt_rows(backend.report()) if r.name == "select_2"]


def autocast_step(**options):
    """The report and the gradient of one step of the transformer block under bf16 autocast."""
    torch._dynamo.reset()
    backend = gact_fx.backend(compiler="eager", min_numel=0, **options)
    model = block()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch.compile(model, backend=backend, fullgraph=True)(XS)
    out.float().pow(2).sum().backward()
    return backend.report(), flat_grad(model)


def test_under_autocast_the_casts_are_replayed_and_the_norm_outputs_and_value_rebuilt():
    report, grad = autocast_step(bits=8, recompute_projections=True)
    # both LayerNorms' bf16 outputs (cast, then affine in the block's input) and the value
    assert sorted(r.shape for r in rebuilt_rows(report)) == [(8, 4, 32, 16), (256, 64), (256, 64)]
    _, exact = autocast_step(enabled=False)
    assert relative_error(grad, exact) < 2e-2
    report, grad = autocast_step(bits=32, recompute_projections=True)
    assert not rebuilt_rows(report)
    assert torch.equal(grad, exact)
