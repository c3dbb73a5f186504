"""The packed blob format: its byte layout and size arithmetic (no torch kernels here).

Every compressed activation is stored as ONE flat ``torch.uint8`` tensor, the *blob*.
One blob per activation (rather than codes + scales + mins as separate tensors) keeps
the number of saved tensors fixed and avoids size-0/1 specialisation under dynamic
shapes.

Layout, for an activation of ``N`` elements taken in the logical order of its
permutation (see ``runtime.ops``):

* floating point (fp32 / fp16 / bf16), ``bits`` in {1, 2, 3, 4, 8}::

      G = ceil(N / group_size)
      [ (half range, min) : G x 2 bfloat16 ][ codes : G*group_size*bits/8 bytes ]
      [ zero padding to a multiple of 8 bytes ][ call key: 8 bytes, dithered blobs only ]
      [ probe token: 8 bytes, probe blobs only ][ tag : tag_bytes(bits) bytes ]

  With ``L = 2**bits - 1``, element ``i`` of group ``g`` decodes as ``min[g] + code *
  scale[g]``, where ``scale = half * (2 / top)``. Codes are packed little-endian inside
  each byte: element ``k`` of a byte sits at bit ``(k * bits) % 8``. At 3 bits a group's
  ``3 * group_size / 8`` bytes are two planes, packed as above: the low two bits of its
  codes (``group_size / 4`` bytes), then their high bit (``group_size / 8`` bytes); so
  every width packs whole bytes with the 1/2/4/8-bit packers, and 3 bits exist because
  rounding variance falls by ``(3/7)^2 = 0.18x`` from 2 to 3 bits, where mixing 2 and 4
  bits for the same bytes gives only 0.52x. The last group is padded with copies of the last
  element. Codes come from stochastic rounding, ``floor((x - min) / scale + u)`` with
  ``u`` from ``runtime.noise``, so ``E[decode] == x``; a constant group stores ``half =
  0`` and codes 0. A group stores its min and half its range as bfloat16s whatever the
  input dtype: float32's exponent range, so fp16 ranges cannot overflow, in half of
  float32's bytes (at groups of 256, 1/8 bit an element instead of 1/4). The min is
  rounded down and the half range up, so the stored range still covers the group and
  rounding stays unbiased; where both are bfloat16s already (a group from -1 to 1, from
  0 to 1) its ends decode exactly. A group whose values sit far from zero against their
  spread (``|min|`` hundreds of times the range) pays a wider range. In float32
  arithmetic, rounded as written (every implementation does the same operations, so their
  blobs agree bit for bit; ``runtime.reference``)::

      min    = the largest bfloat16 <= the group's min (at least -finfo(bfloat16).max)
      half   = the smallest bfloat16 >= min(max * 0.5 - min * 0.5, HALF_MAX, or HALF_MAX / 2 where top <= 1)
      scale  = half * (2 / top), or 1 to encode where that is not > 0
      code   = floor((x * 0.5 - min * 0.5) * (1 / (scale * 0.5)) + u), clamped to 0..top

  with ``2 / top`` and ``1 / (scale * 0.5)`` each rounded once, per group: no division per
  element.

  *Dithered rounding* (``rounding="dithered"``, subtractive dither): the codes are the same,
  and the blob keeps its call's noise key ``(k0, k1)`` as two little-endian uint32s at
  ``key_offset``. The decoder draws the same ``u`` again and subtracts it::

      value = ((code + 0.5) - u) * scale + min

  The error is then uniform over one step whatever the value, so ``E[decode] == x`` still
  holds. Its variance is ``scale**2 / 12``; stochastic rounding's is ``p (1 - p) scale**2``
  (``p`` the fractional part), ``scale**2 / 6`` on average: half the variance for 8 bytes
  a tensor.

  *Special values* (``SPECIAL_KINDS``): -inf, +inf, and the dtype's extremes
  ``-finfo.max`` / ``+finfo.max`` (attention masks, padding) come back exactly, at
  their positions. A group holding them stores its half-range word negated, with the kind
  of its special value in the two low mantissa bits of its bfloat16 (rounded up first, so
  it still covers the range); code ``L`` then means "the special value", and the group's
  other values quantize as usual over codes ``0 .. L-1``. No extra bytes. Such a group
  is poisoned (decodes to NaN) only where it cannot be honest: two different kinds of
  special value in one group, or at 1 bit, where ``L - 1 = 0`` leaves no code for
  other values that are not all equal.
  *NaN* poisons its group: the half-range word is NaN and the group decodes to NaN, so a
  gradient that is non-finite without gact stays non-finite.
* ``bits == 32`` (pass-through): the raw bytes of the tensor in its own dtype.
* ``torch.bool`` (dropout and ReLU masks): 1 bit per element, lossless, no scales.

The tag makes every blob self-describing from its *length* alone:
``blob.numel() % 8`` is 1, 2, 6, 3, 4 or 5 for 1, 2, 3, 4, 8 or 32 bits (bool blobs use 1).
Reading the bits therefore needs no device-to-host copy, which is what lets bits
change at run time without a recompile. A blob written for a sensitivity probe carries
8 more bytes before its tag, an identity token (``runtime.registry``): only the probed
call's blob is then ever substituted, whatever its contents.
"""

from __future__ import annotations

SUPPORTED_BITS = (1, 2, 3, 4, 8, 32)
QUANTIZED_BITS = (1, 2, 3, 4, 8)  # the widths that round (32 is the pass-through)
PLANE_BITS = 3  # the width stored as two planes (2 + 1 bits); see the layout above
RUNTIME_BITS = 0  # ``gact::quantize(..., bits=RUNTIME_BITS)``: the site's width is read at run time
SPECIAL_KINDS = ("-inf", "+inf", "-max", "+max")  # kind k sits in the low 2 bits of a flagged half range
TOKEN_BYTES = 8
KEY_BYTES = 8  # a dithered blob's call key: two uint32
PASS_THROUGH_BITS = 32
METADATA_BYTES_PER_GROUP = 4  # bfloat16 half range + bfloat16 min
HALF_MAX_BITS = 0x7F7C0000  # float32 bits of the largest half range (half that at top code 1): 4 ulps below +inf
MAX_GROUP_SIZE = 4096  # every codec holds a group at once (one GPU program, the CPU codec's buffer)
_ALIGN = 8
_TAG_BY_BITS = {1: 1, 2: 2, 3: 6, 4: 3, 8: 4, 32: 5}
_BITS_BY_TAG = {tag: bits for bits, tag in _TAG_BY_BITS.items()}


def _round_up(value, multiple):
    # Works on ints and on SymInts (only + // * are used).
    return (value + multiple - 1) // multiple * multiple


def check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits!r}")


def check_group_size(group_size: int) -> None:
    if not isinstance(group_size, int) or not 16 <= group_size <= MAX_GROUP_SIZE or group_size % 16:
        raise ValueError(
            f"group_size must be a multiple of 16 from 16 to {MAX_GROUP_SIZE}, got {group_size!r}: the "
            "noise pairs elements 16 apart and the GPU kernels take groups a 16-element chunk at a time, "
            "in one program"
        )


def tag_bytes(bits: int) -> int:
    """Number of trailing tag bytes that encode ``bits`` in the blob length."""
    check_bits(bits)
    return _TAG_BY_BITS[bits]


def num_groups(numel, group_size: int):
    return (numel + group_size - 1) // group_size


def quantized_body_bytes(numel, bits: int, group_size: int):
    """Bytes of scales + mins + codes before padding, for a float tensor."""
    groups = num_groups(numel, group_size)
    return groups * METADATA_BYTES_PER_GROUP + groups * (group_size * bits // 8)


def float_blob_nbytes(numel, bits: int, group_size: int, itemsize: int, dithered: bool = False):
    """Length in bytes of the blob of a floating-point tensor of ``numel`` elements; a
    ``dithered`` one below 32 bits keeps its call key too."""
    check_bits(bits)
    if bits == PASS_THROUGH_BITS:
        return _round_up(numel * itemsize, _ALIGN) + _TAG_BY_BITS[bits]
    key = KEY_BYTES if dithered else 0
    return key_offset(numel, bits, group_size) + key + _TAG_BY_BITS[bits]


def key_offset(numel, bits: int, group_size: int):
    """Where a dithered blob keeps its call key: right after the padded codes."""
    return _round_up(quantized_body_bytes(numel, bits, group_size), _ALIGN)


def bool_blob_nbytes(numel):
    """Length in bytes of the blob of a bool tensor (1 bit per element, lossless)."""
    return _round_up((numel + 7) // 8, _ALIGN) + _TAG_BY_BITS[1]


def token_offset(nbytes: int) -> int:
    """Where a probe blob of ``nbytes`` keeps its token (its last 8 bytes before the tag)."""
    return nbytes - nbytes % _ALIGN - TOKEN_BYTES


def bits_from_blob_nbytes(nbytes: int) -> int:
    """Recover the bit width a blob was written with from its length (host-side)."""
    tag = nbytes % _ALIGN
    if tag not in _BITS_BY_TAG:
        raise ValueError(f"not a gact blob: length {nbytes} has tag {tag}")
    return _BITS_BY_TAG[tag]


def ideal_ratio(bits: int, group_size: int = 256, itemsize: int = 4,
                metadata_bytes: int = METADATA_BYTES_PER_GROUP) -> float:
    """Stored size over original size for a large tensor: ``(b + 32/group_size) / (8*itemsize)``.

    With 256-element groups and fp32 inputs this is ``(b + 0.125) / 32``. ``metadata_bytes``:
    a group's, for a format of another time (8 before the bfloat16 words).
    """
    check_bits(bits)
    if bits == PASS_THROUGH_BITS:
        return 1.0
    return (bits + 8 * metadata_bytes / group_size) / (8 * itemsize)
