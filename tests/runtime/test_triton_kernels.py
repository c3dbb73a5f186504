"""The Triton kernels against the torch reference: one format, the same codes, any size.

Without a GPU they run under the Triton interpreter on CPU tensors (``TRITON_INTERPRET=1``,
set by ``tests/conftest.py`` before anything imports Triton). With a GPU they run
compiled on CUDA. Skipped, with the reason, when Triton is absent.
"""

import functools
import importlib.util
import os

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed (pip install 'gact-fx[triton]')", allow_module_level=True)

ON_GPU = torch.cuda.is_available()
if not ON_GPU and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1 (run through tests/conftest.py)", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gact_fx.runtime import format as fmt  # noqa: E402
from gact_fx.runtime import noise, program_sizes  # noqa: E402
from gact_fx.runtime import triton_kernels as tk  # noqa: E402
from gact_fx.runtime.reference import dequantize_reference, quantize_reference  # noqa: E402
from gact_fx.runtime.triton_common import round_to  # noqa: E402

pytestmark = pytest.mark.compat

DEVICE = "cuda" if ON_GPU else "cpu"
FLOATS = [torch.float32, torch.float16, torch.bfloat16]
GROUP = 64


def sample(numel, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(numel, generator=generator) * 3).to(dtype).to(DEVICE)


def reference_blob(x, bits, group_size, key, dithered=False):
    noise_values = noise.rounding_noise(fmt.num_groups(x.numel(), group_size), group_size, key)
    return quantize_reference(x, bits, group_size, noise_values, key if dithered else None)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("numel", [1, 100, 257, 10 * GROUP])  # the last: whole groups only
def test_blobs_are_bit_identical_to_the_reference(dtype, bits, numel):
    x = sample(numel, dtype)
    key = noise.key_of(1234, 99, device=DEVICE)
    assert torch.equal(tk.quantize(x, bits, GROUP, key=key), reference_blob(x, bits, GROUP, key))


def test_the_noise_is_the_references_bit_for_bit():
    key = noise.key_of(0xDEADBEEF, 7, device=DEVICE)
    assert torch.equal(tk.rounding_noise(5, GROUP, key=key), noise.rounding_noise(5, GROUP, key))
    state = torch.tensor([0x12345678, 41], dtype=torch.int64, device=DEVICE)
    assert torch.equal(tk.rounding_noise(5, GROUP, state=state), noise.rounding_noise(5, GROUP, noise.call_key(state)))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_either_implementation_decodes_the_others_blob(dtype, bits):
    x = sample(300, dtype, seed=1)
    from_triton = tk.quantize(x, bits, GROUP, key=noise.key_of(7, 8, device=DEVICE))
    from_reference = quantize_reference(x, bits, GROUP, torch.rand(5, GROUP, device=x.device))
    for blob in (from_triton, from_reference):
        expected = dequantize_reference(blob, 300, dtype, GROUP)
        got = tk.dequantize(blob, 300, dtype, GROUP)
        if ON_GPU and dtype == torch.float32:  # the GPU may fuse multiply-add: one rounding fewer
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        else:
            assert torch.equal(got, expected)


def test_many_programs_and_a_partial_last_block():
    x = sample(1040 * 16 + 3, torch.float32)  # 1041 groups of 16: 3 programs of 512, the last one holds 17
    key = noise.key_of(5, 6, device=DEVICE)
    blob = tk.quantize(x, 2, 16, key=key)
    assert torch.equal(blob, reference_blob(x, 2, 16, key))
    assert torch.equal(tk.dequantize(blob, x.numel(), x.dtype, 16), dequantize_reference(blob, x.numel(), x.dtype, 16))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [1, 2, 8])
def test_special_values_nan_and_poisoned_groups_match_the_reference(dtype, bits):
    x = sample(5 * GROUP, dtype)
    extreme = torch.finfo(dtype).max
    x[3], x[10] = float("-inf"), float("-inf")  # group 0: one kind
    x[GROUP + 1] = extreme  # group 1: the dtype's maximum
    x[2 * GROUP + 4] = float("nan")  # group 2: poisoned
    x[3 * GROUP + 1], x[3 * GROUP + 2] = float("inf"), -extreme  # group 3: two kinds, poisoned
    x[4 * GROUP :] = -extreme  # group 4: nothing else
    key = noise.key_of(3, 4, device=DEVICE)
    blob = tk.quantize(x, bits, GROUP, key=key)
    assert torch.equal(blob, reference_blob(x, bits, GROUP, key))
    decoded = tk.dequantize(blob, x.numel(), dtype, GROUP)
    assert torch.equal(decoded.isnan(), dequantize_reference(blob, x.numel(), dtype, GROUP).isnan())
    special = torch.isinf(x) | (x.abs() == extreme)
    if bits > 1:
        keep = special.clone()
        keep[2 * GROUP : 4 * GROUP] = False
        assert torch.equal(decoded[keep], x[keep])


def test_the_ops_use_the_kernels_when_asked(monkeypatch):
    monkeypatch.setenv("GACT_FX_KERNELS", "triton")
    from gact_fx.runtime import kernels

    from .sites import SLOT

    x = sample(1000, torch.float32).view(10, 100)
    assert kernels.uses_triton(x, 4)
    blob = torch.ops.gact.quantize(x, 4, 256, [0, 1], SLOT)
    y = torch.ops.gact.dequantize(blob, [10, 100], torch.float32, 256, [0, 1], SLOT)
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


@pytest.mark.parametrize("group_size", [48, 96, 1008])
@pytest.mark.parametrize("bits", [1, 3, 8])
def test_group_sizes_that_are_not_powers_of_two_write_the_references_blob(group_size, bits):
    # tl.arange takes only powers of two: such a group's chunks are padded to the next power
    x = sample(3 * group_size + 5, torch.float32)
    x[group_size + 2] = float("-inf")
    key = noise.key_of(11, 12, device=DEVICE)
    blob = tk.quantize(x, bits, group_size, key=key)
    assert torch.equal(blob, reference_blob(x, bits, group_size, key))
    decoded = tk.dequantize(blob, x.numel(), x.dtype, group_size)
    expected = dequantize_reference(blob, x.numel(), x.dtype, group_size)
    torch.testing.assert_close(decoded, expected, rtol=1e-6, atol=1e-6, equal_nan=True)  # (1 bit poisons the -inf group)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_groups_at_the_edges_of_the_bfloat16_words_match_the_reference(bits):
    groups = [
        torch.tensor([-3.4e38, 1.0] * (GROUP // 2)),  # a min below bfloat16's lowest (general path)
        torch.tensor([-3.39e38, -3.0e38] * (GROUP // 2)),  # just above it (plain path)
        1000.0 + torch.arange(GROUP, dtype=torch.float32) * 1e-3,  # far from zero against its spread
        -1000.0 - torch.arange(GROUP, dtype=torch.float32) * 1e-3,
    ]
    x = torch.cat(groups).to(DEVICE)
    key = noise.key_of(7, 8, device=DEVICE)
    blob = tk.quantize(x, bits, GROUP, key=key)
    assert torch.equal(blob, reference_blob(x, bits, GROUP, key))
    assert torch.equal(tk.dequantize(blob, x.numel(), torch.float32, GROUP),
                       dequantize_reference(blob, x.numel(), torch.float32, GROUP))


@triton.jit
def to_bfloat16(bits_ptr, out_ptr, INTERPRETED: tl.constexpr):
    offsets = tl.arange(0, 4)
    values = tl.load(bits_ptr + offsets).to(tl.float32, bitcast=True)
    tl.store(out_ptr + offsets, round_to(values, tl.bfloat16, INTERPRETED))


def test_a_nan_with_every_mantissa_bit_set_rounds_to_nan_in_bfloat16():
    # NVIDIA arithmetic returns 0x7FFFFFFF for a NaN operand; rounding it to bfloat16 by
    # hand carried into the sign bit and gave -0.0
    bits = torch.tensor([0x7FFFFFFF, -1, 0x7FC00000, 0x3F808000], dtype=torch.int32, device=DEVICE)  # NaNs; 1 + 2^-8
    out = torch.empty(4, dtype=torch.bfloat16, device=DEVICE)
    to_bfloat16[(1,)](bits, out, INTERPRETED=tk.interpreted())  # by hand under the interpreter, else cvt.rn
    assert out[:3].isnan().all()
    assert out[3].item() == 1.0  # a tie rounds to even


def test_a_group_word_nan_with_every_mantissa_bit_set_decodes_to_nan():
    x = sample(2 * GROUP, torch.bfloat16)
    blob = tk.quantize(x, 4, GROUP, key=noise.key_of(1, 2, device=DEVICE))
    all_ones_nan = torch.tensor([0x7FFF], dtype=torch.int16).view(torch.uint8).to(DEVICE)
    blob[2:4] = all_ones_nan  # group 0's min: a bfloat16 NaN whose mantissa is all ones
    decoded = tk.dequantize(blob, x.numel(), torch.bfloat16, GROUP)
    assert decoded[:GROUP].isnan().all() and not decoded[GROUP:].isnan().any()
    assert dequantize_reference(blob, x.numel(), torch.bfloat16, GROUP)[:GROUP].isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_any_block_size_writes_the_same_blob(dtype):
    """The GPU suite sweeps the elements a program holds: the blob, the noise included, and
    the decode must not depend on it (here: 4 groups a program instead of 64 or 128)."""
    x = sample(GROUP * 13 + 5, dtype, seed=2)
    matrix = sample(GROUP * 3 * 8, dtype, seed=3).view(GROUP * 3, 8)  # feature-major: 8 features, 3 groups each
    key = noise.key_of(11, 12, device=DEVICE)
    own = tk.quantize(x, 2, GROUP, key=key), tk.quantize_transposed(matrix, 2, GROUP, key=key)
    size = functools.partial(program_sizes.elements_in_a_program, 2, 2)
    before = size(), size(decoding=True)
    with program_sizes.elements_per_program(256, 256):
        assert (size(), size(decoding=True)) == (256, 256)
        small = tk.quantize(x, 2, GROUP, key=key), tk.quantize_transposed(matrix, 2, GROUP, key=key)
        decoded = tk.dequantize(own[0], x.numel(), dtype, GROUP)
    assert (size(), size(decoding=True)) == before != (256, 256)  # restored on leaving
    assert torch.equal(small[0], reference_blob(x, 2, GROUP, key)) and torch.equal(small[0], own[0])
    assert torch.equal(small[1], own[1])
    assert torch.equal(decoded, dequantize_reference(own[0], x.numel(), dtype, GROUP))
    with pytest.raises(ValueError, match="power of two of at least 256"):
        with program_sizes.elements_per_program(1000, 256):
            pass


def test_a_launch_through_wrap_triton_writes_the_same_blob():
    """The GPU suite's probe wraps the quantize as a ``torch.library.triton_op``, whose body
    launches through ``wrap_triton`` (with Triton's default fusion: the kernels do not
    depend on it). Called eagerly, it must write the plain launch's blob."""
    from gact_fx.bench.triton_op_probe import _wrapped_quantize
    from gact_fx.runtime.launches import through_wrap_triton

    x = sample(GROUP * 9 + 7, torch.bfloat16, seed=4)
    key = noise.key_of(5, 9, device=DEVICE)
    plain = tk.quantize(x, 2, GROUP, key=key)
    try:
        with through_wrap_triton():
            wrapped = tk.quantize(x, 2, GROUP, key=key)
    except Exception as error:  # torch 2.9's wrap_triton refuses the interpreter's kernels
        if ON_GPU:
            raise
        pytest.skip(f"wrap_triton does not take interpreted kernels on torch {torch.__version__}: {error}")
    assert torch.equal(wrapped, plain) and torch.equal(plain, reference_blob(x, 2, GROUP, key))
    assert torch.equal(_wrapped_quantize()(x, key, 2), tk.quantize(x, 2, 256, key=key))  # (its groups: 256)


def same_decode(a, b):
    if ON_GPU and a.dtype == torch.float32:  # as above: the GPU may fuse a multiply-add
        return torch.equal(a.isnan(), b.isnan()) and torch.allclose(a[~a.isnan()], b[~b.isnan()], rtol=1e-6, atol=1e-6)
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a[~a.isnan()], b[~b.isnan()])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_dithered_blobs_and_decodes_are_the_references(dtype, bits):
    x = sample(300, dtype, seed=2)
    x[5] = float("inf")
    key = noise.key_of(0xD17E, 3, device=DEVICE)
    blob = tk.quantize(x, bits, GROUP, key=key, dithered=True)
    assert torch.equal(blob, reference_blob(x, bits, GROUP, key, dithered=True))
    state = torch.tensor([0x1234, 9, 0], dtype=torch.int64, device=DEVICE)
    from_state = tk.quantize(x, bits, GROUP, state=state.clone(), dithered=True)
    assert torch.equal(from_state, reference_blob(x, bits, GROUP, noise.call_key(state), dithered=True))
    decoded = tk.dequantize(blob, 300, dtype, GROUP, dithered=True)
    assert same_decode(decoded, dequantize_reference(blob, 300, dtype, GROUP, dithered=True))
    assert not same_decode(decoded, dequantize_reference(blob, 300, dtype, GROUP))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [2, 3, 8])
def test_dithered_feature_major_blobs_and_decodes_are_the_transposed_copys(dtype, bits):
    matrix = (torch.randn(128, 24, generator=torch.Generator().manual_seed(bits)) * torch.logspace(-2, 1, 24))
    matrix = matrix.to(dtype).to(DEVICE)
    key = noise.key_of(0xD17E, 4, device=DEVICE)
    blob = tk.quantize_transposed(matrix, bits, GROUP, key=key, dithered=True)
    assert torch.equal(blob, reference_blob(matrix.t().reshape(-1), bits, GROUP, key, dithered=True))
    decoded = tk.dequantize_transposed(blob, 128, 24, dtype, GROUP, dithered=True)
    expected = dequantize_reference(blob, matrix.numel(), dtype, GROUP, dithered=True).view(24, 128).t()
    assert same_decode(decoded, expected)
