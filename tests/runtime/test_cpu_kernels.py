"""The C++ CPU codec against the torch reference: the same blob and decode, bit for bit."""

import re

import pytest
import torch

from gact_fx.runtime import cpu_kernels, kernels, noise
from gact_fx.runtime import format as fmt
from gact_fx.runtime.reference import dequantize_reference, quantize_reference

pytestmark = pytest.mark.compat

if not cpu_kernels.available():
    pytest.skip("the CPU codec could not be compiled here (no C++ compiler?)", allow_module_level=True)

FLOATS = [torch.float32, torch.float16, torch.bfloat16]


def sample(numel, dtype, seed=0):
    values = torch.randn(numel, generator=torch.Generator().manual_seed(seed)) * 3
    return values.to(dtype)


def reference_blob(x, bits, group_size, key, dithered=False):
    noise_values = noise.rounding_noise(fmt.num_groups(x.numel(), group_size), group_size, key)
    return quantize_reference(x, bits, group_size, noise_values, key if dithered else None)


def same_decode(a, b):
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a[~a.isnan()], b[~b.isnan()])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("numel", [1, 255, 1000, 70_001])
@pytest.mark.parametrize("group_size", [64, 256])
def test_blobs_and_decodes_are_bit_identical_to_the_reference(dtype, bits, numel, group_size):
    x = sample(numel, dtype)
    key = noise.key_of(0xABCDEF, numel)
    blob = cpu_kernels.quantize(x, bits, group_size, key=key)
    assert torch.equal(blob, reference_blob(x, bits, group_size, key))
    assert same_decode(cpu_kernels.dequantize(blob, numel, dtype, group_size), dequantize_reference(blob, numel, dtype, group_size))


@pytest.mark.parametrize("bits", [1, 2, 3, 8])
def test_blob_tails_are_zero_in_memory_the_allocator_hands_back_dirty(bits):
    # the codec writes the blob's padding and tag itself: a freed tensor of 0xFF bytes the
    # same size is the memory torch.empty is likely to hand the next blob
    x, mask = sample(1000, torch.float32), torch.rand(1001, generator=torch.Generator().manual_seed(3)) > 0.5
    key = noise.key_of(5, 6)
    encoders = {
        "quantize": (lambda: cpu_kernels.quantize(x, bits, 256, key=key), reference_blob(x, bits, 256, key)),
        "feature-major": (lambda: cpu_kernels.quantize_transposed(x[:768].view(256, 3).repeat(1, 8), bits, 256, key=key),
                          reference_blob(x[:768].view(256, 3).repeat(1, 8).t().reshape(-1), bits, 256, key)),
        "bool": (lambda: cpu_kernels.pack_bool(mask), quantize_reference(mask, 1, 256, None)),
    }
    for name, (encode, expected) in encoders.items():
        for _ in range(3):
            dirty = torch.full_like(expected, 0xFF)
            del dirty
            assert torch.equal(encode(), expected), name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_decodes_round_ties_to_even_as_torch_converts(dtype):
    # A float32 blob decoded as 16 bits: about 2**20 / 2**16 (bf16) and 2**20 / 2**13 (fp16)
    # of the float32 values fall exactly halfway between two 16-bit values.
    x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(1)) * 1e3
    blob = cpu_kernels.quantize(x, 8, 256, key=noise.key_of(1, 2))
    wide = dequantize_reference(blob, x.numel(), torch.float32, 256)
    low_bits = wide.view(torch.int32) & (0xFFFF if dtype == torch.bfloat16 else 0x1FFF)
    assert (low_bits == (0x8000 if dtype == torch.bfloat16 else 0x1000)).sum() > 4  # ties present
    assert torch.equal(cpu_kernels.dequantize(blob, x.numel(), dtype, 256), wide.to(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_special_values_nan_and_poisoned_groups_match_the_reference(dtype, bits):
    x = sample(6 * 64, dtype)
    extreme = torch.finfo(dtype).max
    x[3], x[10] = float("-inf"), float("-inf")
    x[64 + 1] = extreme
    x[2 * 64 + 4] = float("nan")
    x[3 * 64 + 1], x[3 * 64 + 2] = float("inf"), -extreme  # two kinds: poisoned
    x[4 * 64 :] = -extreme
    x[5 * 64 + 7] = 0.0
    key = noise.key_of(3, 4)
    blob = cpu_kernels.quantize(x, bits, 64, key=key)
    assert torch.equal(blob, reference_blob(x, bits, 64, key))
    assert same_decode(cpu_kernels.dequantize(blob, x.numel(), dtype, 64), dequantize_reference(blob, x.numel(), dtype, 64))


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_degenerate_groups_match_the_reference(bits):
    # Groups the kernel takes on a path of their own: a range of one subnormal step, whose
    # scale halves to zero (0 / 0 is NaN inside the rounding), constant groups, signed zeros,
    # ranges at the float32 limits, and subnormal values (which bfloat16's one-instruction
    # conversion would flush to zero).
    step = torch.finfo(torch.float32).smallest_normal * 2.0**-23  # the smallest subnormal
    groups = [
        torch.tensor([0.0, 2.0 * step] * 32),
        torch.tensor([0.0, step] * 32),
        torch.tensor([-step, step] * 32),
        torch.full((64,), 3.5),
        torch.tensor([0.0, -0.0] * 32),
        torch.tensor([-3.0e38, 3.0e38] * 32),
        torch.tensor([-3.4e38, 1.0] * 32),  # a min below bfloat16's lowest: stored as bfloat16's lowest
        1000.0 + torch.arange(64, dtype=torch.float32) * 1e-3,  # far from zero against its spread
        torch.arange(64, dtype=torch.float32) * step,
        torch.linspace(-1e-38, 1e-38, 64),  # subnormal values that bfloat16 can hold (from 2^-133)
    ]
    x = torch.cat(groups)
    key = noise.key_of(5, 6)
    blob = cpu_kernels.quantize(x, bits, 64, key=key)
    assert torch.equal(blob, reference_blob(x, bits, 64, key))
    for dtype in FLOATS:  # decoded into each dtype: the subnormal values too (bf16 keeps them)
        decoded, expected = cpu_kernels.dequantize(blob, x.numel(), dtype, 64), dequantize_reference(blob, x.numel(), dtype, 64)
        assert same_decode(decoded, expected)
        assert torch.equal(decoded.view(torch.int16 if dtype != torch.float32 else torch.int32)[~expected.isnan()],
                           expected.view(torch.int16 if dtype != torch.float32 else torch.int32)[~expected.isnan()])


def test_the_noise_key_comes_from_a_sites_state_as_in_the_reference():
    x = sample(1000, torch.float32)
    state = torch.tensor([0x9876543, 41], dtype=torch.int64)
    assert torch.equal(cpu_kernels.quantize(x, 2, 256, state=state), reference_blob(x, 2, 256, noise.call_key(state)))


def test_the_ops_use_the_codec_on_the_cpu_by_default(monkeypatch):
    monkeypatch.delenv("GACT_FX_KERNELS", raising=False)
    x = torch.randn(1000)
    assert kernels.implementation(x, 2) == "cpu"
    assert kernels.implementation(x.bool(), 2) == "cpu" and kernels.implementation(x.bool(), 32) == "cpu"
    assert kernels.implementation(x, 32) == "reference"
    monkeypatch.setenv("GACT_FX_KERNELS", "reference")
    assert kernels.implementation(x, 2) == "reference" and kernels.implementation(x.bool(), 2) == "reference"


@pytest.mark.parametrize("numel", [0, 1, 7, 8, 1000, 70_001])
def test_bool_masks_pack_and_unpack_as_the_reference(numel):
    mask = torch.rand(numel, generator=torch.Generator().manual_seed(numel)) > 0.5
    blob = cpu_kernels.pack_bool(mask)
    assert torch.equal(blob, quantize_reference(mask, 1, 256, None))
    assert torch.equal(cpu_kernels.unpack_bool(blob, numel), mask)
    assert torch.equal(kernels.decode(kernels.encode(mask, 2, 256), numel, torch.bool, 256), mask)  # the ops' path
    floats = cpu_kernels.unpack_mask(blob, numel)  # the mask as float32 0 and 1 (the rewrite's CPU mask path)
    assert floats.dtype == torch.float32 and torch.equal(floats, mask.float())


@pytest.mark.parametrize("first", [0, 2**32 - 16, 2**33 - 16, 2**33, 3 * 2**33 + 48])
def test_the_noise_of_indices_past_two_to_the_32_matches_the_reference(first):
    # The kernel hashes pair indices (about half the element index) in 32-bit lanes, with
    # the high word folded into the key: past 2**33 elements that word must take over.
    key = noise.key_of(0x1234567, 0x89ABCDE)
    index = torch.arange(first, first + 32, dtype=torch.int64)
    assert torch.equal(cpu_kernels.noise(key, first, 32), noise.uniform(key, index))


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("group_size", [8, 24, 40, 48])
def test_groups_of_any_multiple_of_eight_match_the_reference(bits, group_size):
    x = sample(10 * group_size + 3, torch.float32, seed=bits)
    key = noise.key_of(7, group_size)
    blob = cpu_kernels.quantize(x, bits, group_size, key=key)
    assert torch.equal(blob, reference_blob(x, bits, group_size, key))
    assert same_decode(cpu_kernels.dequantize(blob, x.numel(), torch.float32, group_size),
                       dequantize_reference(blob, x.numel(), torch.float32, group_size))


def with_special_values(matrix):
    tokens = matrix.shape[0]
    extreme = torch.finfo(matrix.dtype).max
    matrix[3, 5] = float("inf")
    matrix[tokens - 1, 5] = float("inf")
    matrix[:, 6] = -extreme  # a whole group of special values
    matrix[4, 1] = float("nan")
    matrix[0, 2], matrix[1, 2] = float("inf"), -extreme  # two kinds: poisoned
    return matrix


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("tokens,features,group_size", [(256, 64, 256), (512, 24, 256), (96, 8, 32), (48, 16, 16)])
def test_feature_major_blobs_and_decodes_are_the_transposed_copys_bit_for_bit(dtype, bits, tokens, features, group_size):
    scales = torch.logspace(-2, 1, features)
    matrix = with_special_values((torch.randn(tokens, features, generator=torch.Generator().manual_seed(bits)) * scales).to(dtype))
    key = noise.key_of(0x5EED, tokens)
    blob = cpu_kernels.quantize_transposed(matrix, bits, group_size, key=key)
    assert torch.equal(blob, reference_blob(matrix.t().reshape(-1), bits, group_size, key))
    decoded = cpu_kernels.dequantize_transposed(blob, tokens, features, dtype, group_size)
    expected = dequantize_reference(blob, matrix.numel(), dtype, group_size).view(features, tokens).t()
    assert decoded.is_contiguous() and same_decode(decoded, expected)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("numel,group_size", [(255, 64), (70_001, 256), (4096, 16)])
def test_dithered_blobs_and_decodes_are_bit_identical_to_the_reference(dtype, bits, numel, group_size):
    x = sample(numel, dtype)
    x[7] = float("inf")  # a flagged group decodes its special value without the dither
    key = noise.key_of(0xD17E, numel)
    blob = cpu_kernels.quantize(x, bits, group_size, key=key, dithered=True)
    assert torch.equal(blob, reference_blob(x, bits, group_size, key, dithered=True))
    expected = dequantize_reference(blob, numel, dtype, group_size, dithered=True)
    decoded = cpu_kernels.dequantize(blob, numel, dtype, group_size, dithered=True)
    assert same_decode(decoded, expected) and (bits == 1 or decoded[7] == float("inf"))  # (1 bit: poisoned)
    assert not same_decode(decoded, dequantize_reference(blob, numel, dtype, group_size))  # the dither is there


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("tokens,features,group_size", [(256, 64, 256), (512, 24, 256), (48, 16, 16)])
def test_dithered_feature_major_blobs_and_decodes_are_the_transposed_copys(dtype, bits, tokens, features, group_size):
    scales = torch.logspace(-2, 1, features)
    matrix = with_special_values((torch.randn(tokens, features, generator=torch.Generator().manual_seed(bits)) * scales).to(dtype))
    key = noise.key_of(0xD17E, tokens)
    blob = cpu_kernels.quantize_transposed(matrix, bits, group_size, key=key, dithered=True)
    assert torch.equal(blob, reference_blob(matrix.t().reshape(-1), bits, group_size, key, dithered=True))
    decoded = cpu_kernels.dequantize_transposed(blob, tokens, features, dtype, group_size, dithered=True)
    expected = dequantize_reference(blob, matrix.numel(), dtype, group_size, dithered=True).view(features, tokens).t()
    assert decoded.is_contiguous() and same_decode(decoded, expected)


def test_a_dithered_blob_keeps_the_key_a_sites_state_gives():
    x, state = sample(1000, torch.float32), torch.tensor([0x1234, 5, 0])
    blob = cpu_kernels.quantize(x, 2, 256, state=state, dithered=True)
    assert torch.equal(blob, reference_blob(x, 2, 256, noise.call_key(state), dithered=True))


@pytest.mark.parametrize("bits", [2, 8])
def test_feature_major_decodes_keep_subnormal_values_in_every_dtype(bits):
    # one feature of subnormal values among ordinary ones: bfloat16's one-instruction
    # conversion would flush them, so that block must take the exact rounding
    matrix = torch.randn(256, 32, generator=torch.Generator().manual_seed(3))
    matrix[:, 5] = torch.linspace(-1e-38, 1e-38, 256)
    blob = cpu_kernels.quantize_transposed(matrix, bits, 256, key=noise.key_of(7, 8))
    for dtype in FLOATS:
        decoded = cpu_kernels.dequantize_transposed(blob, 256, 32, dtype, 256)
        expected = dequantize_reference(blob, matrix.numel(), dtype, 256).view(32, 256).t()
        assert torch.equal(decoded, expected)
        if dtype != torch.float16:  # float16 cannot hold them
            assert (expected[:, 5] != 0).sum() > 100


def test_feature_major_noise_comes_from_a_sites_state_as_in_the_reference():
    matrix = torch.randn(256, 32)
    state = torch.tensor([0x9876543, 41], dtype=torch.int64)
    blob = cpu_kernels.quantize_transposed(matrix, 2, 256, state=state)
    assert torch.equal(blob, reference_blob(matrix.t().reshape(-1), 2, 256, noise.call_key(state)))


@pytest.mark.parametrize("tokens,features,group_size", [(300, 64, 256), (256, 12, 256), (256, 64, 24)],
                         ids=["tokens not a multiple of the group", "features not a multiple of 8", "group not of 16"])
def test_shapes_the_feature_major_kernels_do_not_take_are_refused(tokens, features, group_size):
    assert not cpu_kernels.transposable(tokens, features, group_size, torch.float32)
    with pytest.raises(ValueError, match="no feature-major encoding"):
        cpu_kernels.quantize_transposed(torch.randn(tokens, features), 2, group_size, key=noise.key_of(1, 2))


def test_each_input_dtype_has_a_library_of_its_own_that_refuses_the_others():
    # one library per dtype is a third of the build; a mix-up must fail loudly, not misread bytes
    x = sample(512, torch.float32)
    blob = cpu_kernels._new_blob(x.numel(), 2, 256, 2, dithered=False)
    bf16_library = cpu_kernels.library(torch.bfloat16)
    assert bf16_library is not cpu_kernels.library(torch.float32)
    status = bf16_library.gact_encode(x.data_ptr(), x.numel(), 256, blob.data_ptr(), blob.numel(),
                                      noise.key_of(1, 2).data_ptr(), 0, 2, float(torch.finfo(torch.float32).max), 1.0,
                                      cpu_kernels.DTYPE_CODES[torch.float32], 0)
    assert status == 2


def test_the_signature_table_types_every_export_of_the_cpp_source_with_its_arity():
    exported = dict(re.findall(r'extern "C" \w+ (gact_\w+)\(([^)]*)\)', cpu_kernels.source()))
    assert set(exported) == set(cpu_kernels.SIGNATURES)
    for name, parameters in exported.items():
        assert len(parameters.split(",")) == len(cpu_kernels.SIGNATURES[name][0]), name
