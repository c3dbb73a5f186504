"""Property-based tests of the packed format (hypothesis): any shape, dtype, width, group."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gact_fx.runtime import format as fmt
from gact_fx.runtime.noise import key_of, rounding_noise
from gact_fx.runtime.ops import inverse_permutation
from gact_fx.runtime.reference import (
    dequantize_reference,
    pack_group_codes,
    quantize_reference,
    scale_of,
    unpack_group_codes,
    unpack_group_words,
)

from .sites import SLOT

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
shapes = st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=4)
group_sizes = st.sampled_from([8, 16, 64, 256])
widths = st.sampled_from([1, 2, 3, 4, 8])


@st.composite
def tensors(draw):
    shape = draw(shapes)
    dtype = draw(st.sampled_from(FLOATS))
    scale = draw(st.sampled_from([1e-6, 1.0, 100.0, 3e4]))
    offset = draw(st.sampled_from([0.0, 5.0, -1e3]))
    seed = draw(st.integers(min_value=0, max_value=2**31))
    values = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale + offset
    limit = torch.finfo(dtype).max / 2  # finite inputs (non-finite ones have their own tests)
    return values.clamp(-limit, limit).to(dtype)


@settings(max_examples=150, deadline=None)
@given(codes=st.data(), bits=widths, groups=st.integers(1, 5), group_size=group_sizes)
def test_pack_unpack_round_trip(codes, bits, groups, group_size):
    values = codes.draw(st.lists(st.integers(0, 2**bits - 1), min_size=groups * group_size, max_size=groups * group_size))
    codes_tensor = torch.tensor(values, dtype=torch.uint8).view(groups, group_size)
    packed = pack_group_codes(codes_tensor, bits)
    assert packed.numel() == groups * group_size * bits // 8
    assert torch.equal(unpack_group_codes(packed, bits, group_size), codes_tensor)


@settings(max_examples=200, deadline=None)
@given(x=tensors(), bits=widths, group_size=group_sizes, seed=st.integers(0, 2**40))
def test_error_is_within_one_step_and_the_blob_has_the_declared_size(x, bits, group_size, seed):
    flat = x.reshape(-1)
    noise = rounding_noise(fmt.num_groups(flat.numel(), group_size), group_size, key_of(seed, seed >> 32))
    blob = quantize_reference(flat, bits, group_size, noise)
    assert blob.numel() == fmt.float_blob_nbytes(flat.numel(), bits, group_size, x.element_size())
    assert fmt.bits_from_blob_nbytes(blob.numel()) == bits
    decoded = dequantize_reference(blob, flat.numel(), x.dtype, group_size)
    assert decoded.dtype == x.dtype and torch.isfinite(decoded).all()
    groups = fmt.num_groups(flat.numel(), group_size)
    half = unpack_group_words(blob[: groups * 4])[0]
    assert not torch.signbit(half).any() and not half.isnan().any()  # finite inputs: none flagged or poisoned
    step = scale_of(half, torch.tensor(2**bits - 1)).repeat_interleave(group_size)[: flat.numel()]
    exact = flat.float()
    # Rounding on top of the step: the decode's fp32 arithmetic (an ulp of the value: a
    # nearly constant group can have a step below that), then half an ulp of the output
    # dtype, subnormals included.
    magnitude = torch.maximum(exact.abs(), decoded.float().abs())
    rounding = magnitude * torch.finfo(torch.float32).eps
    if x.dtype != torch.float32:
        info = torch.finfo(x.dtype)
        rounding = rounding + (magnitude + info.smallest_normal) * info.eps / 2
    assert ((decoded.float() - exact).abs() <= step * (1 + 1e-5) + rounding + 1e-30).all()


def test_a_subnormal_fp16_group_decodes_within_a_step_and_half_an_ulp():
    # Found by hypothesis: fp16 values near 1e-7 are subnormal; the decode's rounding to
    # fp16 then costs up to half of 2**-24, far more than half an ulp relative to the value.
    flat = torch.tensor([5.3644e-07, -2.0862e-06, 1.2517e-06, -3.5763e-07, 2.9802e-07, 1.1921e-07, 0.0, 7.7486e-07],
                        dtype=torch.float16)
    noise = rounding_noise(1, 8, key_of(0, 0))
    decoded = dequantize_reference(quantize_reference(flat, 4, 8, noise), 8, torch.float16, 8)
    step = (flat.float().max() - flat.float().min()) / 15
    assert ((decoded.float() - flat.float()).abs() <= step + 2 ** -25 + 1e-12).all()


@settings(max_examples=100, deadline=None)
@given(x=tensors())
def test_pass_through_and_masks_are_lossless(x):
    flat = x.reshape(-1)
    assert torch.equal(dequantize_reference(quantize_reference(flat, 32, 64, None), flat.numel(), x.dtype, 64), flat)
    mask = flat > flat.float().median().to(x.dtype)
    assert torch.equal(dequantize_reference(quantize_reference(mask, 1, 64, None), mask.numel(), torch.bool, 64), mask)


@settings(max_examples=100, deadline=None)
@given(x=tensors(), bits=st.sampled_from(fmt.SUPPORTED_BITS), data=st.data())
def test_any_layout_comes_back_in_the_same_layout(x, bits, data):
    perm = data.draw(st.permutations(list(range(x.dim()))))
    strided = x.permute(perm).contiguous().permute(inverse_permutation(perm))  # dense, dims in memory order ``perm``
    blob = torch.ops.gact.quantize(strided, bits, 64, list(perm), SLOT)
    decoded = torch.ops.gact.dequantize(blob, list(x.shape), x.dtype, 64, list(perm), SLOT)
    assert decoded.shape == x.shape
    assert all(a == b for a, b, size in zip(decoded.stride(), strided.stride(), x.shape) if size > 1)  # size-1 strides are free
    if bits == 32:
        assert torch.equal(decoded, x)
    else:
        span = (x.float().max() - x.float().min()).item()
        assert (decoded.float() - x.float()).abs().max().item() <= span / (2**bits - 1) * (1 + 1e-5) + x.float().abs().max().item() * 2**-7 + 1e-30


@settings(max_examples=150, deadline=None)
@given(x=tensors(), bits=st.sampled_from([2, 4, 8]), group_size=group_sizes, data=st.data())
def test_special_values_anywhere_come_back_at_their_positions(x, bits, group_size, data):
    flat = x.reshape(-1).clone()
    extremes = [float("-inf"), float("inf"), -torch.finfo(x.dtype).max, torch.finfo(x.dtype).max]
    kind = data.draw(st.integers(0, 3))  # one kind per tensor: two kinds in a group poison it
    positions = data.draw(st.lists(st.integers(0, flat.numel() - 1), max_size=flat.numel()))
    flat[positions] = extremes[kind]
    noise = rounding_noise(fmt.num_groups(flat.numel(), group_size), group_size, key_of(kind, len(positions)))
    decoded = dequantize_reference(quantize_reference(flat, bits, group_size, noise), flat.numel(), x.dtype, group_size)
    special = torch.zeros_like(flat, dtype=torch.bool)
    special[positions] = True
    assert torch.equal(decoded[special], flat[special])
    assert torch.isfinite(decoded[~special]).all()
