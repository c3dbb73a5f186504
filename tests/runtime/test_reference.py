"""The torch reference codec: packing, exactness at 32 bits and for masks, error bounds,
unbiasedness, special values (±inf, the dtype's extremes) and NaN."""

import pytest
import torch

from gact_fx.runtime import format as fmt
from gact_fx.runtime.noise import key_of, rounding_noise
from gact_fx.runtime.reference import (
    dequantize_reference,
    pack_codes,
    pack_group_codes,
    quantize_reference,
    scale_of,
    unpack_codes,
    unpack_group_codes,
    unpack_group_words,
)

FLOATS = [torch.float32, torch.float16, torch.bfloat16]


def roundtrip(x, bits, group_size=64, seed=0):
    noise = rounding_noise(fmt.num_groups(x.numel(), group_size), group_size, key_of(seed, 977))
    blob = quantize_reference(x, bits, group_size, noise)
    return blob, dequantize_reference(blob, x.numel(), x.dtype, group_size)


def group_scales(blob, numel, group_size):
    """The steps of a blob's groups, none of them flagged."""
    groups = fmt.num_groups(numel, group_size)
    half = unpack_group_words(blob[: groups * 4])[0]
    return scale_of(half, torch.tensor(2 ** fmt.bits_from_blob_nbytes(blob.numel()) - 1))


def test_codes_are_packed_little_endian_within_a_byte():
    codes = torch.tensor([[1, 0, 3, 2, 0, 0, 0, 1]], dtype=torch.uint8)
    packed = pack_codes(codes, 2)
    assert packed.tolist() == [1 | 0 << 2 | 3 << 4 | 2 << 6, 1 << 6]
    assert torch.equal(unpack_codes(packed, 2), codes.flatten())


def test_three_bit_codes_are_a_two_bit_plane_then_a_one_bit_plane_per_group():
    codes = torch.randint(0, 8, (3, 64), dtype=torch.uint8)
    planes = pack_group_codes(codes, 3).view(3, 64 * 3 // 8)
    assert torch.equal(planes[:, :16].reshape(-1), pack_codes(codes & 3, 2))
    assert torch.equal(planes[:, 16:].reshape(-1), pack_codes(codes >> 2, 1))
    assert torch.equal(unpack_group_codes(planes.reshape(-1), 3, 64), codes)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_pack_unpack_are_inverse(bits):
    codes = torch.randint(0, 2**bits, (5, 64), dtype=torch.uint8)
    assert torch.equal(unpack_codes(pack_codes(codes, bits), bits), codes.flatten())


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("numel", [1, 100, 1000])
def test_32_bits_is_an_exact_copy(dtype, numel):
    x = torch.randn(numel).to(dtype)
    blob, y = roundtrip(x, 32)
    assert blob.numel() == fmt.float_blob_nbytes(numel, 32, 64, x.element_size())
    assert torch.equal(x, y) and y.dtype == dtype


@pytest.mark.parametrize("numel", [1, 7, 8, 9, 1000])
def test_bool_masks_are_lossless(numel):
    mask = torch.rand(numel) > 0.5
    blob = quantize_reference(mask, 1, 64, None)
    assert blob.numel() == fmt.bool_blob_nbytes(numel)
    assert torch.equal(dequantize_reference(blob, numel, torch.bool, 64), mask)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_error_is_at_most_one_step_per_element(dtype, bits):
    x = (torch.randn(1000) * 3).to(dtype)
    blob, y = roundtrip(x, bits)
    step = group_scales(blob, x.numel(), 64).repeat_interleave(64)[: x.numel()]
    slack = 1e-6 + (x.float().abs() * 1e-2 if dtype != torch.float32 else 0)  # output rounding to dtype
    assert ((y.float() - x.float()).abs() <= step * (1 + 1e-5) + slack).all()


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_stochastic_rounding_is_unbiased(bits):
    x = torch.randn(512)
    draws = torch.stack([roundtrip(x, bits, seed=s)[1] for s in range(400)])
    single = (draws[0] - x).abs().mean()
    bias = (draws.mean(0) - x).abs().mean()
    assert bias < single / 8  # 1/sqrt(400) = 1/20 of a single draw if unbiased


@pytest.mark.parametrize("offset", [1000.0, -1000.0, 0.0])
def test_the_bfloat16_group_words_still_bound_every_group(offset):
    # the min rounds down to a bfloat16 and the half range up, so the stored range covers
    # the group and the rounding stays unbiased, even where the min is far from zero
    x = offset + torch.rand(4 * 64, generator=torch.Generator().manual_seed(3)) * 0.7
    for bits in (2, 8):
        blob, y = roundtrip(x, bits)
        half, group_min = unpack_group_words(blob[: 4 * 4])
        groups = x.view(4, 64)
        assert torch.equal(half, half.to(torch.bfloat16).float()) and torch.equal(group_min, group_min.to(torch.bfloat16).float())
        assert (group_min <= groups.amin(1)).all()
        assert (group_min + 2 * half >= groups.amax(1)).all()
        assert (y.view(4, 64).amax(1) <= group_min + 2 * half).all()
    draws = torch.stack([roundtrip(x, 2, seed=s)[1] for s in range(400)])
    assert (draws.mean(0) - x).abs().mean() < (draws[0] - x).abs().mean() / 8  # 1/20 if unbiased


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_saturated_ends_decode_exactly(bits):
    # tanh at -1 and 1, a sigmoid at 0 and 1: a backward that reads them through 1 - y^2 or
    # y (1 - y) gets 0 there, as without gact (with the scale itself rounded to bfloat16,
    # 1 came back as 1.0077 or 0.9999)
    for low, high in ((-1.0, 1.0), (0.0, 1.0)):
        x = torch.full((2 * 64,), high)
        x[::3] = low
        _, y = roundtrip(x, bits)
        assert torch.equal(y, x)
    x = torch.full((64,), 6.0)  # other ends that are bfloat16s: within float32's rounding of code * scale
    x[::3] = 0.0
    _, y = roundtrip(x, bits)
    assert torch.allclose(y, x, rtol=2 * torch.finfo(torch.float32).eps, atol=0)


def test_a_min_below_bfloat16s_lowest_is_stored_as_its_lowest():
    x = torch.tensor([-3.4e38, 1.0] * 32)
    blob, y = roundtrip(x, 4)
    _, group_min = unpack_group_words(blob[:4])
    assert group_min.item() == -torch.finfo(torch.bfloat16).max
    assert torch.isfinite(y).all()


def test_constant_groups_are_exact():
    x = torch.full((300,), 3.25)
    assert torch.equal(roundtrip(x, 2)[1], x)


def test_nan_poisons_only_its_group():
    x = torch.randn(256)
    x[70] = float("nan")
    _, y = roundtrip(x, 4, group_size=64)
    assert torch.isnan(y[64:128]).all()
    assert torch.isfinite(torch.cat([y[:64], y[128:]])).all()


def extreme_values(dtype):
    return [float("-inf"), float("inf"), -torch.finfo(dtype).max, torch.finfo(dtype).max]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("kind", range(4))
def test_special_values_come_back_exactly_and_their_neighbours_quantize_as_usual(dtype, bits, kind):
    x = (torch.randn(512) * 3).to(dtype)
    special = torch.zeros(512, dtype=torch.bool)
    special[[3, 5, 64, 65, 66, 200, 511]] = True  # scattered in three groups of 64
    x[special] = extreme_values(dtype)[kind]
    blob, y = roundtrip(x, bits)
    assert torch.equal(y[special], x[special])
    normal = x[~special].float()
    assert torch.isfinite(y[~special]).all()
    # one step of the neighbours' own range (specials excluded), one fewer code in a flagged group
    span = normal.max() - normal.min()
    assert ((y[~special].float() - normal).abs() <= span / (2**bits - 2) * (1 + 1e-5) + normal.abs() * 1e-2).all()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [1, 2, 8])
def test_an_additive_attention_mask_round_trips_exactly(dtype, bits):
    # transformers' padding and causal masks: 0 where attended, finfo.min or -inf elsewhere
    for masked in (torch.finfo(dtype).min, float("-inf")):
        mask = torch.zeros(4, 1, 32, 32, dtype=dtype)
        mask[:, :, torch.triu(torch.ones(32, 32, dtype=torch.bool), 1)] = masked
        mask[1, :, :, 25:] = masked  # a padded sequence
        _, y = roundtrip(mask.reshape(-1), bits)
        assert torch.equal(y, mask.reshape(-1))


def test_neighbours_of_special_values_stay_unbiased():
    x = torch.randn(256)
    x[::7] = -float("inf")
    draws = torch.stack([roundtrip(x, 2, seed=s)[1] for s in range(400)])
    normal = torch.isfinite(x)
    single = (draws[0, normal] - x[normal]).abs().mean()
    bias = (draws[:, normal].mean(0) - x[normal]).abs().mean()
    assert bias < single / 8


@pytest.mark.parametrize("case", ["two kinds in a group", "1 bit, other values not all equal"])
def test_groups_the_format_cannot_store_honestly_are_poisoned(case):
    x = torch.randn(128)
    if case == "two kinds in a group":
        x[3], x[9] = float("inf"), -float("inf")
        bits = 4
    else:
        x[3] = -float("inf")
        bits = 1
    _, y = roundtrip(x, bits)
    assert torch.isnan(y[:64]).all() and torch.isfinite(y[64:]).all()


@pytest.mark.parametrize("dtype,magnitude", [(torch.float32, 1e30), (torch.bfloat16, 1e30), (torch.float16, 6e4)])
@pytest.mark.parametrize("bits", [1, 2, 8])
def test_huge_magnitudes_stay_finite(dtype, magnitude, bits):
    x = ((torch.rand(512) * 2 - 1) * magnitude).to(dtype)  # |x| <= magnitude: finite inputs
    _, y = roundtrip(x, bits)
    assert torch.isfinite(y).all()
    assert (y.float() - x.float()).abs().max() <= 2 * x.float().abs().max()


def test_quantize_takes_its_noise_from_the_key():
    x = torch.randn(256)
    assert torch.equal(roundtrip(x, 2, seed=3)[0], roundtrip(x, 2, seed=3)[0])
    assert not torch.equal(roundtrip(x, 2, seed=3)[0], roundtrip(x, 2, seed=4)[0])
