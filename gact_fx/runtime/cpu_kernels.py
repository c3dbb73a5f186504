"""The CPU codec: quantize and dequantize in one pass over each group, in C++, on torch's threads.

The torch reference (``runtime.reference``) builds the blob out of dozens of tensor ops,
each a full pass over the activation with its own temporary (the noise hash alone is a
dozen int64 tensors): on the CPU that cost more than the training step it compresses,
and its temporaries raised the peak memory. This kernel does, per group of
``group_size`` elements held in the L1 cache: min, max, special values and NaN; the
scale; the noise (``runtime.noise``'s hash), the rounding and the packing; decode is
one pass too. Groups run in parallel under OpenMP, which follows
``torch.set_num_threads``.

It writes exactly the reference's blob, bit for bit (the same float operations, in the
same order, with no fused multiply-add). It is compiled on first use by Inductor's C++
toolchain (the compiler Inductor needs on the CPU anyway; about a second, then cached
on disk): no build step at install. If that fails, a warning says so and the
reference serves instead. float32 is native; fp16 and bf16 go through float32, as the
reference's arithmetic does.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

from .. import _compat
from . import format as fmt
from .reference import SCALE_MAX

log = logging.getLogger("gact_fx")
MAX_GROUP = 4096  # the kernel's buffers; larger groups take the reference

_SOURCE = r"""
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16; h *= 0x85EBCA6Bu; h ^= h >> 13; h *= 0xC2B2AE35u; h ^= h >> 16;
  return h;
}

inline float uniform(uint32_t k0, uint32_t k1, uint64_t i) {
  uint32_t h = fmix32(((uint32_t)i * 0x9E3779B1u) ^ k1);
  h = fmix32(h ^ k0 ^ (uint32_t)(i >> 32));
  return (float)(h >> 8) * (1.0f / 16777216.0f);
}

inline uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));
inline f8 splat(float x) { return f8{x, x, x, x, x, x, x, x}; }
inline i8 splat_i(int32_t x) { return i8{x, x, x, x, x, x, x, x}; }
inline float float_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

constexpr int64_t MAX_GROUP = 4096;  // groups up to this size run from L1-resident buffers

// One group: loops written so the compiler vectorises them (no branch inside, no libm call).
template <int BITS>
void encode_group(const float* x, int64_t numel, int64_t g, int64_t group, int64_t groups, uint8_t* blob,
                  uint32_t k0, uint32_t k1, float dmax, float scale_max) {
  constexpr int L = (1 << BITS) - 1;
  constexpr int PER_BYTE = 8 / BITS;
  alignas(64) float v[MAX_GROUP];
  alignas(64) float u[MAX_GROUP];
  alignas(64) uint8_t c[MAX_GROUP];
  const int64_t base = g * group;
  const int64_t inside = std::min(group, numel - base);
  std::memcpy(v, x + base, inside * sizeof(float));
  for (int64_t j = inside; j < group; ++j) v[j] = x[numel - 1];  // the tail repeats the last element

  // Statistics eight lanes at a time (GCC/Clang vector types: the compiler will not turn a
  // float min into a vector min by itself without assuming away NaN).
  const f8 infinity = splat(INFINITY), extreme = splat(dmax);
  f8 low8 = infinity, high8 = -infinity;
  i8 special_any = splat_i(0), special_all = splat_i(-1), nan_any = splat_i(0);
  i8 kind_low8 = splat_i(4), kind_high8 = splat_i(-1);
  for (int64_t j = 0; j < group; j += 8) {
    f8 a;
    std::memcpy(&a, v + j, sizeof(a));
    const f8 m = (f8)((i8)a & splat_i(0x7FFFFFFF));
    const i8 infinite = m == infinity;
    const i8 special = infinite | (m == extreme);
    const i8 kind = ((a > 0.0f) & 1) + (~infinite & 2);
    special_any |= special;
    special_all &= special;
    nan_any |= a != a;
    kind_low8 = special ? (kind < kind_low8 ? kind : kind_low8) : kind_low8;
    kind_high8 = special ? (kind > kind_high8 ? kind : kind_high8) : kind_high8;
    const f8 low = special ? infinity : a, high = special ? -infinity : a;
    low8 = low < low8 ? low : low8;
    high8 = high > high8 ? high : high8;
  }
  int any_special = 0, all_special = 1, any_nan = 0, kind_low = 4, kind_high = -1;
  float lo = INFINITY, hi = -INFINITY;
  for (int k = 0; k < 8; ++k) {
    any_special |= special_any[k] != 0;
    all_special &= special_all[k] != 0;
    any_nan |= nan_any[k] != 0;
    kind_low = std::min(kind_low, (int)kind_low8[k]);
    kind_high = std::max(kind_high, (int)kind_high8[k]);
    lo = low8[k] < lo ? low8[k] : lo;
    hi = high8[k] > hi ? high8[k] : hi;
  }
  const bool flagged = any_special, has_nan = any_nan;
  if (all_special) { lo = 0.0f; hi = 0.0f; }
  if (has_nan) { lo = NAN; hi = NAN; }
  const int top = L - (flagged ? 1 : 0);
  const float half = hi * 0.5f - lo * 0.5f;
  float scale = half / ((float)std::max(top, 1) * 0.5f);
  if (scale > scale_max) scale = scale_max;
  if (!(scale > 0.0f)) scale = 1.0f;
  const uint32_t rounded = ((bits_of(scale) + 3u) & ~3u) | (uint32_t)std::min(std::max(kind_low, 0), 3);
  const float used = flagged ? float_of(rounded) : scale;
  const bool poison = has_nan || (flagged && kind_low != kind_high) || (flagged && top == 0 && hi > lo);
  float* words = reinterpret_cast<float*>(blob);
  words[g] = poison ? NAN : (flagged ? -used : used);
  words[groups + g] = lo;
  uint8_t* codes = blob + 8 * groups + g * (group * BITS / 8);
  if (poison) {
    std::memset(codes, 0, group * BITS / 8);
    return;
  }

  for (int64_t j = 0; j < group; ++j) {  // the noise: runtime.noise's hash of the element's index
    const uint64_t i = (uint64_t)(base + j);
    uint32_t h = fmix32(((uint32_t)i * 0x9E3779B1u) ^ k1);
    h = fmix32(h ^ k0 ^ (uint32_t)(i >> 32));
    u[j] = (float)(h >> 8) * (1.0f / 16777216.0f);
  }
  const float lo_half = lo * 0.5f, used_half = used * 0.5f, ceiling = (float)top;
  for (int64_t j = 0; j < group; ++j) {
    const float a = v[j];
    const float m = std::fabs(a);
    // clamp(floor(t), 0, top) as clamp(t, 0, top) then truncation: equal for every t, NaN -> 0
    float t = (a * 0.5f - lo_half) / used_half + u[j];
    t = t > 0.0f ? t : 0.0f;
    t = t < ceiling ? t : ceiling;
    const uint8_t code = (uint8_t)(int32_t)t;
    c[j] = (m == INFINITY || m == dmax) ? (uint8_t)L : code;
  }
  for (int64_t b = 0; b < group / PER_BYTE; ++b) {
    uint32_t byte = 0;
    for (int p = 0; p < PER_BYTE; ++p) byte |= (uint32_t)c[b * PER_BYTE + p] << (p * BITS);
    codes[b] = (uint8_t)byte;
  }
}

template <int BITS>
void decode_group(const uint8_t* blob, int64_t numel, int64_t g, int64_t group, int64_t groups, float* out, float dmax) {
  constexpr uint32_t L = (1u << BITS) - 1;
  constexpr int PER_BYTE = 8 / BITS;
  const float* words = reinterpret_cast<const float*>(blob);
  const float word = words[g], lo = words[groups + g];
  const float scale = std::fabs(word);
  const bool flagged = word < 0.0f;
  const uint32_t kind = bits_of(scale) & 3u;
  const float extreme = kind >= 2 ? dmax : INFINITY;
  const float special = (kind & 1u) ? extreme : -extreme;
  const uint32_t marker = flagged ? L : L + 1;  // a code no value has, when the group holds no special value
  const uint8_t* codes = blob + 8 * groups + g * (group * BITS / 8);
  const int64_t base = g * group;
  float* target = out + base;
  if (base + group <= numel) {
    for (int64_t b = 0; b < group / PER_BYTE; ++b) {
      const uint32_t byte = codes[b];
      for (int p = 0; p < PER_BYTE; ++p) {
        const uint32_t code = (byte >> (p * BITS)) & L;
        const float product = (float)code * scale;
        target[b * PER_BYTE + p] = code == marker ? special : product + lo;
      }
    }
    return;
  }
  for (int64_t j = 0; j < numel - base; ++j) {  // the last, partial group
    const uint32_t code = (codes[j / PER_BYTE] >> ((j % PER_BYTE) * BITS)) & L;
    const float product = (float)code * scale;
    target[j] = code == marker ? special : product + lo;
  }
}

template <int BITS>
void encode_all(const float* x, int64_t numel, int64_t group, uint8_t* blob, uint32_t k0, uint32_t k1, float dmax,
                float scale_max) {
  const int64_t groups = (numel + group - 1) / group;
#pragma omp parallel for schedule(static) if (groups > 64)
  for (int64_t g = 0; g < groups; ++g) encode_group<BITS>(x, numel, g, group, groups, blob, k0, k1, dmax, scale_max);
}

template <int BITS>
void decode_all(const uint8_t* blob, int64_t numel, int64_t group, float* out, float dmax) {
  const int64_t groups = (numel + group - 1) / group;
#pragma omp parallel for schedule(static) if (groups > 64)
  for (int64_t g = 0; g < groups; ++g) decode_group<BITS>(blob, numel, g, group, groups, out, dmax);
}

}  // namespace

extern "C" int gact_encode(const float* x, int64_t numel, int64_t group, uint8_t* blob, const int64_t* key,
                           int from_state, int bits, float dmax, float scale_max) {
  if (group > MAX_GROUP) return 2;
  const uint32_t k0 = (uint32_t)key[0];
  const uint32_t second = (uint32_t)key[1];
  const uint32_t k1 = from_state ? fmix32((second * 0x9E3779B1u) ^ k0) : second;
  switch (bits) {
    case 1: encode_all<1>(x, numel, group, blob, k0, k1, dmax, scale_max); return 0;
    case 2: encode_all<2>(x, numel, group, blob, k0, k1, dmax, scale_max); return 0;
    case 4: encode_all<4>(x, numel, group, blob, k0, k1, dmax, scale_max); return 0;
    case 8: encode_all<8>(x, numel, group, blob, k0, k1, dmax, scale_max); return 0;
  }
  return 1;
}

extern "C" int gact_decode(const uint8_t* blob, int64_t numel, int64_t group, float* out, int bits, float dmax) {
  switch (bits) {
    case 1: decode_all<1>(blob, numel, group, out, dmax); return 0;
    case 2: decode_all<2>(blob, numel, group, out, dmax); return 0;
    case 4: decode_all<4>(blob, numel, group, out, dmax); return 0;
    case 8: decode_all<8>(blob, numel, group, out, dmax); return 0;
  }
  return 1;
}
"""


@functools.cache
def library():
    """The compiled codec, or None (with a warning) when it cannot be built here."""
    try:
        lib = _compat.compile_cpp_library(_SOURCE)
    except Exception as error:  # no compiler, or a broken toolchain: the reference still works
        log.warning("gact: the CPU codec could not be compiled (%s: %s); the slower torch reference serves instead",
                    type(error).__name__, str(error).splitlines()[0][:200])
        return None
    pointer, size, flag = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.gact_encode.argtypes = [pointer, size, size, pointer, pointer, flag, flag, ctypes.c_float, ctypes.c_float]
    lib.gact_decode.argtypes = [pointer, size, size, pointer, flag, ctypes.c_float]
    lib.gact_encode.restype = lib.gact_decode.restype = flag
    return lib


def available() -> bool:
    return library() is not None


def quantize(flat: torch.Tensor, bits: int, group_size: int, *, state=None, key=None) -> torch.Tensor:
    """Blob of a 1-D float CPU tensor at ``bits`` in {1, 2, 4, 8} (the reference's, bit for bit)."""
    source, from_state = (state, 1) if state is not None else (key, 0)
    values = flat.contiguous() if flat.dtype == torch.float32 else flat.float()
    numel = values.numel()
    blob = torch.empty(fmt.float_blob_nbytes(numel, bits, group_size, flat.element_size()), dtype=torch.uint8)
    blob[fmt.quantized_body_bytes(numel, bits, group_size) :] = 0  # padding and tag
    status = library().gact_encode(values.data_ptr(), numel, group_size, blob.data_ptr(), source.data_ptr(), from_state,
                                   bits, float(torch.finfo(flat.dtype).max), SCALE_MAX)
    if status:
        raise ValueError(f"gact CPU codec: unsupported width {bits} or group size {group_size} (at most {MAX_GROUP})")
    return blob


def dequantize(blob: torch.Tensor, numel: int, dtype: torch.dtype, group_size: int) -> torch.Tensor:
    """Decode a quantized CPU blob (``bits`` read from its length) into a 1-D tensor of ``dtype``."""
    bits = fmt.bits_from_blob_nbytes(blob.numel())
    out = torch.empty(numel, dtype=torch.float32)
    blob = blob.contiguous()
    status = library().gact_decode(blob.data_ptr(), numel, group_size, out.data_ptr(), bits, float(torch.finfo(dtype).max))
    if status:
        raise ValueError(f"gact CPU codec: unsupported width {bits}")
    return out if dtype == torch.float32 else out.to(dtype)
