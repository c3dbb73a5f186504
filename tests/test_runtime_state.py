"""Run-time state is the backend's own: the probe substitutes only into its own call, and
two backends in one process never see each other's bits or noise."""

import copy

import pytest
import torch
import torch.nn as nn

import gact_fx

from .helpers import flat_grad, model_case, projection_loss


def probed_sensitivities(first_element: float) -> dict[str, float]:
    """Sensitivities measured by a probe on the third of three chained calls of one block.

    The block maps zero rows to zero rows, so with the input's first 2,048 elements zero
    every call's blobs start with the same bytes (constant groups)."""
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(64, 256, bias=False), nn.GELU(), nn.Linear(256, 64, bias=False))
    backend = gact_fx.backend(avg_bits=8, adapt_interval=3, probe_tensors=100, min_numel=0)
    compiled = torch.compile(block, backend=backend, fullgraph=True)
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    x.view(-1)[:2048] = 0.0
    x.view(-1)[0] = first_element
    for _ in range(2):  # the first step measures on call 1; the second probes call 6, the third of its step
        block.zero_grad(set_to_none=True)
        projection_loss(compiled(compiled(compiled(x.clone().requires_grad_())))).backward()
    (region,) = backend.controller.regions.values()
    assert region.adaptations == 2 and region.calls == 6
    return backend.controller.sensitivities()


def test_the_probe_substitutes_only_into_the_call_it_probed():
    # The probe's gradient runs back through calls 2 and 1 too (they share parameters).
    # Identified by their leading bytes, their blobs once took call 3's exact values,
    # and the sensitivities came out inflated. A first element of 1e-6 makes the
    # leading bytes differ and changes the true sensitivities by next to nothing.
    gact_fx.manual_seed(0)
    colliding = probed_sensitivities(0.0)
    torch._dynamo.reset()
    gact_fx.manual_seed(0)
    distinct = probed_sensitivities(1e-6)
    assert colliding.keys() == distinct.keys()
    for name in colliding:
        assert colliding[name] == pytest.approx(distinct[name], rel=0.05), name


def interleaved_gradients(runs, steps):
    """Each run: (model, inputs, backend). Steps alternate between the runs."""
    compiled = [torch.compile(model, backend=backend, fullgraph=True) for model, _, backend in runs]
    gradients = [[] for _ in runs]
    for _ in range(steps):
        for index, ((model, inputs, _), run) in enumerate(zip(runs, compiled)):
            model.zero_grad(set_to_none=True)
            projection_loss(run(*inputs)).backward()
            gradients[index].append(flat_grad(model))
    return gradients


def two_runs():
    mlp, mlp_inputs = model_case("mlp")
    block, block_inputs = model_case("block")
    return [
        (mlp, mlp_inputs, gact_fx.backend(level="L2.2", adapt_interval=2, probe_tensors=2)),
        (block, block_inputs, gact_fx.backend(bits=4)),
    ]


def test_two_backends_interleaved_match_their_own_single_runs():
    alone = []
    for run in two_runs():
        torch._dynamo.reset()
        gact_fx.manual_seed(0)
        (gradients,) = interleaved_gradients([run], steps=4)
        alone.append((gradients, run[2].report()))
    torch._dynamo.reset()
    gact_fx.manual_seed(0)
    runs = two_runs()
    together = interleaved_gradients(runs, steps=4)
    for (gradients, report), interleaved, (_, _, backend) in zip(alone, together, runs):
        assert all(torch.equal(a, b) for a, b in zip(gradients, interleaved))
        mine = backend.report()
        assert [(r.name, r.bits, r.bytes_after) for r in mine.rows] == [(r.name, r.bits, r.bytes_after) for r in report.rows]
    uniform = runs[1][2].report()
    floats = [r for r in uniform.rows if r.stored == "compressed" and r.dtype != "bool"]
    assert {r.bits for r in floats if r.use != "exponential"} == {4}
    assert {r.bits for r in floats if r.use == "exponential"} == {8}  # attention's query and key


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_adaptive_bits_refuse_cuda_graph_modes(mode):
    model, inputs = model_case("mlp")
    compiled = torch.compile(copy.deepcopy(model), backend=gact_fx.backend(level="L2.2"), mode=mode)
    with pytest.raises(Exception, match="captures CUDA graphs"):
        compiled(*inputs)


@pytest.mark.parametrize("lowering", ["op", pytest.param("aten", marks=pytest.mark.slow)])
def test_every_sites_noise_state_exists_before_the_compiled_graph_first_runs(lowering, monkeypatch):
    # Under mode="reduce-overhead" the first call of a compiled graph is cudagraph trees'
    # warm-up, which allocates into the graph's private pool: a noise state made lazily
    # there is a pool tensor nobody tracks, and torch refuses the graph. So states are made
    # when the graph is compiled, and a call never makes one.
    from gact_fx.runtime.registry import Site

    if lowering == "aten":
        monkeypatch.setenv("GACT_FX_COMPILER", "inductor")
    model, inputs = model_case("block")
    rounding = "stochastic" if lowering == "aten" else "dithered"  # what each lowering writes
    backend = gact_fx.backend(bits=2, lowering=lowering, compiler="auto", rounding=rounding)
    made_during_calls = []
    original = Site.rng_state

    def watched(site, device):
        if device not in site._states and compiling == 0:
            made_during_calls.append(site.slot)
        return original(site, device)

    compiling = 0

    def spy(gm, example_inputs):
        nonlocal compiling
        compiling += 1
        try:
            return backend(gm, example_inputs)
        finally:
            compiling -= 1

    monkeypatch.setattr(Site, "rng_state", watched)
    compiled = torch.compile(copy.deepcopy(model), backend=spy, fullgraph=True)
    projection_loss(compiled(*inputs)).backward()
    sites = backend.registry.sites.values()
    assert sites and all(torch.device("cpu") in site._states for site in sites)
    assert not made_during_calls
