"""Triton kernels for the packed format (``runtime.format``): quantize and dequantize.

Imported only when used (``runtime.kernels``): importing it imports Triton. The kernels
write and read exactly the blob layout of the torch reference (``runtime.reference``):
same per-group fp32 scale and min, same code packing, same tail padding. Their rounding
noise is Philox (``tl.rand(seed, element index)``), reproducible per seed; the reference
draws from a torch generator, so tests feed it ``rounding_noise`` from here to compare
codes bit for bit. Each program handles ``GROUPS_PER_BLOCK`` consecutive groups, and the
grid has one program per block: no loop with run-time bounds, which the interpreter of
Triton 3.6 (torch 2.11's) rejects, and which a memory-bound kernel does not need. Under
``TRITON_INTERPRET=1`` they run on CPU tensors (slowly): that is how they are tested
without a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import format as fmt

FP32_MAX = 3.4028234663852886e38
GROUPS_PER_BLOCK = 4


@triton.jit
def _noise_kernel(out_ptr, num_groups, seed, GROUP: tl.constexpr, BLOCK: tl.constexpr):
    groups = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)[:, None]
    offsets = groups.to(tl.int64) * GROUP + tl.arange(0, GROUP)[None, :]
    tl.store(out_ptr + offsets, tl.rand(seed, offsets), mask=groups < num_groups)


@triton.jit
def _quantize_kernel(
    x_ptr, blob_ptr, numel, num_groups, seed,
    BITS: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr,
):
    PER_BYTE: tl.constexpr = 8 // BITS
    BYTES: tl.constexpr = GROUP * BITS // 8
    LEVELS: tl.constexpr = (1 << BITS) - 1
    metadata = blob_ptr.to(tl.pointer_type(tl.float32))
    codes_out = blob_ptr + 8 * num_groups
    rows = tl.arange(0, BLOCK)[:, None]
    lanes = tl.arange(0, GROUP)[None, :]
    shifts = (tl.arange(0, PER_BYTE) * BITS)[None, None, :]
    byte_lanes = tl.arange(0, BYTES)[None, :]
    last = tl.load(x_ptr + numel - 1).to(tl.float32)
    groups = tl.program_id(0) * BLOCK + rows  # [BLOCK, 1]
    live = groups < num_groups
    offsets = groups.to(tl.int64) * GROUP + lanes
    inside = offsets < numel
    x = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    x = tl.where(inside, x, last)  # the tail group repeats the last element
    finite = (x == x) & (tl.abs(x) < float("inf"))
    all_finite = tl.min(finite.to(tl.int32), axis=1)[:, None] == 1
    has_nan = tl.max((x != x).to(tl.int32), axis=1)[:, None] == 1
    group_min = tl.min(x, axis=1)[:, None]
    group_max = tl.max(x, axis=1)[:, None]
    group_min = tl.where(has_nan, float("nan"), group_min)  # torch.amin propagates NaN
    half_range = group_max * 0.5 - group_min * 0.5
    scale = tl.minimum(half_range / (LEVELS * 0.5), FP32_MAX)
    scale = tl.where(scale > 0, scale, 1.0)
    scale = tl.where(all_finite, scale, float("nan"))
    normalized = (x * 0.5 - group_min * 0.5) / (scale * 0.5)
    codes = tl.floor(normalized + tl.rand(seed, offsets))
    codes = tl.minimum(tl.maximum(codes, 0.0), LEVELS)
    codes = tl.where(all_finite, codes, 0.0).to(tl.int32)
    packed = tl.sum(tl.reshape(codes, (BLOCK, BYTES, PER_BYTE)) << shifts, axis=2)
    tl.store(codes_out + groups.to(tl.int64) * BYTES + byte_lanes, packed.to(tl.uint8), mask=live)
    tl.store(metadata + groups, scale, mask=live)
    tl.store(metadata + num_groups + groups, group_min, mask=live)


@triton.jit
def _round_to(values, dtype: tl.constexpr):
    """fp32 to ``dtype``, rounding to nearest even as torch does.

    Done by hand for bf16: the Triton interpreter truncates instead (compiled code
    rounds to nearest even either way, so this costs three integer ops there).
    """
    if dtype == tl.bfloat16:
        raw = values.to(tl.uint32, bitcast=True)
        raw = (raw + 0x7FFF + ((raw >> 16) & 1)) >> 16
        return raw.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return values.to(dtype)


@triton.jit
def _dequantize_kernel(
    blob_ptr, out_ptr, numel, num_groups,
    BITS: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr,
):
    PER_BYTE: tl.constexpr = 8 // BITS
    BYTES: tl.constexpr = GROUP * BITS // 8
    LEVELS: tl.constexpr = (1 << BITS) - 1
    metadata = blob_ptr.to(tl.pointer_type(tl.float32))
    codes_in = blob_ptr + 8 * num_groups
    rows = tl.arange(0, BLOCK)[:, None]
    lanes = tl.arange(0, GROUP)[None, :]
    shifts = (tl.arange(0, PER_BYTE) * BITS)[None, None, :]
    byte_lanes = tl.arange(0, BYTES)[None, :]
    groups = tl.program_id(0) * BLOCK + rows
    live = groups < num_groups
    scale = tl.load(metadata + groups, mask=live, other=1.0)
    group_min = tl.load(metadata + num_groups + groups, mask=live, other=0.0)
    packed = tl.load(codes_in + groups.to(tl.int64) * BYTES + byte_lanes, mask=live, other=0).to(tl.int32)
    codes = tl.reshape((packed[:, :, None] >> shifts) & LEVELS, (BLOCK, GROUP))
    values = codes.to(tl.float32) * scale
    values = values + group_min
    offsets = groups.to(tl.int64) * GROUP + lanes
    tl.store(out_ptr + offsets, _round_to(values, out_ptr.dtype.element_ty), mask=live & (offsets < numel))


def _grid(num_groups: int) -> tuple[int]:
    return (max(1, triton.cdiv(num_groups, GROUPS_PER_BLOCK)),)


def rounding_noise(groups: int, group_size: int, seed: int, device) -> torch.Tensor:
    """The ``(G, group_size)`` uniform noise ``quantize`` draws for ``seed`` (for tests)."""
    out = torch.empty(groups, group_size, device=device, dtype=torch.float32)
    _noise_kernel[_grid(groups)](out, groups, seed, GROUP=group_size, BLOCK=GROUPS_PER_BLOCK)
    return out


def quantize(flat: torch.Tensor, bits: int, group_size: int, seed: int) -> torch.Tensor:
    """Blob of a contiguous 1-D float tensor at ``bits`` in {1, 2, 4, 8}."""
    numel = flat.numel()
    groups = fmt.num_groups(numel, group_size)
    blob = torch.empty(fmt.float_blob_nbytes(numel, bits, group_size, flat.element_size()), dtype=torch.uint8, device=flat.device)
    blob[fmt.quantized_body_bytes(numel, bits, group_size) :] = 0  # padding and tag
    _quantize_kernel[_grid(groups)](
        flat, blob, numel, groups, seed, BITS=bits, GROUP=group_size, BLOCK=GROUPS_PER_BLOCK
    )
    return blob


def dequantize(blob: torch.Tensor, numel: int, dtype: torch.dtype, group_size: int) -> torch.Tensor:
    """Decode a quantized blob (``bits`` read from its length) into a 1-D tensor."""
    bits = fmt.bits_from_blob_nbytes(blob.numel())
    groups = fmt.num_groups(numel, group_size)
    out = torch.empty(numel, dtype=dtype, device=blob.device)
    _dequantize_kernel[_grid(groups)](
        blob, out, numel, groups, BITS=bits, GROUP=group_size, BLOCK=GROUPS_PER_BLOCK
    )
    return out
