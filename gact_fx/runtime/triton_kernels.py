"""Triton kernels for the packed format (``runtime.format``): quantize and dequantize.

Imported only when used (``runtime.kernels``): importing it imports Triton. The kernels
write and read exactly the blob of the torch reference (``runtime.reference``): the same
per-group fp32 scale word and min, the same special values, code packing and tail
padding, and the same rounding noise (``runtime.noise``, computed here in uint32
arithmetic), so a Triton blob equals the reference's bit for bit. The call's key is read
on the device, from the site's noise state or from an explicit key, never passed as a
host integer: a CUDA graph replays the launch with the counter's new value.

Each program handles ``GROUPS_PER_BLOCK`` consecutive groups, and the grid has one
program per block: no loop with run-time bounds, which the interpreter of Triton 3.6
(torch 2.11's) rejects, and which a memory-bound kernel does not need. Under
``TRITON_INTERPRET=1`` they run on CPU tensors (slowly): that is how they are tested
without a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import format as fmt
from .reference import SCALE_MAX

GROUPS_PER_BLOCK = 4


@triton.jit
def _fmix32(h):
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _call_key(key_ptr, FROM_STATE: tl.constexpr):
    """``(k0, k1)`` as uint32: from a site's ``[slot_key, count]`` state, or a given key."""
    k0 = (tl.load(key_ptr) & 0xFFFFFFFF).to(tl.uint32)
    second = (tl.load(key_ptr + 1) & 0xFFFFFFFF).to(tl.uint32)
    if FROM_STATE:
        k1 = _fmix32((second * 0x9E3779B1) ^ k0)
    else:
        k1 = second
    return k0, k1


@triton.jit
def _uniform(k0, k1, offsets):
    """``runtime.noise.uniform``: one hash per pair of elements i, i + 8, 16 bits each."""
    pair = (offsets >> 4) * 8 + (offsets & 7)
    low = (pair & 0xFFFFFFFF).to(tl.uint32)
    high = (pair >> 32).to(tl.uint32)
    h = _fmix32((low * 0x9E3779B1) ^ k1 ^ (k0 * 0xC2B2AE35) ^ (high * 0x85EBCA6B))
    half = (h >> ((offsets & 8) * 2).to(tl.uint32)) & 0xFFFF
    return (half * 2 + 1).to(tl.float32) * (1.0 / 131072.0)


@triton.jit
def _noise_kernel(out_ptr, num_groups, key_ptr, FROM_STATE: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr):
    k0, k1 = _call_key(key_ptr, FROM_STATE)
    groups = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)[:, None]
    offsets = groups.to(tl.int64) * GROUP + tl.arange(0, GROUP)[None, :]
    tl.store(out_ptr + offsets, _uniform(k0, k1, offsets), mask=groups < num_groups)


@triton.jit
def _store_packed(row_ptr, codes, live, WIDTH: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr):
    """Pack [BLOCK, GROUP] codes of WIDTH in {1, 2, 4, 8} bits into the bytes at each row's pointer."""
    PER_BYTE: tl.constexpr = 8 // WIDTH
    BYTES: tl.constexpr = GROUP * WIDTH // 8
    shifts = (tl.arange(0, PER_BYTE) * WIDTH)[None, None, :]
    packed = tl.sum(tl.reshape(codes, (BLOCK, BYTES, PER_BYTE)) << shifts, axis=2)
    tl.store(row_ptr + tl.arange(0, BYTES)[None, :], packed.to(tl.uint8), mask=live)


@triton.jit
def _load_packed(row_ptr, live, WIDTH: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr):
    """The [BLOCK, GROUP] codes of WIDTH bits packed at each row's pointer."""
    PER_BYTE: tl.constexpr = 8 // WIDTH
    BYTES: tl.constexpr = GROUP * WIDTH // 8
    shifts = (tl.arange(0, PER_BYTE) * WIDTH)[None, None, :]
    packed = tl.load(row_ptr + tl.arange(0, BYTES)[None, :], mask=live, other=0).to(tl.int32)
    return tl.reshape((packed[:, :, None] >> shifts) & ((1 << WIDTH) - 1), (BLOCK, GROUP))


@triton.jit
def _quantize_kernel(
    x_ptr, blob_ptr, numel, num_groups, key_ptr, dtype_max,
    FROM_STATE: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr,
):
    BYTES: tl.constexpr = GROUP * BITS // 8
    LEVELS: tl.constexpr = (1 << BITS) - 1
    k0, k1 = _call_key(key_ptr, FROM_STATE)
    words = blob_ptr.to(tl.pointer_type(tl.float32))
    codes_out = blob_ptr + 8 * num_groups
    rows = tl.arange(0, BLOCK)[:, None]
    lanes = tl.arange(0, GROUP)[None, :]
    groups = tl.program_id(0) * BLOCK + rows  # [BLOCK, 1]
    live = groups < num_groups
    offsets = groups.to(tl.int64) * GROUP + lanes
    inside = offsets < numel
    last = tl.load(x_ptr + numel - 1).to(tl.float32)
    x = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    x = tl.where(inside, x, last)  # the tail group repeats the last element

    magnitude = tl.abs(x)
    infinite = magnitude == float("inf")
    special = infinite | (magnitude == dtype_max)
    kind = (x > 0).to(tl.int32) + 2 * (1 - infinite.to(tl.int32))
    flagged = tl.max(special.to(tl.int32), axis=1)[:, None] == 1
    only_special = tl.min(special.to(tl.int32), axis=1)[:, None] == 1
    has_nan = tl.max((x != x).to(tl.int32), axis=1)[:, None] == 1
    group_min = tl.min(tl.where(special, float("inf"), x), axis=1)[:, None]
    group_max = tl.max(tl.where(special, float("-inf"), x), axis=1)[:, None]
    group_min = tl.where(only_special, 0.0, group_min)
    group_max = tl.where(only_special, 0.0, group_max)
    group_min = tl.where(has_nan, float("nan"), group_min)  # torch.amin propagates NaN
    kind_low = tl.min(tl.where(special, kind, 4), axis=1)[:, None]
    kind_high = tl.max(tl.where(special, kind, -1), axis=1)[:, None]
    top = LEVELS - flagged.to(tl.int32)
    half_range = group_max * 0.5 - group_min * 0.5
    # div_rn: IEEE division, as torch divides (a plain ``/`` may compile to an approximate one)
    scale = tl.minimum(tl.math.div_rn(half_range, tl.maximum(top, 1).to(tl.float32) * 0.5), SCALE_MAX)
    scale = tl.where(scale > 0, scale, 1.0)
    raw = scale.to(tl.int32, bitcast=True)
    rounded = ((raw + 3) & -4) | tl.minimum(tl.maximum(kind_low, 0), 3)
    used = tl.where(flagged, rounded.to(tl.float32, bitcast=True), scale)
    poison = has_nan | (flagged & (kind_low != kind_high)) | (flagged & (top == 0) & (group_max > group_min))
    word = tl.where(flagged, -used, used)
    word = tl.where(poison, float("nan"), word)

    normalized = tl.math.div_rn(x * 0.5 - group_min * 0.5, used * 0.5)
    codes = tl.floor(normalized + _uniform(k0, k1, offsets))
    codes = tl.minimum(tl.maximum(codes, 0.0), top.to(tl.float32))
    codes = tl.where(special, LEVELS, codes)
    codes = tl.where(poison | (codes != codes), 0.0, codes).to(tl.int32)
    if BITS == 3:  # two planes (runtime.format): the low two bits, then the high bit
        _store_packed(codes_out + groups.to(tl.int64) * BYTES, codes & 3, live, 2, GROUP, BLOCK)
        _store_packed(codes_out + groups.to(tl.int64) * BYTES + GROUP // 4, codes >> 2, live, 1, GROUP, BLOCK)
    else:
        _store_packed(codes_out + groups.to(tl.int64) * BYTES, codes, live, BITS, GROUP, BLOCK)
    tl.store(words + groups, word, mask=live)
    tl.store(words + num_groups + groups, group_min, mask=live)


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
    blob_ptr, out_ptr, numel, num_groups, dtype_max,
    BITS: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr,
):
    BYTES: tl.constexpr = GROUP * BITS // 8
    LEVELS: tl.constexpr = (1 << BITS) - 1
    words = blob_ptr.to(tl.pointer_type(tl.float32))
    codes_in = blob_ptr + 8 * num_groups
    rows = tl.arange(0, BLOCK)[:, None]
    lanes = tl.arange(0, GROUP)[None, :]
    groups = tl.program_id(0) * BLOCK + rows
    live = groups < num_groups
    word = tl.load(words + groups, mask=live, other=1.0)
    group_min = tl.load(words + num_groups + groups, mask=live, other=0.0)
    if BITS == 3:
        low = _load_packed(codes_in + groups.to(tl.int64) * BYTES, live, 2, GROUP, BLOCK)
        codes = low | (_load_packed(codes_in + groups.to(tl.int64) * BYTES + GROUP // 4, live, 1, GROUP, BLOCK) << 2)
    else:
        codes = _load_packed(codes_in + groups.to(tl.int64) * BYTES, live, BITS, GROUP, BLOCK)
    scale = tl.abs(word)
    values = codes.to(tl.float32) * scale
    values = values + group_min
    kind = scale.to(tl.int32, bitcast=True) & 3
    extreme = tl.where(kind >= 2, dtype_max, float("inf"))
    special_value = tl.where((kind & 1) == 1, extreme, -extreme)
    values = tl.where((word < 0) & (codes == LEVELS), special_value, values)
    offsets = groups.to(tl.int64) * GROUP + lanes
    tl.store(out_ptr + offsets, _round_to(values, out_ptr.dtype.element_ty), mask=live & (offsets < numel))


def _grid(num_groups: int) -> tuple[int]:
    return (max(1, triton.cdiv(num_groups, GROUPS_PER_BLOCK)),)


def _key_source(state: torch.Tensor | None, key: torch.Tensor | None) -> tuple[torch.Tensor, bool]:
    if (state is None) == (key is None):
        raise ValueError("give the site's noise state or an explicit key, not both")
    return (state, True) if state is not None else (key, False)


def rounding_noise(groups: int, group_size: int, *, state=None, key=None) -> torch.Tensor:
    """The ``(G, group_size)`` noise ``quantize`` draws for a state or key (for tests)."""
    source, from_state = _key_source(state, key)
    out = torch.empty(groups, group_size, device=source.device, dtype=torch.float32)
    _noise_kernel[_grid(groups)](out, groups, source, FROM_STATE=from_state, GROUP=group_size, BLOCK=GROUPS_PER_BLOCK)
    return out


def quantize(flat: torch.Tensor, bits: int, group_size: int, *, state=None, key=None) -> torch.Tensor:
    """Blob of a contiguous 1-D float tensor at ``bits`` in {1, 2, 3, 4, 8}."""
    source, from_state = _key_source(state, key)
    numel = flat.numel()
    groups = fmt.num_groups(numel, group_size)
    blob = torch.empty(fmt.float_blob_nbytes(numel, bits, group_size, flat.element_size()), dtype=torch.uint8, device=flat.device)
    blob[fmt.quantized_body_bytes(numel, bits, group_size) :] = 0  # padding and tag
    _quantize_kernel[_grid(groups)](
        flat, blob, numel, groups, source, float(torch.finfo(flat.dtype).max),
        FROM_STATE=from_state, BITS=bits, GROUP=group_size, BLOCK=GROUPS_PER_BLOCK,
    )
    return blob


def dequantize(blob: torch.Tensor, numel: int, dtype: torch.dtype, group_size: int) -> torch.Tensor:
    """Decode a quantized blob (``bits`` read from its length) into a 1-D tensor."""
    bits = fmt.bits_from_blob_nbytes(blob.numel())
    groups = fmt.num_groups(numel, group_size)
    out = torch.empty(numel, dtype=dtype, device=blob.device)
    _dequantize_kernel[_grid(groups)](
        blob, out, numel, groups, float(torch.finfo(dtype).max), BITS=bits, GROUP=group_size, BLOCK=GROUPS_PER_BLOCK
    )
    return out
