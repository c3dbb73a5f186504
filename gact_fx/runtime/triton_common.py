"""The ``@triton.jit`` helpers every gact kernel shares: the noise hash, the call's key, the
site's counter, a program's groups, the blob's tail, the bfloat16 group words, and
rounding to 16-bit floats.

Imported only with Triton (``runtime.triton_kernels``). Module-level numbers a kernel reads
are ``tl.constexpr``: compiled Triton refuses a plain global (the interpreter does not).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .reference import HALF_MAX as _HALF_MAX

HALF_MAX = tl.constexpr(_HALF_MAX)
GOLDEN = tl.constexpr(0x9E3779B1)
M1 = tl.constexpr(0x85EBCA6B)
M2 = tl.constexpr(0xC2B2AE35)


BFLOAT16_LOWEST = tl.constexpr(-3.3895313892515355e38)  # -finfo(bfloat16).max


@triton.jit
def mul(a, b):
    """``a * b`` (float32) rounded on its own, never fused into a multiply-add with what
    follows. The format rounds ``a * b + c`` twice; Triton contracts such pairs unless the
    launch says ``enable_fp_fusion=False``, and a launch by another (Inductor's of a
    ``wrap_triton`` kernel) need not. An explicit ``fma`` is never contracted further, and
    adding -0.0 changes no product, not even a zero's sign."""
    return tl.fma(a, b, -0.0)


@triton.jit
def bfloat16_floor(x):
    """The largest bfloat16 at or below ``x`` (float32), never -inf; NaN stays NaN (``runtime.reference``)."""
    down = bfloat16_floor_finite(tl.maximum(x, BFLOAT16_LOWEST))
    return tl.where(x != x, float("nan"), down)


@triton.jit
def bfloat16_floor_finite(x):
    """``bfloat16_floor`` of an ``x`` at or above ``BFLOAT16_LOWEST``: a negative value's
    dropped bits carry into its magnitude."""
    raw = x.to(tl.uint32, bitcast=True)
    return ((raw + (raw >> 31) * 0xFFFF) & 0xFFFF0000).to(tl.float32, bitcast=True)


@triton.jit
def bfloat16_ceil(x):
    """The smallest bfloat16 at or above a positive finite ``x``."""
    return ((x.to(tl.int32, bitcast=True) + 0xFFFF) & -0x10000).to(tl.float32, bitcast=True)


@triton.jit
def scale_factor(top):
    """``2 / top`` rounded once (``runtime.format``), for ``top`` in 0..255."""
    return tl.math.div_rn(2.0, tl.maximum(top, 1).to(tl.float32))


@triton.jit
def store_group_words(ptr, word, group_min, mask, NAN: tl.constexpr):
    """Stores each group's 32-bit word (``runtime.format``): the min's bfloat16 in the high
    half, the half-range word's in the low half; both float32 values that are bfloat16s.
    ``NAN``: they may hold NaN, stored as 0x7FC0, the reference's (GPU arithmetic makes
    other NaNs)."""
    half_bits = word.to(tl.uint32, bitcast=True) >> 16
    min_bits = group_min.to(tl.uint32, bitcast=True)  # its low half is zero
    if NAN:
        half_bits = tl.where(word != word, 0x7FC0, half_bits)
        min_bits = tl.where(group_min != group_min, 0x7FC00000, min_bits)
    tl.store(ptr.to(tl.pointer_type(tl.uint32)), min_bits | half_bits, mask=mask)


@triton.jit
def load_group_words(ptr, mask, LEVELS: tl.constexpr):
    """From each group's 32-bit word: its half-range word's bits as an int32 (negative, -0.0
    included, where the group is flagged; the kind in bits 16-17), its scale and its min
    (float32); zeros where masked."""
    bits = tl.load(ptr.to(tl.pointer_type(tl.int32)), mask=mask, other=0)
    half_bits = bits << 16
    factor = tl.where(half_bits < 0, scale_factor(LEVELS - 1), scale_factor(LEVELS))
    scale = mul((half_bits & 0x7FFFFFFF).to(tl.float32, bitcast=True), factor)
    return half_bits, scale, (bits & -0x10000).to(tl.float32, bitcast=True)


@triton.jit
def fmix32(h):
    h = h ^ (h >> 16)
    h = h * M1
    h = h ^ (h >> 13)
    h = h * M2
    return h ^ (h >> 16)


@triton.jit
def call_key(key_ptr, FROM_STATE: tl.constexpr):
    """``(k0, k1, count)`` as uint32: from a site's ``[slot_key, count, ticket]`` state, or a
    given ``[k0, k1]`` key (count then unused)."""
    k0 = (tl.load(key_ptr) & 0xFFFFFFFF).to(tl.uint32)
    second = tl.load(key_ptr + 1)
    low = (second & 0xFFFFFFFF).to(tl.uint32)
    if FROM_STATE:
        k1 = fmix32((low * GOLDEN) ^ k0)
    else:
        k1 = low
    return k0, k1, second


@triton.jit
def call_mix(k0, k1):
    """The part of every element's hash input that is the call's: ``k1 ^ k0 * M2``, with
    fmix32's first shift applied (it distributes over XOR), so each hash saves an op."""
    key = k1 ^ (k0 * M2)
    return key ^ (key >> 16)


@triton.jit
def pair_hash(pair, mixed_key, high_word):
    """``runtime.noise``'s hash of pair indices (uint32 low words; ``high_word``: the pairs' high
    word times M1, 0 below 2**32), given ``call_mix``'s key."""
    return hash_product(pair * GOLDEN ^ high_word, mixed_key)


@triton.jit
def hash_product(g, mixed_key):
    """``pair_hash`` from ``pair * GOLDEN ^ high_word`` (consecutive pairs: add GOLDEN)."""
    h = g ^ (g >> 16) ^ mixed_key
    h = h * M1
    h = h ^ (h >> 13)
    h = h * M2
    return h ^ (h >> 16)


@triton.jit
def uniform_of(half16):
    """``(2 * half + 1) / 2**17`` for 16-bit halves of a hash, exact in one multiply-add."""
    return tl.fma(half16.to(tl.uint16).to(tl.float32), 1.0 / 65536.0, 1.0 / 131072.0)


@triton.jit
def one_plus_uniform(h, UPPER: tl.constexpr):
    """``1 + uniform_of(half)`` for a hash's low (or ``UPPER``) 16 bits, exactly, without a
    conversion: the half in the mantissa's bits 7-22 of a float in [1, 2)."""
    if UPPER:
        bits = (h >> 9) & 0x7FFF80
    else:
        bits = (h << 7) & 0x7FFF80
    return (bits | 0x3F800040).to(tl.float32, bitcast=True)


@triton.jit
def dithered(codes, one_plus_u):
    """``(code + 0.5) - u`` as the reference rounds it: ``(code + 1.5) - (1 + u)`` is the same
    real number, and both sums are exact."""
    return (codes.to(tl.float32) + 1.5) - one_plus_u


@triton.jit
def uniform(k0, k1, offsets):
    """``runtime.noise.uniform`` of int64 element indices: one hash per element."""
    pair = (offsets >> 4) * 8 + (offsets & 7)
    low = (pair & 0xFFFFFFFF).to(tl.uint32)
    high = (pair >> 32).to(tl.uint32)
    h = pair_hash(low, call_mix(k0, k1), high * M1)
    half = (h >> ((offsets & 8) * 2).to(tl.uint32)) & 0xFFFF
    return uniform_of(half)


@triton.jit
def halves_hash(g1, mixed_key, GROUP: tl.constexpr, CHUNKS: tl.constexpr, WIDE: tl.constexpr):
    """One pair hash serves element ``16c + j`` (its low half) and ``16c + 8 + j`` (its high)."""
    chunk = tl.arange(0, CHUNKS)[None, :, None]
    pair = g1[:, None, None] * (GROUP // 2) + chunk * 8 + tl.arange(0, 8)[None, None, :]
    if WIDE:
        return pair_hash((pair & 0xFFFFFFFF).to(tl.uint32), mixed_key, (pair >> 32).to(tl.uint32) * M1)
    return pair_hash(pair.to(tl.uint32), mixed_key, 0)


@triton.jit
def halves_noise(g1, mixed_key, GROUP: tl.constexpr, CHUNKS: tl.constexpr, WIDE: tl.constexpr):
    """The uniforms of both halves (``halves_hash``)."""
    h = halves_hash(g1, mixed_key, GROUP, CHUNKS, WIDE)
    return uniform_of(h), uniform_of(h >> 16)


@triton.jit
def chunk_pair_products(groups, chunk, GROUP: tl.constexpr, WIDE: tl.constexpr):
    """``pair * GOLDEN ^ high_word`` of the first of each chunk's eight pairs (feature-major
    groups: ``groups`` down the rows, ``chunk`` along them), for ``chunk_pair_hash``."""
    pair0 = groups * (GROUP // 2) + chunk * 8
    if WIDE:
        return (pair0 & 0xFFFFFFFF).to(tl.uint32) * GOLDEN ^ ((pair0 >> 32).to(tl.uint32) * M1)
    return pair0.to(tl.uint32) * GOLDEN


@triton.jit
def chunk_pair_hash(product0, j, mixed_key):
    """The hash of pair ``pair0 + j`` of a chunk: its eight pairs never cross a multiple of
    2**32 (pair0 is one of 8), so only the low word's product moves."""
    return hash_product(product0 + ((j * GOLDEN) & 0xFFFFFFFF), mixed_key)


@triton.jit
def kept_key(blob_ptr, num_groups, BITS: tl.constexpr, GROUP: tl.constexpr, WIDE: tl.constexpr):
    """``call_mix`` of the key a dithered blob keeps after its padded codes (``runtime.format``)."""
    if WIDE:
        body = num_groups.to(tl.int64) * (4 + GROUP * BITS // 8)
    else:
        body = num_groups * (4 + GROUP * BITS // 8)
    words = (blob_ptr + (body + 7) // 8 * 8).to(tl.pointer_type(tl.int32))
    return call_mix(tl.load(words).to(tl.uint32, bitcast=True), tl.load(words + 1).to(tl.uint32, bitcast=True))


@triton.jit
def advance_counter(key_ptr, count, ADVANCE: tl.constexpr):
    """Count this call in the site's state: the last program to finish (its ticket says so)
    writes ``count + 1``, once every program has read ``count``."""
    if ADVANCE:
        ticket = tl.atomic_add(key_ptr + 2, 1, sem="acq_rel")
        if ticket == tl.num_programs(0) - 1:
            tl.store(key_ptr + 1, count + 1)
            tl.store(key_ptr + 2, 0)


@triton.jit
def program_groups(start, ROWS: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    """Groups ``start..start+ROWS`` of this program's block of BLOCK contiguous groups."""
    groups = tl.program_id(0) * BLOCK + start + tl.arange(0, ROWS)
    if WIDE:
        groups = groups.to(tl.int64)
    return groups


@triton.jit
def program_features(start, ROWS: tl.constexpr, BLOCK: tl.constexpr, token_blocks, WIDE: tl.constexpr):
    """Feature-major: a program takes BLOCK features of one token block, and group
    ``f * token_blocks + b`` holds feature ``f``'s tokens of block ``b`` (the blob's order).
    ``(group ids, features, token block)`` of its features ``start..start+ROWS``."""
    pid = tl.program_id(0)
    token_block = pid % token_blocks
    features = (pid // token_blocks) * BLOCK + start + tl.arange(0, ROWS)
    if WIDE:
        features = features.to(tl.int64)
    return features * token_blocks + token_block, features, token_block


@triton.jit
def zero_tail(blob_ptr, start, nbytes):
    """Program 0 zeroes the blob's padding and tag, bytes ``start..nbytes`` (fewer than 16)."""
    if tl.program_id(0) == 0:
        offsets = start + tl.arange(0, 16)
        tl.store(blob_ptr + offsets, tl.zeros([16], dtype=tl.uint8), mask=offsets < nbytes)


@triton.jit
def finish_blob(blob_ptr, start, nbytes, k0, k1, KEYED: tl.constexpr):
    """After a quantize's codes (byte ``start``), program 0 writes the rest of the blob, up to
    ``nbytes``, in one store: zeros for the padding and the tag, and for a dithered blob
    (``KEYED``) its call key ``(k0, k1)`` at the next multiple of 8 between them
    (``runtime.format``)."""
    if KEYED:
        if tl.program_id(0) == 0:
            offsets = start + tl.arange(0, 32)
            at = offsets - (start + 7) // 8 * 8  # the byte's place in the key, if 0..7
            word = tl.where(at < 4, k0, k1)
            shift = ((at & 3) * 8).to(tl.uint32)
            value = tl.where((at >= 0) & (at < 8), (word >> shift) & 0xFF, 0).to(tl.uint8)
            tl.store(blob_ptr + offsets, value, mask=offsets < nbytes)
    else:
        zero_tail(blob_ptr, start, nbytes)


@triton.jit
def widen(x):
    """``x`` as float32. A bfloat16's float32 is its bits shifted up, one instruction an
    element, where Triton's conversion takes three a pair."""
    if x.dtype == tl.bfloat16:
        result = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        result = x.to(tl.float32)
    return result


@triton.jit
def min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def round_to(values, dtype: tl.constexpr, INTERPRETED: tl.constexpr):
    """fp32 to ``dtype``, rounding to nearest even as torch does, NaN kept NaN.

    Compiled code converts in hardware (``cvt.rn``, two values an instruction), which
    rounds to nearest even. The Triton interpreter truncates to bf16 instead, so there
    (``INTERPRETED``) it is done by hand; the rounding carry would turn a NaN whose mantissa
    is all ones (0x7FFFFFFF, what NVIDIA arithmetic returns for a NaN operand) into -0.0,
    so NaN takes the canonical bf16 NaN.
    """
    if INTERPRETED and dtype == tl.bfloat16:
        raw = values.to(tl.uint32, bitcast=True)
        raw = (raw + 0x7FFF + ((raw >> 16) & 1)) >> 16
        raw = tl.where(values != values, 0x7FC0, raw)
        result = raw.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        result = values.to(dtype)
    return result
