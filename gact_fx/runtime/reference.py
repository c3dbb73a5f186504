"""Torch reference implementation of the packed format: a CPU path and the test oracle.

Plain tensor code that runs on any device. It works on a 1-D tensor already taken in
logical order (``runtime.ops`` does the permuting); the rounding noise is an explicit
argument (``runtime.noise`` draws it), so the other implementations (the Triton and CPU
kernels, the aten lowering) can be checked bit for bit against it. The format itself,
special values included, is described in ``runtime.format``.

``encode_groups`` / ``decode_groups`` hold the float codec with no Python branch on a
size, so they also trace into graphs under dynamic shapes (``runtime.aten_codec``).
"""

from __future__ import annotations

import torch

from . import format as fmt
from .noise import rounding_noise

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Half ranges stay below this bfloat16 (half of it where the top code is 1): rounding a
# flagged one up to a multiple of 4 ulps (to make room for the special kind) stays finite,
# and so does its scale.
HALF_MAX = torch.tensor(fmt.HALF_MAX_BITS, dtype=torch.int32).view(torch.float32).item()
_KIND_MASK = 3
_DROPPED = 0xFFFF  # the low bits of a float32 that its bfloat16 leaves out
_NEGATIVE_INFINITY = -0x800000  # the int32 bits of -inf
_LOWEST = -0x810000  # the int32 bits of -finfo(bfloat16).max


def bfloat16_floor(x: torch.Tensor) -> torch.Tensor:
    """The largest bfloat16 at or below each float32 of ``x``, as float32; NaN becomes the
    canonical NaN, and what would round to -inf stays at bfloat16's lowest finite value."""
    raw = x.view(torch.int32)
    kept = raw & ~_DROPPED
    down = torch.where(((raw & _DROPPED) != 0) & (raw < 0), kept + 0x10000, kept)  # negative: away from zero
    down = torch.where(down == _NEGATIVE_INFINITY, torch.full_like(down, _LOWEST), down)
    return torch.where(torch.isnan(x), torch.full_like(x, float("nan")), down.view(torch.float32))


def bfloat16_ceil(x: torch.Tensor) -> torch.Tensor:
    """The smallest bfloat16 at or above each positive finite float32 of ``x``, as float32."""
    raw = x.view(torch.int32)
    kept = raw & ~_DROPPED
    return torch.where((raw & _DROPPED) != 0, kept + 0x10000, kept).view(torch.float32)


def pack_group_words(word: torch.Tensor, group_min: torch.Tensor) -> torch.Tensor:
    """Each group's 4 bytes (``runtime.format``): its half-range word's bfloat16, then its
    min's; both float32 values that are bfloat16s."""
    halves = torch.stack([word.view(torch.int32) >> 16, group_min.view(torch.int32) >> 16], dim=1)
    return halves.to(torch.int16).view(torch.uint8).reshape(-1)


def unpack_group_words(words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of ``pack_group_words``: float32 half-range words and mins."""
    halves = words.view(torch.int16).view(-1, 2).to(torch.int32) << 16
    return halves[:, 0].contiguous().view(torch.float32), halves[:, 1].contiguous().view(torch.float32)


def group_view(flat: torch.Tensor, group_size: int) -> torch.Tensor:
    """fp32 ``(G, group_size)`` view of ``flat``, the tail padded with its last element."""
    values = flat.float()
    padding = fmt.num_groups(flat.numel(), group_size) * group_size - flat.numel()
    values = torch.cat([values, values[-1:].expand(padding)])  # no branch: traceable
    return values.view(-1, group_size)


def special_kinds(groups: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Which elements are special (±inf, ±finfo(dtype).max) and their kind (0..3)."""
    infinite = torch.isinf(groups)
    special = infinite | (groups.abs() == torch.finfo(dtype).max)
    kind = (groups > 0).to(torch.int32) + 2 * (~infinite).to(torch.int32)
    return special, kind


def special_value(kind: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The value of each special kind (float32, exact in ``dtype``); no tensor constant, so traceable."""
    extreme = torch.where(kind >= 2, torch.finfo(dtype).max, float("inf"))
    return torch.where((kind & 1) == 1, extreme, -extreme)


def scale_of(half: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """The step between codes: the half range times ``2 / top`` rounded once (a constant per
    width: a multiply, not a division, per group)."""
    return half * (2.0 / top.clamp(min=1).to(torch.float32))


def group_parameters(groups: torch.Tensor, bits: int, dtype: torch.dtype):
    """Per group: the half-range word to store, the scale codes use, the min, the top normal
    code, and the special mask and poison flag; see ``runtime.format``."""
    levels = 2**bits - 1
    special, kind = special_kinds(groups, dtype)
    flagged = special.any(dim=1)
    only_special = special.all(dim=1)
    inf = torch.full_like(groups, float("inf"))
    group_min = torch.where(special, inf, groups).amin(dim=1)  # NaN propagates: it poisons
    group_max = torch.where(special, -inf, groups).amax(dim=1)
    group_min = torch.where(only_special, torch.zeros_like(group_min), group_min)
    group_max = torch.where(only_special, torch.zeros_like(group_max), group_max)
    group_min = bfloat16_floor(group_min)  # stored as bfloat16: rounded down, so it still bounds the group
    kind_low = torch.where(special, kind, torch.full_like(kind, 4)).amin(dim=1)
    kind_high = torch.where(special, kind, torch.full_like(kind, -1)).amax(dim=1)
    top = levels - flagged.to(torch.int32)  # flagged groups keep code L for the special value
    # Halving first keeps max - min finite for any finite inputs; up: it still covers the range.
    half_max = torch.where(top <= 1, HALF_MAX * 0.5, HALF_MAX)
    half = bfloat16_ceil(torch.minimum(group_max * 0.5 - group_min * 0.5, half_max))
    raw = half.view(torch.int32)
    kind_bits = _KIND_MASK << 16
    rounded = ((raw + kind_bits) & ~(kind_bits | _DROPPED)) | (kind_low.clamp(0, _KIND_MASK) << 16)
    half = torch.where(flagged, rounded.view(torch.float32), half)
    scale = scale_of(half, top)
    used = torch.where(scale > 0, scale, torch.ones_like(scale))
    poison = (
        torch.isnan(group_min) | torch.isnan(group_max) | (flagged & (kind_low != kind_high))
        | (flagged & (top == 0) & (group_max > group_min))
    )
    word = torch.where(flagged, -half, half)
    word = torch.where(poison, torch.full_like(word, float("nan")), word)
    return word, used, group_min, top, special, poison


def quantize_codes(groups, used, group_min, top, special, poison, bits: int, noise) -> torch.Tensor:
    """Stochastically rounded integer codes, ``(G, group_size)`` uint8.

    Each element is multiplied by its group's reciprocal, ``1 / (used / 2)`` rounded once,
    instead of divided: a division per element is most of a GPU quantize's instructions.
    Every implementation computes the same three roundings, so the blobs agree bit for bit."""
    inverse = 1.0 / (used * 0.5)
    normalized = (groups * 0.5 - group_min[:, None] * 0.5) * inverse[:, None]
    codes = torch.floor(normalized + noise)
    codes = torch.minimum(codes.clamp(min=0), top[:, None].to(codes.dtype))  # functional: traced into graphs
    codes = torch.where(special, torch.full_like(codes, 2**bits - 1), codes)
    codes = torch.where(poison[:, None], torch.zeros_like(codes), codes)
    return torch.nan_to_num(codes, nan=0.0).to(torch.uint8)


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``(G, group_size)`` codes of ``bits`` in {1, 2, 4, 8} each into a flat uint8 tensor."""
    if 8 % bits:
        raise ValueError(f"pack_codes packs widths that divide a byte, not {bits}; pack_group_codes lays out 3 bits")
    if bits == 8:
        return codes.reshape(-1)
    per_byte = 8 // bits
    shifts = torch.arange(per_byte, device=codes.device, dtype=torch.int32) * bits
    lanes = codes.reshape(-1, per_byte).to(torch.int32) << shifts
    return lanes.sum(dim=1).to(torch.uint8)


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of ``pack_codes``: flat uint8 bytes to a flat tensor of codes."""
    if bits == 8:
        return packed
    per_byte = 8 // bits
    shifts = torch.arange(per_byte, device=packed.device, dtype=torch.int32) * bits
    lanes = (packed.to(torch.int32)[:, None] >> shifts) & (2**bits - 1)
    return lanes.reshape(-1).to(torch.uint8)


def pack_group_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``(G, group_size)`` codes group by group; at 3 bits each group is its low-two-bit
    plane then its high-bit plane (``runtime.format``)."""
    if bits != fmt.PLANE_BITS:
        return pack_codes(codes, bits)
    low = pack_codes(codes & 3, 2).view(codes.shape[0], -1)
    high = pack_codes(codes >> 2, 1).view(codes.shape[0], -1)
    return torch.cat([low, high], dim=1).reshape(-1)


def unpack_group_codes(packed: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """Inverse of ``pack_group_codes``: ``(G, group_size)`` codes."""
    if bits != fmt.PLANE_BITS:
        return unpack_codes(packed, bits).view(-1, group_size)
    planes = packed.view(-1, group_size * 3 // 8)
    low = unpack_codes(planes[:, : group_size // 4].reshape(-1), 2).view(-1, group_size)
    high = unpack_codes(planes[:, group_size // 4 :].reshape(-1), 1).view(-1, group_size)
    return low | (high << 2)


_KEY_SHIFTS = (0, 8, 16, 24)


def key_bytes(key: torch.Tensor) -> torch.Tensor:
    """A call key ``[k0, k1]`` (int64 holding uint32s) as its 8 little-endian bytes."""
    shifts = torch.tensor(_KEY_SHIFTS, dtype=torch.int64, device=key.device)
    return ((key[:, None] >> shifts) & 0xFF).to(torch.uint8).reshape(-1)


def key_from_bytes(raw: torch.Tensor) -> torch.Tensor:
    """Inverse of ``key_bytes``."""
    shifts = torch.tensor(_KEY_SHIFTS, dtype=torch.int64, device=raw.device)
    return (raw.view(2, 4).to(torch.int64) << shifts).sum(dim=1)


def encode_groups(flat: torch.Tensor, bits: int, group_size: int, noise: torch.Tensor,
                  key: torch.Tensor | None = None) -> torch.Tensor:
    """Blob of a non-empty 1-D float tensor at ``bits`` in {1, 2, 3, 4, 8}; branch-free. With
    ``key`` (the one ``noise`` was drawn from) the blob is a dithered one that keeps it."""
    groups = group_view(flat, group_size)
    word, used, group_min, top, special, poison = group_parameters(groups, bits, flat.dtype)
    codes = quantize_codes(groups, used, group_min, top, special, poison, bits, noise)
    body = torch.cat([pack_group_words(word, group_min), pack_group_codes(codes, bits)])
    numel = flat.numel()
    total = fmt.float_blob_nbytes(numel, bits, group_size, flat.element_size(), dithered=key is not None)
    if key is None:
        return torch.cat([body, body.new_zeros(total - body.numel())])  # padding and tag
    padding = body.new_zeros(fmt.key_offset(numel, bits, group_size) - body.numel())
    return torch.cat([body, padding, key_bytes(key), body.new_zeros(fmt.tag_bytes(bits))])


def decode_groups(blob: torch.Tensor, numel, dtype: torch.dtype, group_size: int, bits: int,
                  dithered: bool = False) -> torch.Tensor:
    """Inverse of ``encode_groups``; branch-free. A ``dithered`` blob's noise is drawn again
    from its key and subtracted (``runtime.format``)."""
    groups = fmt.num_groups(numel, group_size)
    word, group_min = unpack_group_words(blob[: groups * fmt.METADATA_BYTES_PER_GROUP])
    start = groups * fmt.METADATA_BYTES_PER_GROUP
    codes = unpack_group_codes(blob[start : start + groups * (group_size * bits // 8)], bits, group_size)
    flagged = torch.signbit(word)  # a flagged half range of 0 is -0.0
    half = word.abs()
    scale = scale_of(half, 2**bits - 1 - flagged.to(torch.int32))
    if dithered:
        start = fmt.key_offset(numel, bits, group_size)
        noise = rounding_noise(groups, group_size, key_from_bytes(blob[start : start + fmt.KEY_BYTES]))
        values = ((codes.float() + 0.5) - noise) * scale[:, None] + group_min[:, None]
    else:
        values = codes.float() * scale[:, None] + group_min[:, None]
    kind = (half.view(torch.int32) >> 16) & _KIND_MASK
    special = flagged[:, None] & (codes == 2**bits - 1)
    values = torch.where(special, special_value(kind, dtype)[:, None], values)
    return values.reshape(-1)[:numel].to(dtype)


def quantize_reference(
    flat: torch.Tensor, bits: int, group_size: int, noise: torch.Tensor | None, key: torch.Tensor | None = None
) -> torch.Tensor:
    """Encode a 1-D tensor into a blob. ``noise`` is ``(G, group_size)`` in [0, 1); with
    ``key``, the key it was drawn from, a float tensor below 32 bits gets a dithered blob."""
    numel = flat.numel()
    if flat.dtype == torch.bool:
        codes = torch.cat([flat.to(torch.uint8), flat.new_zeros((numel + 7) // 8 * 8 - numel, dtype=torch.uint8)])
        packed = pack_codes(codes, 1)
        return torch.cat([packed, packed.new_zeros(fmt.bool_blob_nbytes(numel) - packed.numel())])
    if flat.dtype not in FLOAT_DTYPES:
        raise TypeError(f"gact quantize takes {FLOAT_DTYPES} or bool, got {flat.dtype}")
    if bits == fmt.PASS_THROUGH_BITS or numel == 0:
        raw = flat.contiguous().view(torch.uint8).reshape(-1)
        total = fmt.float_blob_nbytes(numel, bits, group_size, flat.element_size())
        return torch.cat([raw, raw.new_zeros(total - raw.numel())])
    return encode_groups(flat, bits, group_size, noise, key)


def decode_bool(blob: torch.Tensor, numel) -> torch.Tensor:
    return unpack_codes(blob[: (numel + 7) // 8], 1)[:numel].to(torch.bool)


def decode_raw(blob: torch.Tensor, numel, dtype: torch.dtype) -> torch.Tensor:
    """The 32-bit pass-through: the tensor's own bytes."""
    return blob[: numel * dtype.itemsize].view(dtype).clone()


def dequantize_reference(
    blob: torch.Tensor, numel: int, dtype: torch.dtype, group_size: int, dithered: bool = False
) -> torch.Tensor:
    """Decode a blob back to a 1-D tensor of ``numel`` elements of ``dtype`` (a ``dithered``
    blob: see ``decode_groups``)."""
    bits = fmt.bits_from_blob_nbytes(blob.numel())
    if dtype == torch.bool:
        return decode_bool(blob, numel)
    if bits == fmt.PASS_THROUGH_BITS or numel == 0:
        return decode_raw(blob, numel, dtype)
    return decode_groups(blob, numel, dtype, group_size, bits, dithered)
