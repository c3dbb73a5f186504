"""The Triton kernels against the torch reference: one format, the same codes, any size.

Without a GPU they run under the Triton interpreter on CPU tensors (``TRITON_INTERPRET=1``,
set by ``tests/conftest.py`` before anything imports Triton). With a GPU they run
compiled on CUDA. Skipped, with the reason, when Triton is absent.
"""

import importlib.util
import os

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed (pip install 'gact-fx[triton]')", allow_module_level=True)

ON_GPU = torch.cuda.is_available()
if not ON_GPU and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1 (run through tests/conftest.py)", allow_module_level=True)

from gact_fx.runtime import format as fmt  # noqa: E402
from gact_fx.runtime import triton_kernels as tk  # noqa: E402
from gact_fx.runtime.reference import dequantize_reference, quantize_reference  # noqa: E402

pytestmark = pytest.mark.compat

DEVICE = "cuda" if ON_GPU else "cpu"
FLOATS = [torch.float32, torch.float16, torch.bfloat16]
GROUP = 64


def sample(numel, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(numel, generator=generator) * 3).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("numel", [1, 100, 257])
def test_codes_match_the_reference_given_the_same_noise(dtype, bits, numel):
    x = sample(numel, dtype)
    noise = tk.rounding_noise(fmt.num_groups(numel, GROUP), GROUP, 1234, x.device)
    assert torch.equal(tk.quantize(x, bits, GROUP, 1234), quantize_reference(x, bits, GROUP, noise))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_either_implementation_decodes_the_others_blob(dtype, bits):
    x = sample(300, dtype, seed=1)
    from_triton = tk.quantize(x, bits, GROUP, 7)
    from_reference = quantize_reference(x, bits, GROUP, torch.rand(5, GROUP, device=x.device))
    for blob in (from_triton, from_reference):
        expected = dequantize_reference(blob, 300, dtype, GROUP)
        got = tk.dequantize(blob, 300, dtype, GROUP)
        if ON_GPU and dtype == torch.float32:  # the GPU may fuse multiply-add: one rounding fewer
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        else:
            assert torch.equal(got, expected)


def test_many_programs_and_a_partial_last_block():
    x = sample(40 * 8 + 3, torch.float32)  # 41 groups of 8: 11 programs, the last one holds 1 group
    groups = fmt.num_groups(x.numel(), 8)
    noise = tk.rounding_noise(groups, 8, 5, x.device)
    blob = tk.quantize(x, 2, 8, 5)
    assert torch.equal(blob, quantize_reference(x, 2, 8, noise))
    assert torch.equal(tk.dequantize(blob, x.numel(), x.dtype, 8), dequantize_reference(blob, x.numel(), x.dtype, 8))


def test_noise_is_reproducible_and_differs_per_seed():
    first = tk.rounding_noise(3, GROUP, 11, DEVICE)
    assert torch.equal(first, tk.rounding_noise(3, GROUP, 11, DEVICE))
    assert not torch.equal(first, tk.rounding_noise(3, GROUP, 12, DEVICE))
    assert 0 <= first.min() and first.max() < 1


def test_non_finite_values_poison_only_their_group():
    x = sample(4 * GROUP, torch.float32)
    x[10], x[GROUP + 3] = float("nan"), float("inf")
    y = tk.dequantize(tk.quantize(x, 4, GROUP, 3), x.numel(), x.dtype, GROUP)
    assert torch.isnan(y[: 2 * GROUP]).all()
    assert torch.isfinite(y[2 * GROUP :]).all()


def test_the_ops_use_the_kernels_when_asked(monkeypatch):
    monkeypatch.setenv("GACT_FX_KERNELS", "triton")
    from gact_fx.runtime import kernels

    x = sample(1000, torch.float32).view(10, 100)
    assert kernels.uses_triton(x, 4)
    blob = torch.ops.gact.quantize(x, 4, 256, [0, 1], 0)
    y = torch.ops.gact.dequantize(blob, [10, 100], torch.float32, 256, [0, 1], 0)
    assert (y - x).abs().max() <= (x.max() - x.min()) / 15 + 1e-6


def test_training_through_the_kernels(monkeypatch):
    monkeypatch.setenv("GACT_FX_KERNELS", "triton")
    import gact_fx

    from ..helpers import baseline_backend, compiled_grads, model_case, relative_error

    model, inputs = model_case("mlp")
    model, inputs = model.to(DEVICE), tuple(i.to(DEVICE) for i in inputs)
    (expected,), _ = compiled_grads(model, inputs, baseline_backend())
    (got,), _ = compiled_grads(model, inputs, gact_fx.backend(bits=8, compiler="eager"))
    assert 0 < relative_error(got, expected) < 2e-2
