"""Adaptive bits: the probe, the allocation, levels, overrides and checkpointing."""

import itertools
import weakref
import logging

import pytest
import torch
from torch._dynamo.utils import counters

import gact_fx
from gact_fx.allocation import quantization_variance
from gact_fx.config import GactConfig
from gact_fx.controller import error_weights, weighted_error
from gact_fx.runtime.format import RUNTIME_BITS

from .helpers import compiled_grads, flat_grad, model_case, projection_loss


def train_steps(model, inputs, backend, steps):
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        projection_loss(compiled(*inputs)).backward()
    return compiled


def no_probe_state(region) -> bool:
    """No site of the region keeps an exact copy or substitutes its blob."""
    return all(t.site.probe.idle for t in region.tensors)


def spearman(a: dict, b: dict) -> float:
    rank_a = {k: r for r, k in enumerate(sorted(a, key=a.get))}
    rank_b = {k: r for r, k in enumerate(sorted(b, key=b.get))}
    n = len(a)
    return 1 - 6 * sum((rank_a[k] - rank_b[k]) ** 2 for k in a) / (n * (n * n - 1))


def test_levels_are_gacts():
    assert GactConfig.from_options({"level": "L0"}).enabled is False
    assert [GactConfig.from_options({"level": lvl}).core.bits for lvl in ("L1", "L1.1", "L1.2")] == [4, 8, 2]
    assert [GactConfig.from_options({"level": lvl}).adaptive.avg_bits for lvl in ("L2", "L2.1", "L2.2")] == [4, 3, 2]
    with pytest.raises(ValueError, match="do not also pass"):
        GactConfig.from_options({"level": "L2", "avg_bits": 3})


@pytest.mark.compat  # on torch 2.9 the controller once never saw a call, and nothing adapted
def test_adaptation_respects_the_budget_logs_and_never_recompiles(caplog):
    model, inputs = model_case("block")
    backend = gact_fx.backend(avg_bits=2, adapt_interval=3, probe_tensors=3)
    counters.clear()
    with caplog.at_level(logging.INFO, logger="gact_fx"):
        train_steps(model, inputs, backend, 10)
    controller = backend.controller
    (region,) = controller.regions.values()
    assert all(t.sensitivity is not None and t.sensitivity > 0 for t in region.tensors)
    # attention's query and key keep their floor of 8 bits, outside the budget; the others
    # spend 2 bits per element, their own and those the backward rebuilds from them
    floored = [t for t in region.tensors if t.floor > 1]
    free = [t for t in region.tensors if t.floor == 1]
    assert floored and all(t.bits == t.floor == 8 for t in floored)
    assert any(t.carried_numel for t in free)  # the LayerNorms' outputs (``passes.affine``)
    budget = 2 * sum(t.numel + t.carried_numel for t in free)
    spent = sum(t.bits * t.numel for t in free)
    assert spent <= budget and spent > 2 * sum(t.numel for t in free)  # the rebuilt ones' share is spent
    assert len(set(controller.bits().values())) > 1  # a mixed allocation
    assert region.adaptations >= 3  # after the first full measurement, then every 3 calls
    adapted = [m for m in caplog.messages if m.startswith("gact adapted graph 0")]
    assert len(adapted) == region.adaptations and "avg_bits 2.00 counting codes" in adapted[0]
    assert counters["stats"]["unique_graphs"] == 1
    assert no_probe_state(region)
    rows = {r.slot: r.bits for r in backend.report().rows if r.slot is not None}
    assert all(rows[t.slot] == t.bits for t in region.tensors)  # the report shows the bits in force


@pytest.mark.compat  # the report's bytes come from each torch's partition
@pytest.mark.parametrize("avg_bits", [3.0, 4.0])
def test_a_budget_in_bytes_holds_the_reports_ratio(avg_bits):
    model, inputs = model_case("block")
    backend = gact_fx.backend(avg_bits=avg_bits, budget="bytes", adapt_interval=3, probe_tensors=4)
    train_steps(model, inputs, backend, 8)
    (region,) = backend.controller.regions.values()
    assert region.fully_measured and region.adaptations >= 1
    report = backend.report()
    ratio = report.activation_bytes_before / report.activation_bytes_after
    # every byte counts: the floored query and key, the scales and minimums, the tensors kept
    # as they are; the solver leaves at most a step of its ladder unspent
    target = 32 / avg_bits
    assert target <= ratio < 1.25 * target
    assert ratio == pytest.approx(region.baseline_bytes / region.held_bytes(), rel=1e-3)


def test_a_budget_in_bytes_out_of_reach_warns_once_and_keeps_the_floors(caplog):
    model, inputs = model_case("block")
    backend = gact_fx.backend(avg_bits=1, budget="bytes", adapt_interval=3, probe_tensors=4)
    with caplog.at_level(logging.WARNING, logger="gact_fx"):
        train_steps(model, inputs, backend, 10)
    (region,) = backend.controller.regions.values()
    assert region.adaptations >= 2
    assert all(t.bits == (t.floor if t.floor > 1 else 2) for t in region.tensors)  # the narrowest rungs (1 bit unmeasured)
    warnings = [m for m in caplog.messages if "short of avg_bits=1.00" in m]
    assert len(warnings) == 1 and "floors" in warnings[0]


def test_a_budget_in_bytes_needs_avg_bits():
    with pytest.raises(ValueError, match="needs avg_bits"):
        GactConfig.from_options(budget="bytes")
    with pytest.raises(ValueError, match="budget must be one of"):
        GactConfig.from_options(avg_bits=2, budget="elements")


def test_the_estimator_ranks_tensors_like_the_brute_force_definition():
    model, inputs = model_case("block")
    # Without rebuilt tensors (``passes.affine``), which exist only where both tensors are
    # lossy: the brute force quantizes one tensor alone.
    estimated = {}
    for metric in ("absolute", "relative"):
        backend = gact_fx.backend(avg_bits=2, probe_tensors=100, recompute_affine=False, gradient_metric=metric)
        compiled_grads(model, inputs, backend)
        estimated[metric] = backend.controller.sensitivities()
    # the weight of each parameter's squared error: 1, or its element count over its
    # squared exact gradient norm (normalised over all elements)
    (exact,), _ = compiled_grads(model, inputs, gact_fx.backend(enabled=False))
    sizes = [p.numel() for p in model.parameters()]
    weights = {
        "absolute": torch.ones(sum(sizes)),
        "relative": torch.cat([torch.full((n,), n / float(part.square().sum()) / sum(sizes))
                               for n, part in zip(sizes, exact.split(sizes))]),
    }
    brute_force = {metric: {} for metric in weights}
    for name in estimated["absolute"]:  # E||g(s) - g(s')||^2_w / (2 S(2)), only this tensor quantized
        torch._dynamo.reset()
        one = gact_fx.backend(bits=32, overrides={name: 2}, recompute_affine=False)
        draws, _ = compiled_grads(model, inputs, one, steps=5)
        pairs = list(itertools.combinations(draws, 2))
        for metric, weight in weights.items():
            squared = sum(float((weight * (a - b) ** 2).sum()) for a, b in pairs) / len(pairs)
            brute_force[metric][name] = squared / (2 * quantization_variance(2))
    for metric in weights:  # one set of draws serves both norms
        assert spearman(estimated[metric], brute_force[metric]) >= 0.9, metric
        for name in estimated[metric]:
            assert estimated[metric][name] == pytest.approx(brute_force[metric][name], rel=0.5), (metric, name)


def test_a_probe_step_trains_on_exact_values():
    model, inputs = model_case("mlp")
    (expected,), _ = compiled_grads(model, inputs, gact_fx.backend(enabled=False))
    (probed,), _ = compiled_grads(model, inputs, gact_fx.backend(avg_bits=1, probe_tensors=100))
    assert torch.equal(probed, expected)  # every tensor probed: the step used exact values


def test_state_dict_round_trip_keeps_the_allocation():
    model, inputs = model_case("block")
    first = gact_fx.backend(avg_bits=2, probe_tensors=100, adapt_interval=3200)  # the first re-measurement after 50 calls
    train_steps(model, inputs, first, 3)
    state = first.controller.state_dict()
    torch._dynamo.reset()
    resumed = gact_fx.backend(avg_bits=2, probe_tensors=100, adapt_interval=3200)  # the first re-measurement after 50 calls
    resumed.controller.load_state_dict(state)  # before the first compile: applied on registration
    train_steps(model, inputs, resumed, 1)
    assert resumed.controller.bits() == first.controller.bits()
    assert resumed.controller.sensitivities() == first.controller.sensitivities()
    (region,) = resumed.controller.regions.values()
    assert region.calls == 4 and region.adaptations == 1  # no re-probe: the schedule continued


def test_overrides_pin_tensors_outside_the_adaptive_budget():
    model, inputs = model_case("block")
    backend = gact_fx.backend(avg_bits=2, probe_tensors=100, overrides={"ln*": 8, "gelu": 32})
    compiled_grads(model, inputs, backend)
    bits = {r.source: r.bits for r in backend.report().rows if r.stored == "compressed" and r.dtype != "bool"}
    labels = {c.source: c.label for c in backend.records[0].compressions}
    by_label = {labels[k]: v for k, v in bits.items()}
    assert by_label["ln1:layer_norm"] == by_label["ln2:layer_norm"] == 8 and by_label["gelu"] == 32
    assert set(backend.controller.bits()) == set(by_label) - {"ln1:layer_norm", "ln2:layer_norm", "gelu"}


def test_uniform_overrides():
    model, inputs = model_case("block")
    backend = gact_fx.backend(bits=2, overrides={"*linear*": 8}, recompute_projections=False)  # the value stored
    compiled_grads(model, inputs, backend)
    by_label = {c.label: c.bits for c in backend.records[0].compressions}
    assert by_label["qkv:linear[2]"] == by_label["fc1:linear'"] == 8 and by_label["gelu"] == 2
    assert backend.controller is None
    sources = {r.label: r.bits_source for r in backend.report().rows if r.stored == "compressed"}
    assert sources["qkv:linear[0]"] == "override" and sources["gelu"] == "uniform"
    plain = gact_fx.backend(bits=2, recompute_projections=False)
    compiled_grads(model, inputs, plain)
    sources = {r.label: r.bits_source for r in plain.report().rows if r.stored == "compressed"}
    assert sources["qkv:linear[0]"] == "floor" and sources["qkv:linear[2]"] == "uniform"  # attention's query: 8 bits


def test_adaptive_on_the_inductor_path():
    model, inputs = model_case("mlp")
    backend = gact_fx.backend(avg_bits=2, compiler="inductor", adapt_interval=2, probe_tensors=100)
    counters.clear()
    train_steps(model, inputs, backend, 4)
    (region,) = backend.controller.regions.values()
    # calls 1 (every tensor), then after intervals of 1 and 2 calls (growing up to adapt_interval)
    assert region.adaptations == 3 and counters["stats"]["unique_graphs"] == 1
    assert all(t.sensitivity > 0 for t in region.tensors)  # the probe saw its own blobs
    assert backend.controller.average_bits() <= 2.0 + 1e-9


def test_adaptive_mode_without_fullgraph_compiles_whole_and_compressed():
    # Run-time bits make data-dependent blob sizes, which Dynamo only allows under
    # fullgraph=True unless gact enables them: else a silent graph break, uncompressed.
    model, inputs = model_case("block")
    backend = gact_fx.backend(avg_bits=2)
    counters.clear()
    compiled = torch.compile(model, backend=backend)
    projection_loss(compiled(*inputs)).backward()
    assert not counters["graph_break"]
    assert len(backend.records) == 1 and backend.controller.tensors()


def test_the_controller_is_reachable_from_the_model():
    model, inputs = model_case("mlp")
    compiled = torch.compile(model, backend="gact", options={"level": "L2.2"})
    projection_loss(compiled(*inputs)).backward()
    assert gact_fx.controller(compiled) is gact_fx.controller(model)
    (record,) = gact_fx.report(model).records
    runtime_bits = {c.label for c in record.compressions if c.bits == RUNTIME_BITS}
    assert set(gact_fx.controller(model).bits()) == runtime_bits
    other = torch.nn.Linear(3, 3)
    with pytest.raises(LookupError, match="no gact backend has compiled"):
        gact_fx.controller(other)


@pytest.mark.parametrize("compiler", ["eager", "inductor"])
def test_a_block_compiled_once_and_called_three_times_per_step(compiler):
    # Regional compilation: one compiled graph runs three times before its backward, so
    # probes overlap; one is in flight at a time, and every step's gradient stays right.
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))
    inputs = torch.randn(256, 64, requires_grad=True)  # as inside a model: one compiled graph
    backend = gact_fx.backend(avg_bits=4, adapt_interval=2, probe_tensors=1, compiler=compiler)
    compiled = torch.compile(block, backend=backend, fullgraph=True)

    def gradient(run):
        block.zero_grad(set_to_none=True)
        projection_loss(run(run(run(inputs)))).backward()
        return flat_grad(block)

    expected = gradient(block)
    for _ in range(6):
        got = gradient(compiled)
        assert float((got - expected).norm() / expected.norm()) < 0.1
    (region,) = backend.controller.regions.values()
    assert region.adaptations >= 2 and region.in_flight is None
    assert all(t.sensitivity > 0 for t in region.tensors)
    assert no_probe_state(region)


def test_a_probe_whose_outputs_are_dropped_without_backward_ends():
    model, inputs = model_case("mlp")
    backend = gact_fx.backend(avg_bits=2, probe_tensors=1)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    kept = compiled(*inputs)  # a probe step; its backward never runs
    (region,) = backend.controller.regions.values()
    assert region.in_flight is not None and not no_probe_state(region)
    compiled(*inputs).sum()  # no second probe while one is in flight
    assert sum(t.site.probe.kept for t in region.tensors) == 1
    dropped = weakref.ref(kept)
    del kept  # autograd frees the graph: the probe ends with it, no gc needed
    assert dropped() is None and region.in_flight is None and no_probe_state(region)
    for _ in range(len(region.tensors)):
        model.zero_grad(set_to_none=True)
        projection_loss(compiled(*inputs)).backward()
    assert region.fully_measured and region.in_flight is None and no_probe_state(region)


class TwoGraphs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)

    def forward(self, x):
        x = torch.nn.functional.gelu(self.a(x))
        torch._dynamo.graph_break()
        return torch.nn.functional.gelu(self.b(x))


def test_an_override_names_a_tensor_of_a_later_graph_without_its_prefix():
    backend = gact_fx.backend(bits=2, overrides={"b:linear": 8})
    torch.compile(TwoGraphs(), backend=backend)(torch.randn(512, 64, requires_grad=True)).sum().backward()
    first, second = ({c.label: c.bits for c in r.compressions} for r in backend.records)
    assert first["a:linear'"] == 2 and second["g1/b:linear'"] == 8


def test_the_probe_schedule_starts_soon_and_grows_to_the_interval():
    from gact_fx.schedule import ProbeSchedule

    schedule = ProbeSchedule(max_interval=1000)
    calls, probes = 1, []
    while calls < 5000:
        if schedule.due(calls):
            probes.append(calls)
            schedule.probed(calls)
        calls += 1
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[:7] == [15, 30, 60, 120, 240, 480, 960] and set(gaps[7:]) == {1000}
    schedule.restart(4321)
    assert schedule.due(4322) and schedule.interval == 0


def test_the_gradient_monitor_reports_a_jump_and_nothing_else():
    from gact_fx.schedule import GradientMonitor

    monitor = GradientMonitor(check_every=4)
    for norm in [1.0, 1.2, 0.9, 1.1, 1.0, 1.3, 0.8, 1.0]:
        monitor.note([torch.tensor([norm])])
        assert monitor.jumped() is None
    for norm in [1.1, 15.0, 1.0, 1.0]:
        monitor.note([torch.tensor([norm])])
    assert monitor.jumped() == pytest.approx(15.0 / 1.0, rel=0.2)


def test_the_gradient_monitor_sums_squared_norms_in_float32():
    from gact_fx.schedule import GradientMonitor

    monitor = GradientMonitor()
    half = torch.full((1000,), 100.0, dtype=torch.float16)  # squared norm 1e7, beyond float16's range
    monitor.note([half, torch.ones(3), None, torch.ones(2, dtype=torch.int64)])
    assert monitor.pending[-1].dtype == torch.float32 and monitor.pending[-1].item() == pytest.approx(1e7 + 3)


def test_a_jump_of_the_gradient_norm_measures_again(caplog):
    model, inputs = model_case("mlp")
    backend = gact_fx.backend(avg_bits=2, probe_tensors=100, adapt_interval=10**6)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with caplog.at_level(logging.INFO, logger="gact_fx"):
        for step in range(30):
            model.zero_grad(set_to_none=True)
            scale = 1000.0 if step >= 20 else 1.0  # the loss (so every gradient) grows 1000x at step 20
            (scale * projection_loss(compiled(*inputs))).backward()
    (region,) = backend.controller.regions.values()
    jumps = [m for m in caplog.messages if "gradient norm of graph 0 jumped" in m]
    assert len(jumps) == 1 and region.adaptations == 2  # the first measurement, then at once after the jump


def test_the_relative_metric_is_each_parameters_error_against_its_own_scale():
    exact = [torch.tensor([3.0, 4.0]), torch.tensor([0.03, 0.04, 0.0]), torch.zeros(5), None]
    noisy = [torch.tensor([3.0, 5.0]), torch.tensor([0.03, 0.05, 0.0]), torch.ones(5), torch.ones(2)]
    absolute = weighted_error(noisy, exact, error_weights(exact, "absolute"))
    assert absolute == pytest.approx(1 + 1e-4 + 5 + 2)
    # both have a relative squared error of 1/25: weighted by their 2 and 3 elements of 5;
    # a parameter whose exact gradient is zero (or absent) has no scale and weighs nothing
    relative = weighted_error(noisy, exact, error_weights(exact, "relative"))
    assert relative == pytest.approx((2 / 5) / 25 + (3 / 5) / 25)
    scaled = [g * 1e3 for g in exact[:2]] + exact[2:]
    assert weighted_error([g * 1e3 for g in noisy[:2]] + noisy[2:], scaled,
                          error_weights(scaled, "relative")) == pytest.approx(relative)
