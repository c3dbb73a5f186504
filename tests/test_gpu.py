"""On a CUDA device: the compiled Triton kernels, training through Inductor and them, CUDA
graphs, the Triton and aten lowerings, offloading, and peak memory.

Skipped without a GPU (``tests/conftest.py``); ``gact-fx bench --gpu-suite`` runs them first
(``pytest -m gpu``), under a time limit: the tests come in order of importance, and what
the limit cuts off is reported as not run. Without a GPU the same code paths are
rehearsed under the Triton interpreter (``tests/runtime/test_cuda_path.py``).
"""

import contextlib
import copy

import pytest
import torch

import gact_fx

from .helpers import baseline_backend, flat_grad, model_case, projection_loss, relative_error

pytestmark = pytest.mark.gpu

FLOATS = [torch.float32, torch.float16, torch.bfloat16]


def on_cuda(name):
    model, inputs = model_case(name)
    return model.cuda(), tuple(i.cuda() for i in inputs)


def gradients(model, inputs, backend, steps=1, **compile_kwargs):
    model = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend, **compile_kwargs)
    draws = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        projection_loss(compiled(*inputs)).backward()
        draws.append(flat_grad(model).clone())
    return draws


@pytest.mark.parametrize("dithered", [False, True], ids=["stochastic", "dithered"])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("numel,group", [((1 << 20) + 3, 256)])
def test_compiled_kernels_write_the_references_blob(dtype, bits, numel, group, dithered):
    from gact_fx.runtime import format as fmt
    from gact_fx.runtime import noise
    from gact_fx.runtime import triton_kernels as tk
    from gact_fx.runtime.reference import dequantize_reference, quantize_reference

    x = (torch.randn(numel, device="cuda") * 3).to(dtype)
    x[7], x[numel // 2] = float("-inf"), float("-inf")  # special values take the same path
    key = noise.key_of(0xC0FFEE, 3, device="cuda")
    drawn = noise.rounding_noise(fmt.num_groups(numel, group), group, key)
    expected = quantize_reference(x, bits, group, drawn, key if dithered else None)
    blob = tk.quantize(x, bits, group, key=key, dithered=dithered)
    assert torch.equal(blob, expected)
    decoded = tk.dequantize(blob, numel, dtype, group, dithered=dithered)
    reference = dequantize_reference(blob, numel, dtype, group, dithered=dithered)
    assert torch.equal(decoded.isinf(), reference.isinf())
    finite = reference.isfinite()
    # fused multiply-add on the GPU: one rounding fewer in fp32, so at most an ulp of the dtype apart
    torch.testing.assert_close(decoded[finite].float(), reference[finite].float(), rtol=torch.finfo(dtype).eps, atol=1e-6)


def test_a_group_size_that_is_not_a_power_of_two_and_a_small_tensor():
    for dithered in (False, True):
        test_compiled_kernels_write_the_references_blob(torch.bfloat16, 3, 1000, 96, dithered)


@contextlib.contextmanager
def deterministic():
    """Inductor picks among its reduction kernels' configurations by timing them, so two
    compiles of one graph may sum in different orders; deterministic mode picks without
    timing (on an H100 the block's 32-bit gradients differed by an ulp here and there
    without it: BENCHMARKS.md, "GPU suite")."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("name", ["mlp", "block", "conv"])
def test_training_through_inductor_and_the_kernels(name):
    model, inputs = on_cuda(name)
    with deterministic():
        (expected,) = gradients(model, inputs, baseline_backend("inductor"))
        (exact,) = gradients(model, inputs, gact_fx.backend(bits=32, compiler="inductor"))
    assert torch.equal(exact, expected)  # 32 bits is the stock graph
    (eight,) = gradients(model, inputs, gact_fx.backend(bits=8, compiler="inductor"))
    assert 0 < relative_error(eight, expected) < 2e-2
    draws = gradients(model, inputs, gact_fx.backend(bits=2, compiler="inductor"), steps=16)
    single = sum(relative_error(d, expected) for d in draws) / len(draws)
    assert single / relative_error(torch.stack(draws).mean(0), expected) >= 2.5  # unbiased


def test_cuda_graphs_draw_fresh_noise_on_every_replay():
    from torch._dynamo.utils import counters

    model, inputs = on_cuda("block")
    (expected,) = gradients(model, inputs, baseline_backend("inductor"))
    counters.clear()
    draws = gradients(model, inputs, gact_fx.backend(bits=2, compiler="inductor"), steps=18, mode="reduce-overhead")
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    draws = draws[2:]  # the first calls warm up and record; the rest are replays
    assert all(not torch.equal(a, b) for a, b in zip(draws, draws[1:]))  # frozen noise would repeat itself
    single = sum(relative_error(d, expected) for d in draws) / len(draws)
    assert single / relative_error(torch.stack(draws).mean(0), expected) >= 2.5


def test_the_triton_lowering_launches_the_same_kernels_from_inductor():
    """``lowering="triton"``: the kernels traced into the graphs, launched by Inductor's own
    code: the op path's blobs, so its gradients; and under CUDA graphs, fresh noise each replay."""
    from torch._dynamo.utils import counters

    model, inputs = on_cuda("block")
    with deterministic():
        gact_fx.manual_seed(3)
        (by_ops,) = gradients(model, inputs, gact_fx.backend(bits=2, compiler="inductor", lowering="op"))
        gact_fx.manual_seed(3)
        traced = gact_fx.backend(bits=2, compiler="inductor", lowering="triton")
        (by_triton,) = gradients(model, inputs, traced)
    assert "gact.quantize" not in traced.records[0].code_after[0]
    assert torch.equal(by_triton, by_ops)
    (expected,) = gradients(model, inputs, baseline_backend("inductor"))
    counters.clear()
    draws = gradients(model, inputs, gact_fx.backend(bits=2, compiler="inductor", lowering="triton"), steps=12,
                      mode="reduce-overhead")[2:]
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    assert all(not torch.equal(a, b) for a, b in zip(draws, draws[1:]))
    single = sum(relative_error(d, expected) for d in draws) / len(draws)
    assert single / relative_error(torch.stack(draws).mean(0), expected) >= 2.5  # unbiased


def test_adaptive_bits_train_on_cuda():
    model, inputs = on_cuda("block")
    (expected,) = gradients(model, inputs, baseline_backend("inductor"))
    backend = gact_fx.backend(level="L2", compiler="inductor", adapt_interval=2)
    draws = gradients(model, inputs, backend, steps=4)
    # attention's query and key keep their floor of 8 bits, outside the budget (as on the CPU)
    free = [t for t in backend.controller.tensors() if t.floor == 1]
    assert sum(t.bits * t.numel for t in free) <= 4 * sum(t.numel + t.carried_numel for t in free)
    assert all(relative_error(d, expected) < 0.2 for d in draws)


def test_feature_groups_train_on_cuda():
    """The adaptive levels' grouping: on CUDA each tensor is encoded through a transposed copy."""
    model, inputs = on_cuda("block")
    (expected,) = gradients(model, inputs, baseline_backend("inductor"))
    backend = gact_fx.backend(bits=8, compiler="inductor", feature_groups=True)
    (eight,) = gradients(model, inputs, backend)
    assert "feature" in {c.groups for c in backend.records[0].compressions}
    assert 0 < relative_error(eight, expected) < 2e-2
    draws = gradients(model, inputs, gact_fx.backend(bits=2, compiler="inductor", feature_groups=True), steps=16)
    single = sum(relative_error(d, expected) for d in draws) / len(draws)
    assert single / relative_error(torch.stack(draws).mean(0), expected) >= 2.5  # unbiased


def test_the_aten_lowering_matches_the_ops_on_cuda():
    model, inputs = on_cuda("block")
    (expected,) = gradients(model, inputs, baseline_backend("inductor"))
    plain = {"bits": 8, "compiler": "inductor", "rounding": "stochastic"}  # what the aten lowering writes
    gact_fx.manual_seed(3)
    (by_ops,) = gradients(model, inputs, gact_fx.backend(lowering="op", **plain))
    gact_fx.manual_seed(3)
    (by_aten,) = gradients(model, inputs, gact_fx.backend(lowering="aten", **plain))
    assert relative_error(by_aten, expected) < 2e-2
    # the same noise; Inductor's own arithmetic may round a code differently at its edge
    assert relative_error(by_aten, by_ops) < 2e-3


def test_offloading_moves_the_blobs_off_the_gpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU()) for _ in range(8)]).cuda()
    x = torch.randn(4096, 1024, device="cuda")
    peaks, grads = {}, {}
    for offload in (False, True):
        gact_fx.manual_seed(0)
        compiled = torch.compile(copy.deepcopy(model), backend=gact_fx.backend(bits=8, offload=offload, compiler="inductor"))
        compiled(x).sum().backward()  # compile and warm up
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = compiled(x)
        held = torch.cuda.memory_allocated() - before  # what the forward keeps on the GPU for the backward
        out.sum().backward()
        peaks[offload] = held
        grads[offload] = torch.cat([p.grad.flatten() for p in compiled.parameters()])
    assert peaks[True] < 0.5 * peaks[False]
    assert relative_error(grads[True], grads[False]) < 2e-2


def test_peak_memory_falls_at_two_bits():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU()) for _ in range(8)]).cuda()
    x = torch.randn(8192, 1024, device="cuda")
    peaks = {}
    for name, backend in (("baseline", baseline_backend("inductor")), ("gact", gact_fx.backend(bits=2, compiler="inductor"))):
        compiled = torch.compile(copy.deepcopy(model), backend=backend)
        compiled(x).sum().backward()
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        compiled(x).sum().backward()
        peaks[name] = torch.cuda.max_memory_allocated() - start
    assert peaks["gact"] < 0.6 * peaks["baseline"], peaks
