"""Triton quantize kernels: a float tensor's elements (in logical order) into a blob.

Both write ``runtime.format``'s blob bit for bit as ``runtime.reference`` does, zero its
tail and, keyed by a site's state, advance the site's counter (``triton_common``).

``encode_chunked_kernel`` serves groups of a multiple of 16 elements, the common case,
and is built for memory speed (instructions per element: ``runtime.compile_check``). A
program holds ``BLOCK`` groups as two ``[BLOCK, CHUNKS, 8]`` halves: elements ``16c + j``
and ``16c + 8 + j`` of each 16-element chunk ``c``. ``runtime.noise`` pairs exactly those
two elements in one hash, and the two halves have the same layout, so each thread hashes
once for both and packs each chunk's codes in its own registers (no shuffle, no shared
memory). The statistics take NaN-propagating min and max: a group whose min and max are
finite and not the dtype's extremes holds no special value and no NaN, so a program of
such groups (nearly every program) takes the plain path, whose codes need no clamp below
8 bits (the rounding bounds put them under ``top + 1``). A program holding any other group
takes the general path, the format in full.

``encode_features_kernel`` does the same for feature-major groups (``feature_groups``),
read in the source's own layout.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_common import (
    BFLOAT16_LOWEST, HALF_MAX, advance_counter, bfloat16_ceil, bfloat16_floor, bfloat16_floor_finite, call_key,
    call_mix, chunk_pair_hash, chunk_pair_products, finish_blob, halves_noise, max_nan, min_nan, mul, program_features,
    program_groups, scale_factor, store_group_words, uniform, uniform_of, widen,
)

SMALLEST_PLAIN_SCALE = tl.constexpr(2.0**-125)  # scale / 2 still normal: the rounding bounds hold


# Reductions over both halves of each group, to [BLOCK, 1, 1]. The builtin ones (tl.min,
# tl.max) serve where NaN needs no care; the plain path's min and max must propagate NaN,
# which compiled code does through a combine function, and the interpreter (whose builtin
# min and max propagate NaN already, and whose custom reductions loop in Python) through
# the builtin: ``INTERPRETED`` picks, with the same result either way.
@triton.jit
def nan_min(x, axis: tl.constexpr, INTERPRETED: tl.constexpr):
    if INTERPRETED:
        result = tl.min(x, axis, keep_dims=True)
    else:
        result = tl.reduce(x, axis, min_nan, keep_dims=True)
    return result


@triton.jit
def nan_max(x, axis: tl.constexpr, INTERPRETED: tl.constexpr):
    if INTERPRETED:
        result = tl.max(x, axis, keep_dims=True)
    else:
        result = tl.reduce(x, axis, max_nan, keep_dims=True)
    return result


@triton.jit
def reduce_min_nan(a, b, INTERPRETED: tl.constexpr):
    return nan_min(nan_min(min_nan(a, b), 2, INTERPRETED), 1, INTERPRETED)


@triton.jit
def reduce_max_nan(a, b, INTERPRETED: tl.constexpr):
    return nan_max(nan_max(max_nan(a, b), 2, INTERPRETED), 1, INTERPRETED)


@triton.jit
def reduce_min(a, b):
    return tl.min(tl.min(tl.minimum(a, b), 2, keep_dims=True), 1, keep_dims=True)


@triton.jit
def reduce_max(a, b):
    return tl.max(tl.max(tl.maximum(a, b), 2, keep_dims=True), 1, keep_dims=True)


@triton.jit
def reduce_any(a, b):
    return reduce_max(a.to(tl.int32), b.to(tl.int32)) == 1


@triton.jit
def reduce_all(a, b):
    return reduce_min(a.to(tl.int32), b.to(tl.int32)) == 1


@triton.jit
def _kinds(x, dtype_max):
    """Which elements are special (+-inf, +-the dtype's max) and their kind (``runtime.format``)."""
    magnitude = tl.abs(x)
    infinite = magnitude == float("inf")
    special = infinite | (magnitude == dtype_max)
    kind = (x > 0).to(tl.int32) + 2 * (1 - infinite.to(tl.int32))
    return special, kind


@triton.jit
def general_parameters(xa, xb, dtype_max, LEVELS: tl.constexpr):
    """Per group (broadcastable): the half-range word, the min, the scale codes use, the top
    code, the poison flag, and each element's special mask and kind, as the reference."""
    special_a, kind_a = _kinds(xa, dtype_max)
    special_b, kind_b = _kinds(xb, dtype_max)
    flagged = reduce_any(special_a, special_b)
    only_special = reduce_all(special_a, special_b)
    has_nan = reduce_any(xa != xa, xb != xb)
    group_min = reduce_min(tl.where(special_a, float("inf"), xa), tl.where(special_b, float("inf"), xb))
    group_max = reduce_max(tl.where(special_a, float("-inf"), xa), tl.where(special_b, float("-inf"), xb))
    group_min = tl.where(only_special, 0.0, group_min)
    group_max = tl.where(only_special, 0.0, group_max)
    group_min = bfloat16_floor(tl.where(has_nan, float("nan"), group_min))
    kind_low = reduce_min(tl.where(special_a, kind_a, 4), tl.where(special_b, kind_b, 4))
    kind_high = reduce_max(tl.where(special_a, kind_a, -1), tl.where(special_b, kind_b, -1))
    top = LEVELS - flagged.to(tl.int32)
    half_max = tl.where(top <= 1, HALF_MAX * 0.5, HALF_MAX)
    half = bfloat16_ceil(tl.minimum(mul(group_max, 0.5) - mul(group_min, 0.5), half_max))
    raw = half.to(tl.int32, bitcast=True)
    rounded = ((raw + 0x30000) & -0x40000) | (tl.minimum(tl.maximum(kind_low, 0), 3) << 16)
    half = tl.where(flagged, rounded.to(tl.float32, bitcast=True), half)
    scale = mul(half, scale_factor(top))
    used = tl.where(scale > 0, scale, 1.0)
    poison = has_nan | (flagged & (kind_low != kind_high)) | (flagged & (top == 0) & (group_max > group_min))
    word = tl.where(flagged, -half, half)
    word = tl.where(poison, float("nan"), word)
    return word, group_min, used, top, poison, special_a, special_b


@triton.jit
def general_codes(x, u, special, group_min, used, top, poison, LEVELS: tl.constexpr):
    inverse = tl.math.div_rn(1.0, mul(used, 0.5))
    codes = tl.floor(mul(mul(x, 0.5) - mul(group_min, 0.5), inverse) + u)
    codes = tl.minimum(tl.maximum(codes, 0.0), top.to(tl.float32))
    codes = tl.where(special, LEVELS, codes)
    return tl.where(poison | (codes != codes), 0.0, codes).to(tl.int32)


@triton.jit
def _pack_half(codes, j, BITS: tl.constexpr):
    """The 8 codes of a half chunk ([.., 8], below 8 bits) packed into 8 * BITS bits."""
    return tl.sum(codes << (j * BITS), axis=2)


@triton.jit
def _gather_low_planes(nibbles):
    """Bits 0-1 of each of eight 4-bit codes, as 16 contiguous bits."""
    x = nibbles & 0x33333333
    x = (x | (x >> 2)) & 0x0F0F0F0F
    x = (x | (x >> 4)) & 0x00FF00FF
    return (x | (x >> 8)) & 0x0000FFFF


@triton.jit
def _gather_high_planes(nibbles):
    """Bit 2 of each of eight 4-bit codes, as 8 contiguous bits."""
    x = (nibbles >> 2) & 0x11111111
    x = (x | (x >> 3)) & 0x03030303
    x = (x | (x >> 6)) & 0x000F000F
    return (x | (x >> 12)) & 0x000000FF


@triton.jit
def _store_codes(codes_ptr, chunk, ca, cb, j, live, BITS: tl.constexpr, GROUP: tl.constexpr):
    """Each chunk's codes at their place in its group's bytes (``codes_ptr``: [BLOCK, 1], the
    first byte of each group's codes; ``chunk``: [1, CHUNKS])."""
    if BITS == 8:  # bytes as they are: half a, then half b
        byte = (codes_ptr + chunk * 16)[:, :, None] + j
        tl.store(byte, ca.to(tl.uint8), mask=live[:, :, None])
        tl.store(byte + 8, cb.to(tl.uint8), mask=live[:, :, None])
    elif BITS == 4:
        words = (codes_ptr + chunk * 8).to(tl.pointer_type(tl.int32))
        tl.store(words, _pack_half(ca, j, 4), mask=live)
        tl.store(words + 1, _pack_half(cb, j, 4), mask=live)
    elif BITS == 3:  # two planes (runtime.format): the low two bits, then the high bit
        na = _pack_half(ca, j, 4)  # a nibble a code, then each plane's bits gathered from the nibbles
        nb = _pack_half(cb, j, 4)
        low = _gather_low_planes(na) | (_gather_low_planes(nb) << 16)
        tl.store((codes_ptr + chunk * 4).to(tl.pointer_type(tl.int32)), low, mask=live)
        high = _gather_high_planes(na) | (_gather_high_planes(nb) << 8)
        tl.store((codes_ptr + GROUP // 4 + chunk * 2).to(tl.pointer_type(tl.int16)), high.to(tl.int16), mask=live)
    elif BITS == 2:
        word = _pack_half(ca, j, 2) | (_pack_half(cb, j, 2) << 16)
        tl.store((codes_ptr + chunk * 4).to(tl.pointer_type(tl.int32)), word, mask=live)
    else:
        word = _pack_half(ca, j, 1) | (_pack_half(cb, j, 1) << 8)
        tl.store((codes_ptr + chunk * 2).to(tl.pointer_type(tl.int16)), word.to(tl.int16), mask=live)


@triton.jit
def _load_halves(x_ptr, g1, numel, num_groups, GROUP: tl.constexpr, CHUNKS: tl.constexpr, PARTIAL: tl.constexpr):
    """The groups ``g1`` as two fp32 halves [ROWS, CHUNKS, 8] (elements ``16c + j`` and
    ``16c + 8 + j``); padding chunks repeat the last one, a partial last group its last element."""
    groups = g1[:, None, None]
    chunk = tl.minimum(tl.arange(0, CHUNKS), GROUP // 16 - 1)[None, :, None]
    j = tl.arange(0, 8)[None, None, :]
    live = groups < num_groups
    first = groups * GROUP + chunk * 16 + j
    if PARTIAL:
        last = tl.load(x_ptr + numel - 1)
        xa = tl.load(x_ptr + first, mask=live & (first < numel), other=0.0)
        xb = tl.load(x_ptr + first + 8, mask=live & (first + 8 < numel), other=0.0)
        xa = tl.where(first < numel, xa, last)
        xb = tl.where(first + 8 < numel, xb, last)
    else:
        xa = tl.load(x_ptr + first, mask=live, other=0.0)
        xb = tl.load(x_ptr + first + 8, mask=live, other=0.0)
    return xa, xb, live  # in the input's dtype


@triton.jit
def _load_halves_features(x_ptr, features, token_block, row_stride, GROUP: tl.constexpr, CHUNKS: tl.constexpr):
    """Feature-major: the groups of ``features`` ([ROWS] columns of a row-major [tokens, F]
    matrix) over the tokens of ``token_block``, as two halves [ROWS, CHUNKS, 8]."""
    chunk = tl.minimum(tl.arange(0, CHUNKS), GROUP // 16 - 1)[None, :, None]
    token = token_block * GROUP + chunk * 16 + tl.arange(0, 8)[None, None, :]
    column = features[:, None, None]
    live = column < row_stride
    xa = tl.load(x_ptr + token * row_stride + column, mask=live, other=0.0)
    xb = tl.load(x_ptr + (token + 8) * row_stride + column, mask=live, other=0.0)
    return xa, xb, live


@triton.jit
def _store_words(blob_ptr, g1, num_groups, word, group_min, ROWS: tl.constexpr, NAN: tl.constexpr):
    """The groups' words: bfloat16 half-range words and mins (``NAN``: they may hold NaN)."""
    words = blob_ptr.to(tl.pointer_type(tl.int32))
    store_group_words(words + g1, tl.reshape(word, (ROWS,)), tl.reshape(group_min, (ROWS,)), g1 < num_groups, NAN)


@triton.jit
def _store_group_codes(blob_ptr, g1, num_groups, ca, cb, BITS: tl.constexpr, GROUP: tl.constexpr,
                       CHUNKS: tl.constexpr):
    BYTES: tl.constexpr = GROUP * BITS // 8
    c2 = tl.arange(0, CHUNKS)[None, :]
    codes_ptr = blob_ptr + 4 * num_groups + g1[:, None] * BYTES
    j = tl.arange(0, 8)[None, None, :]
    _store_codes(codes_ptr, c2, ca, cb, j, (g1[:, None] < num_groups) & (c2 < GROUP // 16), BITS, GROUP)


@triton.jit
def _encode_general(blob_ptr, rows, num_groups, ya, yb, mixed_key, dtype_max, LEVELS: tl.constexpr,
                    BITS: tl.constexpr, GROUP: tl.constexpr, CHUNKS: tl.constexpr, ROWS: tl.constexpr,
                    WIDE: tl.constexpr):
    """The format in full for ``ROWS`` groups held as halves (``ya``, ``yb``): special values,
    NaN and extreme scales included."""
    ya = ya.to(tl.float32)
    yb = yb.to(tl.float32)
    va, vb = halves_noise(rows, mixed_key, GROUP, CHUNKS, WIDE)
    word, group_min, used, top, poison, special_a, special_b = general_parameters(ya, yb, dtype_max, LEVELS)
    ca = general_codes(ya, va, special_a, group_min, used, top, poison, LEVELS)
    cb = general_codes(yb, vb, special_b, group_min, used, top, poison, LEVELS)
    _store_group_codes(blob_ptr, rows, num_groups, ca, cb, BITS, GROUP, CHUNKS)
    _store_words(blob_ptr, rows, num_groups, word, group_min, ROWS, True)


@triton.jit
def _scale_and_plain(low, high, dtype_max, LEVELS: tl.constexpr, FP32: tl.constexpr):
    """Each group's min rounded down to bfloat16, half range rounded up and half its scale
    (what the reciprocal takes: ``half * (factor / 2)`` is ``(half * factor) / 2`` exactly,
    for the scales the plain path takes), from its NaN-propagating min and max, and whether
    it takes the plain path: no special value, no NaN (NaN compares false), a min a
    bfloat16 bounds, a half range below the clamp and a scale whose rounding bounds hold."""
    plain = (low > -dtype_max) & (high < dtype_max)  # (low <= high)
    if FP32:  # a 16-bit input's min is at least bfloat16's lowest
        plain = plain & (low >= BFLOAT16_LOWEST)
    low = bfloat16_floor_finite(low)  # NaN or below BFLOAT16_LOWEST: garbage the general path replaces
    half = bfloat16_ceil(mul(high, 0.5) - mul(low, 0.5))  # not clamped: the clamp's groups take the general path
    half_scale = tl.where(half > 0, mul(half, mul(scale_factor(LEVELS), 0.5)), 0.5)
    HALF_LIMIT: tl.constexpr = HALF_MAX * 0.5 if LEVELS == 1 else HALF_MAX
    return low, half, half_scale, plain & (half <= HALF_LIMIT) & (half_scale >= SMALLEST_PLAIN_SCALE * 0.5)


@triton.jit
def _half_distance(x, half_low, FP32: tl.constexpr):
    """``x * 0.5 - min * 0.5`` rounded as the reference rounds it: twice for fp32 inputs; a
    16-bit input's ``x * 0.5`` is exact (none is a float32 subnormal that halving rounds), so
    one multiply-add gives the same result."""
    if FP32:
        result = mul(x, 0.5) - half_low
    else:
        result = tl.fma(x, 0.5, -half_low)
    return result


@triton.jit
def encode_chunked_kernel(
    x_ptr, blob_ptr, numel, num_groups, nbytes, key_ptr, DTYPE_MAX: tl.constexpr,
    FROM_STATE: tl.constexpr, ADVANCE: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr,
    CHUNKS: tl.constexpr, BLOCK: tl.constexpr, PARTIAL: tl.constexpr, WIDE: tl.constexpr,
    GENERAL_ROWS: tl.constexpr, INTERPRETED: tl.constexpr, GENERAL: tl.constexpr = True, KEYED: tl.constexpr = False,
):
    """Contiguous groups of a 1-D tensor. ``GENERAL=False`` leaves the general path out: for
    counting the plain path's instructions (``runtime.compile_check``), never launched.
    ``INTERPRETED``: running under ``TRITON_INTERPRET`` (see ``nan_min``). ``KEYED``: a
    dithered blob, which keeps its call key (``finish_blob``)."""
    LEVELS: tl.constexpr = (1 << BITS) - 1
    k0, k1, count = call_key(key_ptr, FROM_STATE)
    mixed_key = call_mix(k0, k1)
    g1 = program_groups(0, BLOCK, BLOCK, WIDE)
    xa, xb, live = _load_halves(x_ptr, g1, numel, num_groups, GROUP, CHUNKS, PARTIAL)
    xa = widen(xa)
    xb = widen(xb)
    low = reduce_min_nan(xa, xb, INTERPRETED)
    high = reduce_max_nan(xa, xb, INTERPRETED)
    low, half, half_scale, plain = _scale_and_plain(low, high, DTYPE_MAX, LEVELS, x_ptr.dtype.element_ty == tl.float32)
    if (not GENERAL) or tl.min(tl.where(live, plain, True).to(tl.int32)) == 1:
        _store_words(blob_ptr, g1, num_groups, half, low, BLOCK, False)  # first: fewer registers live below
        ua, ub = halves_noise(g1, mixed_key, GROUP, CHUNKS, WIDE)
        inverse = tl.math.div_rn(1.0, half_scale)
        half_low = mul(low, 0.5)
        FP32: tl.constexpr = x_ptr.dtype.element_ty == tl.float32
        ca = (mul(_half_distance(xa, half_low, FP32), inverse) + ua).to(tl.int32)  # >= 0: truncation is floor
        cb = (mul(_half_distance(xb, half_low, FP32), inverse) + ub).to(tl.int32)
        if BITS == 8:  # below 8 bits the rounding bounds keep codes under LEVELS + 1
            ca = tl.minimum(ca, LEVELS)
            cb = tl.minimum(cb, LEVELS)
        _store_group_codes(blob_ptr, g1, num_groups, ca, cb, BITS, GROUP, CHUNKS)
    else:  # a program holding a special value, a NaN or an extreme scale: the format in full,
        # a few groups at a time (the whole block at once would spill registers)
        for part in range(BLOCK // GENERAL_ROWS):
            rows = program_groups(part * GENERAL_ROWS, GENERAL_ROWS, BLOCK, WIDE)
            ya, yb, _ = _load_halves(x_ptr, rows, numel, num_groups, GROUP, CHUNKS, PARTIAL)
            _encode_general(blob_ptr, rows, num_groups, ya, yb, mixed_key, DTYPE_MAX, LEVELS, BITS, GROUP, CHUNKS,
                            GENERAL_ROWS, WIDE)
    finish_blob(blob_ptr, 4 * num_groups + num_groups * (GROUP * BITS // 8), nbytes, k0, k1, KEYED)
    advance_counter(key_ptr, count, ADVANCE)


@triton.jit
def _feature_tokens(x_ptr, features, token_block, row_stride, offset, GROUP: tl.constexpr, CHUNKS: tl.constexpr):
    """Token ``16c + offset`` of every chunk ``c`` of each feature: [FEATURES, CHUNKS], read
    along the features (``features``: [FEATURES, 1], contiguous in memory)."""
    chunk = tl.minimum(tl.arange(0, CHUNKS), GROUP // 16 - 1)[None, :]
    token = token_block * GROUP + chunk * 16 + offset
    return tl.load(x_ptr + token * row_stride + features, mask=features < row_stride, other=0.0)


@triton.jit
def encode_features_kernel(
    x_ptr, blob_ptr, numel, num_groups, nbytes, key_ptr, token_blocks, row_stride, DTYPE_MAX: tl.constexpr,
    FROM_STATE: tl.constexpr, ADVANCE: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr,
    CHUNKS: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr, GENERAL_ROWS: tl.constexpr,
    INTERPRETED: tl.constexpr, GENERAL: tl.constexpr = True, KEYED: tl.constexpr = False,
):
    """Feature-major groups (``feature_groups``): group ``f * token_blocks + b`` holds the
    GROUP tokens of block ``b`` of feature ``f`` of a row-major [tokens, ``row_stride``]
    matrix, read in place. A program takes BLOCK features of one token block; a thread
    holds, for a few features (one wide load along them), all 16 tokens of a chunk, as 16
    tensors [BLOCK, CHUNKS] (one per token of the chunk), so it hashes each pair once and
    packs a chunk's codes in its registers. The tokens are read twice (statistics, then
    codes); the second read hits the cache."""
    LEVELS: tl.constexpr = (1 << BITS) - 1
    k0, k1, count = call_key(key_ptr, FROM_STATE)
    mixed_key = call_mix(k0, k1)
    g1, features1, token_block = program_features(0, BLOCK, BLOCK, token_blocks, WIDE)
    features = features1[:, None]
    groups = g1[:, None]
    live = features < row_stride
    low = tl.full([BLOCK, CHUNKS], float("inf"), tl.float32)
    high = tl.full([BLOCK, CHUNKS], float("-inf"), tl.float32)
    for offset in tl.static_range(16):
        x = widen(_feature_tokens(x_ptr, features, token_block, row_stride, offset, GROUP, CHUNKS))
        low = min_nan(low, x)
        high = max_nan(high, x)
    low = nan_min(low, 1, INTERPRETED)
    high = nan_max(high, 1, INTERPRETED)
    low, half, half_scale, plain = _scale_and_plain(low, high, DTYPE_MAX, LEVELS, x_ptr.dtype.element_ty == tl.float32)
    if (not GENERAL) or tl.min(tl.where(live, plain, True).to(tl.int32)) == 1:
        inverse = tl.math.div_rn(1.0, half_scale)
        half_low = mul(low, 0.5)
        FP32: tl.constexpr = x_ptr.dtype.element_ty == tl.float32
        chunk = tl.arange(0, CHUNKS)[None, :]
        product0 = chunk_pair_products(groups, chunk, GROUP, WIDE)
        # the chunk's packed codes (at 8 bits bytes 0-3), accumulated with + (the bits never
        # overlap, and a shift and an add are one instruction where a shift and an or are two)
        word_a = tl.zeros([BLOCK, CHUNKS], tl.int32)
        word_b = tl.zeros([BLOCK, CHUNKS], tl.int32)
        high_a = tl.zeros([BLOCK, CHUNKS], tl.int32)  # at 8 bits: bytes 4-7
        high_b = tl.zeros([BLOCK, CHUNKS], tl.int32)
        codes_ptr = blob_ptr + 4 * num_groups + groups * (GROUP * BITS // 8)
        keep = live & (chunk < GROUP // 16)
        for j in tl.static_range(8):
            h = chunk_pair_hash(product0, j, mixed_key)
            xa = widen(_feature_tokens(x_ptr, features, token_block, row_stride, j, GROUP, CHUNKS))
            xb = widen(_feature_tokens(x_ptr, features, token_block, row_stride, j + 8, GROUP, CHUNKS))
            ca = (mul(_half_distance(xa, half_low, FP32), inverse) + uniform_of(h)).to(tl.int32)
            cb = (mul(_half_distance(xb, half_low, FP32), inverse) + uniform_of(h >> 16)).to(tl.int32)
            if BITS == 8:  # bytes 0-3 of each half in one word, bytes 4-7 in another
                if j < 4:
                    word_a = word_a + (tl.minimum(ca, LEVELS) << (8 * j))
                    word_b = word_b + (tl.minimum(cb, LEVELS) << (8 * j))
                else:
                    high_a = high_a + (tl.minimum(ca, LEVELS) << (8 * (j - 4)))
                    high_b = high_b + (tl.minimum(cb, LEVELS) << (8 * (j - 4)))
            elif BITS == 3:  # a nibble a code; the planes are gathered from the nibbles below
                word_a = word_a + (ca << (4 * j))
                word_b = word_b + (cb << (4 * j))
            else:
                word_a = word_a + (ca << (BITS * j))
                word_b = word_b + (cb << (BITS * j))
        if BITS == 8:
            words = (codes_ptr + chunk * 16).to(tl.pointer_type(tl.int32))
            tl.store(words, word_a, mask=keep)
            tl.store(words + 1, high_a, mask=keep)
            tl.store(words + 2, word_b, mask=keep)
            tl.store(words + 3, high_b, mask=keep)
        elif BITS == 4:
            words = (codes_ptr + chunk * 8).to(tl.pointer_type(tl.int32))
            tl.store(words, word_a, mask=keep)
            tl.store(words + 1, word_b, mask=keep)
        elif BITS == 3:
            low_plane = _gather_low_planes(word_a) | (_gather_low_planes(word_b) << 16)
            tl.store((codes_ptr + chunk * 4).to(tl.pointer_type(tl.int32)), low_plane, mask=keep)
            high_plane = _gather_high_planes(word_a) | (_gather_high_planes(word_b) << 8)
            tl.store((codes_ptr + GROUP // 4 + chunk * 2).to(tl.pointer_type(tl.int16)), high_plane.to(tl.int16), mask=keep)
        elif BITS == 2:
            tl.store((codes_ptr + chunk * 4).to(tl.pointer_type(tl.int32)), word_a | (word_b << 16), mask=keep)
        elif BITS == 1:
            tl.store((codes_ptr + chunk * 2).to(tl.pointer_type(tl.int16)), (word_a | (word_b << 8)).to(tl.int16), mask=keep)
        words_ptr = blob_ptr.to(tl.pointer_type(tl.int32))
        store_group_words(words_ptr + g1, tl.reshape(half, (BLOCK,)), tl.reshape(low, (BLOCK,)), features1 < row_stride,
                          False)
    else:  # the format in full, a few features at a time, through the contiguous kernel's helpers
        for part in range(BLOCK // GENERAL_ROWS):
            rows, row_features, _ = program_features(part * GENERAL_ROWS, GENERAL_ROWS, BLOCK, token_blocks, WIDE)
            ya, yb, _ = _load_halves_features(x_ptr, row_features, token_block, row_stride, GROUP, CHUNKS)
            _encode_general(blob_ptr, rows, num_groups, ya, yb, mixed_key, DTYPE_MAX, LEVELS, BITS, GROUP, CHUNKS,
                            GENERAL_ROWS, WIDE)
    finish_blob(blob_ptr, 4 * num_groups + num_groups * (GROUP * BITS // 8), nbytes, k0, k1, KEYED)
    advance_counter(key_ptr, count, ADVANCE)


@triton.jit
def noise_kernel(out_ptr, num_groups, key_ptr, FROM_STATE: tl.constexpr, GROUP: tl.constexpr,
                 LANES: tl.constexpr, BLOCK: tl.constexpr):
    """The ``(groups, GROUP)`` uniforms a quantize draws (for tests)."""
    k0, k1, _ = call_key(key_ptr, FROM_STATE)
    lanes = tl.arange(0, LANES)[None, :]
    groups = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)[:, None]
    offsets = groups.to(tl.int64) * GROUP + tl.minimum(lanes, GROUP - 1)
    tl.store(out_ptr + offsets, uniform(k0, k1, offsets), mask=(groups < num_groups) & (lanes < GROUP))
