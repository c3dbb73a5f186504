"""Triton dequantize kernels, and the 1-bit masks' pack and unpack.

``decode_chunked_kernel`` reads groups of a multiple of 16 elements as ``triton_encode``
writes them: each thread takes a 16-element chunk's packed codes in one load and expands
its two halves (elements ``16c + j`` and ``16c + 8 + j``) in its own registers.
A program of groups without special values (none flagged) skips the special-value test. Values are ``code * scale + min`` as two roundings, as the reference
decodes them (``triton_common.mul``: never a fused multiply-add, whatever the launch), so every
implementation decodes alike.
``decode_features_kernel`` reads feature-major groups (``feature_groups``) back into the
source's own row-major [tokens, features] layout, in place of a transposed copy.

Masks: ``pack_mask_kernel`` packs 0/1 bytes (a bool tensor's) eight to a byte, 32 to a
word, as ``runtime.reference`` does; ``unpack_mask_kernel`` expands them to 0 and 1 of any
dtype (bool included).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_common import (
    chunk_pair_hash, chunk_pair_products, dithered, halves_hash, kept_key, load_group_words, mul, one_plus_uniform,
    program_features, program_groups, round_to, zero_tail,
)


@triton.jit
def special_values(codes, half_bits, dtype_max, LEVELS: tl.constexpr):
    """Where a flagged group (negative ``half_bits``) holds code ``LEVELS``: its special value;
    else NaN-free garbage that ``tl.where`` drops. (``runtime.format``: the kind in the half
    range's low bits.)"""
    kind = (half_bits >> 16) & 3
    extreme = tl.where(kind >= 2, dtype_max, float("inf"))
    value = tl.where((kind & 1) == 1, extreme, -extreme)
    return (half_bits < 0) & (codes == LEVELS), value


@triton.jit
def _with_special_values(va, vb, ca, cb, half_bits, dtype_max, LEVELS: tl.constexpr):
    """Both halves' values with each flagged group's code ``LEVELS`` replaced by its special value."""
    special_a, value_a = special_values(ca, half_bits, dtype_max, LEVELS)
    special_b, value_b = special_values(cb, half_bits, dtype_max, LEVELS)
    return tl.where(special_a, value_a, va), tl.where(special_b, value_b, vb)


@triton.jit
def _half_codes(packed, j, SHIFT: tl.constexpr, BITS: tl.constexpr):
    """Codes ``j`` (0..7) of a packed word whose half starts at bit ``SHIFT``."""
    return (packed[:, :, None] >> (SHIFT + j * BITS)) & ((1 << BITS) - 1)


@triton.jit
def _load_codes(codes_ptr, chunk, j, live, BITS: tl.constexpr, GROUP: tl.constexpr):
    """Both halves' codes [ROWS, CHUNKS, 8] of each chunk (``triton_encode._store_codes``'s layout)."""
    if BITS == 8:
        byte = (codes_ptr + chunk * 16)[:, :, None] + j
        ca = tl.load(byte, mask=live[:, :, None], other=0).to(tl.int32)
        cb = tl.load(byte + 8, mask=live[:, :, None], other=0).to(tl.int32)
    elif BITS == 4:
        words = (codes_ptr + chunk * 8).to(tl.pointer_type(tl.int32))
        ca = _half_codes(tl.load(words, mask=live, other=0), j, 0, 4)
        cb = _half_codes(tl.load(words + 1, mask=live, other=0), j, 0, 4)
    elif BITS == 3:
        low = tl.load((codes_ptr + chunk * 4).to(tl.pointer_type(tl.int32)), mask=live, other=0)
        high = tl.load((codes_ptr + GROUP // 4 + chunk * 2).to(tl.pointer_type(tl.int16)), mask=live, other=0)
        high = high.to(tl.int32) & 0xFFFF
        ca = _half_codes(low, j, 0, 2) | (_half_codes(high, j, 0, 1) << 2)
        cb = _half_codes(low, j, 16, 2) | (_half_codes(high, j, 8, 1) << 2)
    elif BITS == 2:
        word = tl.load((codes_ptr + chunk * 4).to(tl.pointer_type(tl.int32)), mask=live, other=0)
        ca = _half_codes(word, j, 0, 2)
        cb = _half_codes(word, j, 16, 2)
    else:
        word = tl.load((codes_ptr + chunk * 2).to(tl.pointer_type(tl.int16)), mask=live, other=0).to(tl.int32)
        ca = _half_codes(word, j, 0, 1)
        cb = _half_codes(word, j, 8, 1)
    return ca, cb


@triton.jit
def decode_chunked_kernel(
    blob_ptr, out_ptr, numel, num_groups, DTYPE_MAX: tl.constexpr,
    BITS: tl.constexpr, GROUP: tl.constexpr, CHUNKS: tl.constexpr, BLOCK: tl.constexpr,
    PARTIAL: tl.constexpr, WIDE: tl.constexpr, DITHER: tl.constexpr, INTERPRETED: tl.constexpr,
    GENERAL: tl.constexpr = True,
):
    """Contiguous groups into a 1-D tensor. ``GENERAL=False`` leaves out the branch for
    groups with special values: for counting the plain path's instructions
    (``runtime.compile_check``), never launched. ``INTERPRETED``: running under
    ``TRITON_INTERPRET`` (``triton_common.round_to``)."""
    LEVELS: tl.constexpr = (1 << BITS) - 1
    BYTES: tl.constexpr = GROUP * BITS // 8
    g1 = program_groups(0, BLOCK, BLOCK, WIDE)
    row_live = g1 < num_groups
    half_bits, scale, group_min = load_group_words(blob_ptr.to(tl.pointer_type(tl.int32)) + g1, row_live, LEVELS)
    half_bits = half_bits[:, None, None]
    scale = scale[:, None, None]
    group_min = group_min[:, None, None]
    chunk = tl.arange(0, CHUNKS)[None, :]
    j = tl.arange(0, 8)[None, None, :]
    live = row_live[:, None] & (chunk < GROUP // 16)
    ca, cb = _load_codes(blob_ptr + 4 * num_groups + g1[:, None] * BYTES, chunk, j, live, BITS, GROUP)
    if DITHER:  # the encode's noise, drawn again and subtracted: ((code + 0.5) - u) * scale + min
        h = halves_hash(g1, kept_key(blob_ptr, num_groups, BITS, GROUP, WIDE), GROUP, CHUNKS, WIDE)
        va = mul(dithered(ca, one_plus_uniform(h, False)), scale) + group_min
        vb = mul(dithered(cb, one_plus_uniform(h, True)), scale) + group_min
    else:
        va = mul(ca.to(tl.float32), scale) + group_min  # (a NaN word, a poisoned group, decodes to NaN)
        vb = mul(cb.to(tl.float32), scale) + group_min
    if GENERAL and tl.min(half_bits) < 0:  # a group with special values: code LEVELS is its special value
        va, vb = _with_special_values(va, vb, ca, cb, half_bits, DTYPE_MAX, LEVELS)
    first = g1[:, None, None] * GROUP + chunk[:, :, None] * 16 + j
    keep = live[:, :, None]
    dtype = out_ptr.dtype.element_ty
    if PARTIAL:
        tl.store(out_ptr + first, round_to(va, dtype, INTERPRETED), mask=keep & (first < numel))
        tl.store(out_ptr + first + 8, round_to(vb, dtype, INTERPRETED), mask=keep & (first + 8 < numel))
    else:
        tl.store(out_ptr + first, round_to(va, dtype, INTERPRETED), mask=keep)
        tl.store(out_ptr + first + 8, round_to(vb, dtype, INTERPRETED), mask=keep)


@triton.jit
def _chunk_code(packed_a, packed_b, high_a, high_b, j, BITS: tl.constexpr):
    """Code ``j`` of both halves from the chunk's packed words (``decode_features_kernel``)."""
    if BITS == 3:
        ca = ((packed_a >> (2 * j)) & 3) | (((high_a >> j) & 1) << 2)
        cb = ((packed_b >> (2 * j)) & 3) | (((high_b >> j) & 1) << 2)
    elif BITS == 8:
        shift = 8 * (j % 4)
        if j < 4:
            ca = (packed_a >> shift) & 255
            cb = (packed_b >> shift) & 255
        else:
            ca = (high_a >> shift) & 255
            cb = (high_b >> shift) & 255
    else:
        ca = (packed_a >> (BITS * j)) & ((1 << BITS) - 1)
        cb = (packed_b >> (BITS * j)) & ((1 << BITS) - 1)
    return ca, cb


@triton.jit
def decode_features_kernel(
    blob_ptr, out_ptr, num_groups, token_blocks, row_stride, DTYPE_MAX: tl.constexpr,
    BITS: tl.constexpr, GROUP: tl.constexpr, CHUNKS: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr,
    DITHER: tl.constexpr, INTERPRETED: tl.constexpr, GENERAL: tl.constexpr = True,
):
    """Feature-major groups (``triton_encode.encode_features_kernel``'s) into a row-major
    [tokens, ``row_stride``] matrix: a program writes BLOCK features of one token block,
    each thread a chunk's 16 tokens of a few features, written along the features.
    ``GENERAL`` and ``INTERPRETED`` as in ``decode_chunked_kernel``."""
    LEVELS: tl.constexpr = (1 << BITS) - 1
    BYTES: tl.constexpr = GROUP * BITS // 8
    g1, features1, token_block = program_features(0, BLOCK, BLOCK, token_blocks, WIDE)
    features = features1[:, None]
    chunk = tl.arange(0, CHUNKS)[None, :]
    live = (features < row_stride) & (chunk < GROUP // 16)
    half_bits, scale, group_min = load_group_words(blob_ptr.to(tl.pointer_type(tl.int32)) + g1, features1 < row_stride,
                                                   LEVELS)
    half_bits = half_bits[:, None]
    scale = scale[:, None]
    group_min = group_min[:, None]
    any_special = GENERAL and tl.min(half_bits) < 0
    codes_ptr = blob_ptr + 4 * num_groups + g1[:, None] * BYTES
    high_a = tl.zeros([BLOCK, CHUNKS], tl.int32)
    high_b = tl.zeros([BLOCK, CHUNKS], tl.int32)
    if BITS == 8:
        chunk_words = (codes_ptr + chunk * 16).to(tl.pointer_type(tl.int32))
        packed_a = tl.load(chunk_words, mask=live, other=0)
        high_a = tl.load(chunk_words + 1, mask=live, other=0)
        packed_b = tl.load(chunk_words + 2, mask=live, other=0)
        high_b = tl.load(chunk_words + 3, mask=live, other=0)
    elif BITS == 4:
        chunk_words = (codes_ptr + chunk * 8).to(tl.pointer_type(tl.int32))
        packed_a = tl.load(chunk_words, mask=live, other=0)
        packed_b = tl.load(chunk_words + 1, mask=live, other=0)
    elif BITS == 3:
        low = tl.load((codes_ptr + chunk * 4).to(tl.pointer_type(tl.int32)), mask=live, other=0)
        packed_a = low & 0xFFFF
        packed_b = (low >> 16) & 0xFFFF
        high = tl.load((codes_ptr + GROUP // 4 + chunk * 2).to(tl.pointer_type(tl.int16)), mask=live, other=0)
        high = high.to(tl.int32)
        high_a = high & 255
        high_b = (high >> 8) & 255
    elif BITS == 2:
        packed = tl.load((codes_ptr + chunk * 4).to(tl.pointer_type(tl.int32)), mask=live, other=0)
        packed_a = packed & 0xFFFF
        packed_b = (packed >> 16) & 0xFFFF
    else:
        packed = tl.load((codes_ptr + chunk * 2).to(tl.pointer_type(tl.int16)), mask=live, other=0).to(tl.int32)
        packed_a = packed & 255
        packed_b = (packed >> 8) & 255
    dtype = out_ptr.dtype.element_ty
    token = token_block * GROUP + chunk * 16
    if DITHER:  # as encode_features_kernel hashes a chunk's pairs
        mixed_key = kept_key(blob_ptr, num_groups, BITS, GROUP, WIDE)
        product0 = chunk_pair_products(g1[:, None], chunk, GROUP, WIDE)
    for j in tl.static_range(8):
        ca, cb = _chunk_code(packed_a, packed_b, high_a, high_b, j, BITS)
        if DITHER:
            h = chunk_pair_hash(product0, j, mixed_key)
            va = mul(dithered(ca, one_plus_uniform(h, False)), scale) + group_min
            vb = mul(dithered(cb, one_plus_uniform(h, True)), scale) + group_min
        else:
            va = mul(ca.to(tl.float32), scale) + group_min
            vb = mul(cb.to(tl.float32), scale) + group_min
        if any_special:
            va, vb = _with_special_values(va, vb, ca, cb, half_bits, DTYPE_MAX, LEVELS)
        tl.store(out_ptr + (token + j) * row_stride + features, round_to(va, dtype, INTERPRETED), mask=live)
        tl.store(out_ptr + (token + 8 + j) * row_stride + features, round_to(vb, dtype, INTERPRETED), mask=live)


@triton.jit
def pack_mask_kernel(mask_ptr, blob_ptr, numel, nbytes, WORDS: tl.constexpr):
    """0/1 bytes into bits, element ``i`` at bit ``i % 32`` of little-endian word ``i // 32``."""
    word = tl.program_id(0) * WORDS + tl.arange(0, WORDS)[:, None]
    bit = tl.arange(0, 32)[None, :]
    index = word * 32 + bit
    values = tl.load(mask_ptr.to(tl.pointer_type(tl.uint8)) + index, mask=index < numel, other=0)
    packed = tl.sum((values != 0).to(tl.int32) << bit, axis=1)
    word1 = tl.program_id(0) * WORDS + tl.arange(0, WORDS)
    tl.store(blob_ptr.to(tl.pointer_type(tl.int32)) + word1, packed, mask=word1 * 32 < numel)
    zero_tail(blob_ptr, (numel + 31) // 32 * 4, nbytes)


@triton.jit
def unpack_mask_kernel(blob_ptr, out_ptr, numel, WORDS: tl.constexpr):
    """The 0 and 1 of each bit, in ``out_ptr``'s dtype (bool as bytes)."""
    word1 = tl.program_id(0) * WORDS + tl.arange(0, WORDS)
    packed = tl.load(blob_ptr.to(tl.pointer_type(tl.int32)) + word1, mask=word1 * 32 < numel, other=0)
    bit = tl.arange(0, 32)[None, :]
    index = word1[:, None] * 32 + bit
    values = (packed[:, None] >> bit) & 1
    if out_ptr.dtype.element_ty == tl.int1:
        tl.store(out_ptr.to(tl.pointer_type(tl.uint8)) + index, values.to(tl.uint8), mask=index < numel)
    else:
        tl.store(out_ptr + index, values.to(out_ptr.dtype.element_ty), mask=index < numel)
