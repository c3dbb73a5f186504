"""The packed blob layout: sizes, bit-width tags, rejected widths and group sizes."""

import pytest

from gact_fx.runtime import format as fmt


@pytest.mark.parametrize("bits", fmt.SUPPORTED_BITS)
@pytest.mark.parametrize("group_size", [8, 64, 256])
@pytest.mark.parametrize("numel", [1, 7, 8, 255, 256, 257, 10_000])
def test_bits_are_recovered_from_blob_length(bits, group_size, numel):
    for itemsize in (2, 4):
        assert fmt.bits_from_blob_nbytes(fmt.float_blob_nbytes(numel, bits, group_size, itemsize)) == bits
    assert fmt.bits_from_blob_nbytes(fmt.bool_blob_nbytes(numel)) == 1


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_quantized_blob_size_follows_the_layout(bits):
    numel, group_size = 1000, 256
    groups = 4  # ceil(1000 / 256)
    body = groups * 4 + groups * group_size * bits // 8  # a bfloat16 min and half range per group
    padded = -(-body // 8) * 8
    assert fmt.float_blob_nbytes(numel, bits, group_size, 4) == padded + fmt.tag_bytes(bits)


def test_pass_through_and_bool_sizes():
    assert fmt.float_blob_nbytes(10, 32, 256, 4) == 40 + fmt.tag_bytes(32)
    assert fmt.float_blob_nbytes(10, 32, 256, 2) == 24 + fmt.tag_bytes(32)
    assert fmt.bool_blob_nbytes(17) == 8 + fmt.tag_bytes(1)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_ideal_ratio_is_the_design_formula(bits):
    assert fmt.ideal_ratio(bits) == pytest.approx((bits + 0.125) / 32)
    large = 256 * 4096
    measured = fmt.float_blob_nbytes(large, bits, 256, 4) / (4 * large)
    assert measured == pytest.approx(fmt.ideal_ratio(bits), rel=1e-4)


@pytest.mark.parametrize("bad", [0, 5, 6, 16, 64])
def test_unsupported_bits_are_rejected(bad):
    with pytest.raises(ValueError, match="bits must be one of"):
        fmt.check_bits(bad)


@pytest.mark.parametrize("bad", [0, 8, 24, 100, 8192])
def test_group_size_must_be_a_multiple_of_16_up_to_4096(bad):
    with pytest.raises(ValueError, match="multiple of 16 from 16 to 4096"):
        fmt.check_group_size(bad)


def test_a_length_without_a_tag_is_not_a_blob():
    with pytest.raises(ValueError, match="not a gact blob"):
        fmt.bits_from_blob_nbytes(64)
