"""Triton kernels for the packed format (``runtime.format``): quantize and dequantize.

Imported only when used (``runtime.kernels``): importing it imports Triton. The kernels
write and read exactly the blob of the torch reference (``runtime.reference``): the same
per-group fp32 scale word and min, the same special values, code packing and tail
padding, and the same rounding noise (``runtime.noise``, computed here in uint32
arithmetic), so a Triton blob equals the reference's bit for bit. The call's key is read
on the device, from the site's noise state or from an explicit key, never passed as a
host integer: a CUDA graph replays the launch with the counter's new value.

Each program handles ``BLOCK`` consecutive groups (``block_shape``), and the grid has one
program per block: no loop with run-time bounds, which the interpreter of Triton 3.6
(torch 2.11's) rejects, and which a memory-bound kernel does not need. A group's lanes
are a power of two (``tl.arange`` takes no other size); for a group size that is not one
(any multiple of 8 is allowed), the lanes past the group repeat its last element, which
changes no minimum, maximum or flag, and are never stored. Every launch goes through
``runtime.launches.launch``, so the compile check (``runtime.compile_check``) can compile
exactly what ran. Under ``TRITON_INTERPRET=1`` they run on CPU tensors (slowly): that is
how their semantics are tested without a GPU; compiled Triton accepts less than the
interpreter does (a module global must be a ``tl.constexpr``, for one), which only the
compile check shows.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from . import format as fmt
from .launches import launch
from .reference import SCALE_MAX as _SCALE_MAX

SCALE_MAX = tl.constexpr(_SCALE_MAX)  # a plain module float is a NameError in compiled Triton
ELEMENTS_PER_PROGRAM = 1024  # lanes per program, at least one group's


def block_shape(group_size: int) -> tuple[int, int, int]:
    """``(lanes per group, groups per program, warps)`` for a group size (a multiple of 8)."""
    lanes = triton.next_power_of_2(group_size)
    groups = max(1, ELEMENTS_PER_PROGRAM // lanes)
    warps = max(4, min(16, groups * lanes // 256))  # at most 16 elements a thread: no spills
    return lanes, groups, warps


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
def _group_offsets(GROUP: tl.constexpr, LANES: tl.constexpr, BLOCK: tl.constexpr):
    """``(groups [BLOCK, 1], offsets [BLOCK, LANES], lane_live [1, LANES])`` of this program;
    lanes past ``GROUP`` point at the group's last element."""
    lanes = tl.arange(0, LANES)[None, :]
    groups = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)[:, None]
    offsets = groups.to(tl.int64) * GROUP + tl.minimum(lanes, GROUP - 1)
    return groups, offsets, lanes < GROUP


@triton.jit
def _noise_kernel(out_ptr, num_groups, key_ptr, FROM_STATE: tl.constexpr, GROUP: tl.constexpr,
                  LANES: tl.constexpr, BLOCK: tl.constexpr):
    k0, k1 = _call_key(key_ptr, FROM_STATE)
    groups, offsets, lane_live = _group_offsets(GROUP, LANES, BLOCK)
    tl.store(out_ptr + offsets, _uniform(k0, k1, offsets), mask=(groups < num_groups) & lane_live)


@triton.jit
def _store_packed(row_ptr, codes, live, WIDTH: tl.constexpr, GROUP: tl.constexpr, LANES: tl.constexpr,
                  BLOCK: tl.constexpr):
    """Pack [BLOCK, LANES] codes of WIDTH in {1, 2, 4, 8} bits into the bytes at each row's
    pointer: the bytes of the group's first GROUP lanes."""
    PER_BYTE: tl.constexpr = 8 // WIDTH
    shifts = (tl.arange(0, PER_BYTE) * WIDTH)[None, None, :]
    packed = tl.sum(tl.reshape(codes, (BLOCK, LANES // PER_BYTE, PER_BYTE)) << shifts, axis=2)
    byte = tl.arange(0, LANES // PER_BYTE)[None, :]
    tl.store(row_ptr + byte, packed.to(tl.uint8), mask=live & (byte < GROUP // PER_BYTE))


@triton.jit
def _load_packed(row_ptr, live, WIDTH: tl.constexpr, GROUP: tl.constexpr, LANES: tl.constexpr,
                 BLOCK: tl.constexpr):
    """The [BLOCK, LANES] codes of WIDTH bits packed at each row's pointer (0 past GROUP)."""
    PER_BYTE: tl.constexpr = 8 // WIDTH
    shifts = (tl.arange(0, PER_BYTE) * WIDTH)[None, None, :]
    byte = tl.arange(0, LANES // PER_BYTE)[None, :]
    packed = tl.load(row_ptr + byte, mask=live & (byte < GROUP // PER_BYTE), other=0).to(tl.int32)
    return tl.reshape((packed[:, :, None] >> shifts) & ((1 << WIDTH) - 1), (BLOCK, LANES))


@triton.jit
def _quantize_kernel(
    x_ptr, blob_ptr, numel, num_groups, key_ptr, dtype_max,
    FROM_STATE: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, LANES: tl.constexpr, BLOCK: tl.constexpr,
):
    BYTES: tl.constexpr = GROUP * BITS // 8
    LEVELS: tl.constexpr = (1 << BITS) - 1
    k0, k1 = _call_key(key_ptr, FROM_STATE)
    words = blob_ptr.to(tl.pointer_type(tl.float32))
    codes_out = blob_ptr + 8 * num_groups
    groups, offsets, _ = _group_offsets(GROUP, LANES, BLOCK)
    live = groups < num_groups
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
    row = codes_out + groups.to(tl.int64) * BYTES
    if BITS == 3:  # two planes (runtime.format): the low two bits, then the high bit
        _store_packed(row, codes & 3, live, 2, GROUP, LANES, BLOCK)
        _store_packed(row + GROUP // 4, codes >> 2, live, 1, GROUP, LANES, BLOCK)
    else:
        _store_packed(row, codes, live, BITS, GROUP, LANES, BLOCK)
    tl.store(words + groups, word, mask=live)
    tl.store(words + num_groups + groups, group_min, mask=live)


@triton.jit
def _round_to(values, dtype: tl.constexpr):
    """fp32 to ``dtype``, rounding to nearest even as torch does, NaN kept NaN.

    Done by hand for bf16: the Triton interpreter truncates instead (compiled code
    rounds to nearest even either way). The rounding carry would turn a NaN whose
    mantissa is all ones (0x7FFFFFFF, what NVIDIA arithmetic returns for a NaN operand)
    into -0.0, so NaN takes the canonical bf16 NaN.
    """
    if dtype == tl.bfloat16:
        raw = values.to(tl.uint32, bitcast=True)
        raw = (raw + 0x7FFF + ((raw >> 16) & 1)) >> 16
        raw = tl.where(values != values, 0x7FC0, raw)
        return raw.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return values.to(dtype)


@triton.jit
def _dequantize_kernel(
    blob_ptr, out_ptr, numel, num_groups, dtype_max,
    BITS: tl.constexpr, GROUP: tl.constexpr, LANES: tl.constexpr, BLOCK: tl.constexpr,
):
    BYTES: tl.constexpr = GROUP * BITS // 8
    LEVELS: tl.constexpr = (1 << BITS) - 1
    words = blob_ptr.to(tl.pointer_type(tl.float32))
    codes_in = blob_ptr + 8 * num_groups
    groups, offsets, lane_live = _group_offsets(GROUP, LANES, BLOCK)
    live = groups < num_groups
    word = tl.load(words + groups, mask=live, other=1.0)
    group_min = tl.load(words + num_groups + groups, mask=live, other=0.0)
    row = codes_in + groups.to(tl.int64) * BYTES
    if BITS == 3:
        low = _load_packed(row, live, 2, GROUP, LANES, BLOCK)
        codes = low | (_load_packed(row + GROUP // 4, live, 1, GROUP, LANES, BLOCK) << 2)
    else:
        codes = _load_packed(row, live, BITS, GROUP, LANES, BLOCK)
    scale = tl.abs(word)
    values = codes.to(tl.float32) * scale
    values = values + group_min
    kind = scale.to(tl.int32, bitcast=True) & 3
    extreme = tl.where(kind >= 2, dtype_max, float("inf"))
    special_value = tl.where((kind & 1) == 1, extreme, -extreme)
    values = tl.where((word < 0) & (codes == LEVELS), special_value, values)
    tl.store(out_ptr + offsets, _round_to(values, out_ptr.dtype.element_ty), mask=live & lane_live & (offsets < numel))


def _grid(num_groups: int, groups_per_program: int) -> tuple[int]:
    return (max(1, triton.cdiv(num_groups, groups_per_program)),)


def _key_source(state: torch.Tensor | None, key: torch.Tensor | None) -> tuple[torch.Tensor, bool]:
    if (state is None) == (key is None):
        raise ValueError("give the site's noise state or an explicit key, not both")
    return (state, True) if state is not None else (key, False)


def _on_device(tensor: torch.Tensor):
    """Launch on ``tensor``'s GPU, which need not be the current one (Triton launches on the current)."""
    if tensor.is_cuda and tensor.device.index != torch.cuda.current_device():
        return torch.cuda.device(tensor.device)
    return contextlib.nullcontext()


def rounding_noise(groups: int, group_size: int, *, state=None, key=None) -> torch.Tensor:
    """The ``(G, group_size)`` noise ``quantize`` draws for a state or key (for tests)."""
    fmt.check_group_size(group_size)
    source, from_state = _key_source(state, key)
    out = torch.empty(groups, group_size, device=source.device, dtype=torch.float32)
    lanes, block, warps = block_shape(group_size)
    with _on_device(out):
        launch(_noise_kernel, _grid(groups, block), {"out_ptr": out, "num_groups": groups, "key_ptr": source},
               {"FROM_STATE": from_state, "GROUP": group_size, "LANES": lanes, "BLOCK": block}, num_warps=warps)
    return out


def quantize(flat: torch.Tensor, bits: int, group_size: int, *, state=None, key=None) -> torch.Tensor:
    """Blob of a contiguous 1-D float tensor at ``bits`` in {1, 2, 3, 4, 8}."""
    fmt.check_group_size(group_size)
    source, from_state = _key_source(state, key)
    numel = flat.numel()
    groups = fmt.num_groups(numel, group_size)
    blob = torch.empty(fmt.float_blob_nbytes(numel, bits, group_size, flat.element_size()), dtype=torch.uint8, device=flat.device)
    blob[fmt.quantized_body_bytes(numel, bits, group_size) :] = 0  # padding and tag
    lanes, block, warps = block_shape(group_size)
    with _on_device(flat):
        launch(
            _quantize_kernel, _grid(groups, block),
            {"x_ptr": flat, "blob_ptr": blob, "numel": numel, "num_groups": groups, "key_ptr": source,
             "dtype_max": float(torch.finfo(flat.dtype).max)},
            {"FROM_STATE": from_state, "BITS": bits, "GROUP": group_size, "LANES": lanes, "BLOCK": block},
            num_warps=warps,
        )
    return blob


def dequantize(blob: torch.Tensor, numel: int, dtype: torch.dtype, group_size: int) -> torch.Tensor:
    """Decode a quantized blob (``bits`` read from its length) into a 1-D tensor."""
    fmt.check_group_size(group_size)
    bits = fmt.bits_from_blob_nbytes(blob.numel())
    groups = fmt.num_groups(numel, group_size)
    out = torch.empty(numel, dtype=dtype, device=blob.device)
    lanes, block, warps = block_shape(group_size)
    with _on_device(blob):
        launch(
            _dequantize_kernel, _grid(groups, block),
            {"blob_ptr": blob, "out_ptr": out, "numel": numel, "num_groups": groups,
             "dtype_max": float(torch.finfo(dtype).max)},
            {"BITS": bits, "GROUP": group_size, "LANES": lanes, "BLOCK": block},
            num_warps=warps,
        )
    return out
