// The CPU codec of gact-fx: quantize and dequantize of the packed format in one pass per group.
// Loaded and compiled on first use by runtime/cpu_kernels.py (which documents it), one library per
// input dtype: GACT_DTYPE is defined before this text (0 float32, 1 bfloat16, 2 float16).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the blob's packing assumes a little-endian machine");

namespace {

// Eight lanes at a time with GCC/Clang vector types: Inductor compiles with
// -fno-tree-loop-vectorize, and no compiler turns a float min into a vector min by itself
// without assuming away NaN.
typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));
typedef uint32_t u8 __attribute__((vector_size(32)));
typedef uint16_t h8 __attribute__((vector_size(16)));
typedef uint8_t b8 __attribute__((vector_size(8)));

inline f8 splat(float x) { return f8{x, x, x, x, x, x, x, x}; }
inline i8 splat_i(int32_t x) { return i8{x, x, x, x, x, x, x, x}; }
inline u8 splat_u(uint32_t x) { return u8{x, x, x, x, x, x, x, x}; }
const u8 LANES = {0, 1, 2, 3, 4, 5, 6, 7};

inline uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float float_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

constexpr uint32_t GOLDEN = 0x9E3779B1u, M1 = 0x85EBCA6Bu, M2 = 0xC2B2AE35u;

inline uint32_t fmix32(uint32_t h) { h ^= h >> 16; h *= M1; h ^= h >> 13; h *= M2; h ^= h >> 16; return h; }
inline u8 fmix32(u8 h) {
  h ^= h >> 16; h *= splat_u(M1); h ^= h >> 13; h *= splat_u(M2); h ^= h >> 16;
  return h;
}

// runtime.noise's hash of the pairs of the sixteen elements first..first+15 (first a multiple
// of 16): lane l holds the noise of element first+l in its low half, of first+8+l in its high half
inline u8 pair_hash8(uint64_t first, uint32_t key) {
  const uint64_t pair = (first >> 4) * 8;  // a multiple of 8: its eight lanes share one high word
  const u8 low = splat_u((uint32_t)pair) + LANES;
  return fmix32((low * splat_u(GOLDEN)) ^ splat_u(key ^ ((uint32_t)(pair >> 32) * M1)));
}

// the uniforms in (0, 1) of eight elements from their half of a pair hash
// (2k + 1) / 2^17 for a 16-bit half k is the float 1 + k / 2^16 + 1 / 2^17 less one, exactly:
// k goes into the mantissa's bits 7-22 (no conversion, no multiply; 4-8% off quantize).
constexpr uint32_t UNIFORM_MANTISSA = 0x7FFF80u, ONE_AND_HALF_STEP = 0x3F800040u;
template <typename F, typename U>  // any lane count: F and U vectors of as many floats and uint32s
inline F uniforms_of(U h, bool upper) {
  return (F)(((upper ? h >> 9 : h << 7) & UNIFORM_MANTISSA) | ONE_AND_HALF_STEP) - 1.0f;
}
inline f8 uniforms(u8 h, bool upper) { return uniforms_of<f8>(h, upper); }

// k1 XOR k0 * M2: the part of the hash's input that is the same for every element of a call
inline uint32_t call_word(uint32_t k0, uint32_t k1) { return k1 ^ (k0 * M2); }

struct bf16 { uint16_t bits; };
struct f16 { uint16_t bits; };

// One library serves one input dtype, GACT_DTYPE (DTYPE_CODES), which the Python side defines
// above this source: the three together took 7 s to build, a third of that each.
#ifndef GACT_DTYPE
#define GACT_DTYPE 0
#endif
#if GACT_DTYPE == 0
typedef float Value;
#elif GACT_DTYPE == 1
typedef bf16 Value;
#elif GACT_DTYPE == 2
typedef f16 Value;
#else
#error "GACT_DTYPE must be 0 (float32), 1 (bfloat16) or 2 (float16)"
#endif

inline float half_to_float(uint16_t h) {  // exact, for machines without F16C
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return float_of(sign | 0x7F800000u | (mantissa << 13));
  if (exponent) return float_of(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  return float_of(sign | bits_of((float)mantissa * (1.0f / 16777216.0f)));  // zero or subnormal: m * 2^-24
}

inline f8 load8(const float* p) { f8 a; std::memcpy(&a, p, sizeof(a)); return a; }
inline f8 load8(const bf16* p) {  // each bfloat16 the high half of a float: one unpack with zeros
  h8 raw; std::memcpy(&raw, p, sizeof(raw));
  const h8 zeros = {0, 0, 0, 0, 0, 0, 0, 0};
  return (f8)__builtin_shufflevector(zeros, raw, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
}
inline f8 load8(const f16* p) {
#if defined(__F16C__)
  f8 a; __m256 wide = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  std::memcpy(&a, &wide, sizeof(a)); return a;
#else
  f8 a; for (int k = 0; k < 8; ++k) a[k] = half_to_float(p[k].bits); return a;
#endif
}
inline float load1(const float* p) { return *p; }
inline float load1(const bf16* p) { return float_of((uint32_t)p->bits << 16); }
inline float load1(const f16* p) { return half_to_float(p->bits); }

inline uint32_t or_lanes(u8 s) {  // in three shuffles: 10% faster than eight lane extractions
  s |= __builtin_shufflevector(s, s, 4, 5, 6, 7, 0, 1, 2, 3);
  s |= __builtin_shufflevector(s, s, 2, 3, 0, 1, 6, 7, 4, 5);
  s |= __builtin_shufflevector(s, s, 1, 0, 3, 2, 5, 4, 7, 6);
  return s[0];
}

// Which of eight values are special: infinite or +-the dtype's max, ``extreme`` (no finite
// value of the dtype is larger, so one compare of the magnitude tells both).
inline i8 special8(f8 a, f8 extreme) { return (f8)((i8)a & splat_i(0x7FFFFFFF)) >= extreme; }

constexpr int64_t MAX_GROUP = 4096;  // the tail group's buffer

// What a group stores and encodes with, from its statistics: min and max (special values
// left out), whether it holds NaN, special values, only special values, and their kinds.
struct GroupWords {
  float lo, used, half_word;  // half_word: the half range as stored (negated when flagged, NaN when poisoned)
  int top;                     // the largest code of an ordinary value
  bool poison;
};

// The group words are bfloat16 (runtime.format): the min rounded down, the half range up.
inline float bfloat16_floor(float x) {
  if (x != x) return NAN;
  const uint32_t raw = bits_of(x), kept = raw & 0xFFFF0000u;
  const uint32_t down = ((raw & 0xFFFFu) && (raw >> 31)) ? kept + 0x10000u : kept;  // negative: away from zero
  return float_of(down == 0xFF800000u ? 0xFF7F0000u : down);  // never -inf: bfloat16's lowest instead
}
inline float bfloat16_ceil(float x) {  // x positive and finite
  const uint32_t raw = bits_of(x), kept = raw & 0xFFFF0000u;
  return float_of((raw & 0xFFFFu) ? kept + 0x10000u : kept);
}
// A group's 32-bit word: its min's bfloat16 in the high half, its half-range word's in the
// low half (both floats that are bfloat16s).
inline uint32_t group_word(float half_word, float lo) { return (bits_of(lo) & 0xFFFF0000u) | (bits_of(half_word) >> 16); }
inline float word_half(uint32_t word) { return float_of(word << 16); }
inline float word_min(uint32_t word) { return float_of(word & 0xFFFF0000u); }
inline bool word_flagged(float half_word) { return bits_of(half_word) >> 31; }  // a flagged half range of 0 is -0.0
// The step between codes, as group_words computes it: the half range times 2 / top.
inline float word_scale(float half_word, uint32_t L) {
  return std::fabs(half_word) * (word_flagged(half_word) ? 2.0f / (float)std::max(L - 1, 1u) : 2.0f / (float)L);
}
inline uint32_t load_word(const uint8_t* blob, int64_t g) {
  uint32_t word;
  std::memcpy(&word, blob + 4 * g, 4);
  return word;
}

inline GroupWords group_words(int L, float lo, float hi, bool flagged, bool has_nan, bool all_special, int kind_low,
                              int kind_high, float half_max) {
  if (all_special) { lo = 0.0f; hi = 0.0f; }
  if (has_nan) { lo = NAN; hi = NAN; }
  lo = bfloat16_floor(lo);
  const int top = L - (flagged ? 1 : 0);
  float half = hi * 0.5f - lo * 0.5f;
  const float limit = top <= 1 ? half_max * 0.5f : half_max;
  if (half > limit) half = limit;
  half = bfloat16_ceil(half);
  if (flagged) half = float_of(((bits_of(half) + 0x30000u) & ~0x3FFFFu) | ((uint32_t)std::min(std::max(kind_low, 0), 3) << 16));
  const float scale = half * (2.0f / (float)std::max(top, 1));  // runtime.reference: 2 / top rounded, then one multiply
  const bool poison = has_nan || (flagged && kind_low != kind_high) || (flagged && top == 0 && hi > lo);
  return GroupWords{lo, scale > 0.0f ? scale : 1.0f, poison ? NAN : (flagged ? -half : half), top, poison};
}

typedef uint8_t b16 __attribute__((vector_size(16)));
typedef uint8_t b32 __attribute__((vector_size(32)));

// The codes of sixteen consecutive elements (0..top, one per 32-bit lane of two vectors),
// packed into 16 * BITS / 8 bytes at ``out``: element k in bits k * BITS of a little-endian word.
template <int BITS>
inline void store_codes16(uint8_t* out, i8 first, i8 second) {
  if constexpr (BITS == 8) {  // the low byte of each lane, in two byte shuffles
    const b32 a = (b32)first, b = (b32)second;
    const b16 bytes = __builtin_shufflevector(a, b, 0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60);
    std::memcpy(out, &bytes, 16);
  } else if constexpr (BITS == 4) {  // two 32-bit words, or-reduced side by side
    u8 t = (u8)first << (LANES * 4), w = (u8)second << (LANES * 4);
    t = __builtin_shufflevector(t, w, 0, 1, 2, 3, 8, 9, 10, 11) | __builtin_shufflevector(t, w, 4, 5, 6, 7, 12, 13, 14, 15);
    t |= __builtin_shufflevector(t, t, 2, 3, 0, 1, 6, 7, 4, 5);
    t |= __builtin_shufflevector(t, t, 1, 0, 3, 2, 5, 4, 7, 6);
    const uint32_t words[2] = {t[0], t[4]};
    std::memcpy(out, words, 8);
  } else {  // 2 bits: one 32-bit word; 1 bit: its low 16 bits
    const uint32_t word = or_lanes(((u8)first << (LANES * BITS)) | ((u8)second << (LANES * BITS + 8 * BITS)));
    std::memcpy(out, &word, 16 * BITS / 8);
  }
}

// The codes of elements j..j+15 of a group (j a multiple of 16) into the group's code bytes,
// as runtime.format lays them out: at 3 bits a plane of the low two bits, then one of the high bit.
template <int BITS>
inline void store_group_codes16(uint8_t* codes, int64_t group, int64_t j, i8 first, i8 second) {
  if constexpr (BITS == 3) {
    store_codes16<2>(codes + j / 4, first & splat_i(3), second & splat_i(3));
    store_codes16<1>(codes + group / 4 + j / 8, first >> 2, second >> 2);
  } else {
    store_codes16<BITS>(codes + j * BITS / 8, first, second);
  }
}

// ---- Sixteen lanes: the contiguous codec's common case (groups of a multiple of 64
// elements to encode, of 16 to decode) in 64-byte vectors, half the instructions of two
// 8-lane vectors, where the machine has AVX-512 with byte and word instructions (BW: every
// AVX-512 CPU but Xeon Phi). Elsewhere the 8-lane code serves: GCC passes 64-byte vectors
// through memory without AVX-512, eight times slower.
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define GACT_SIXTEEN_LANES 1
#else
#define GACT_SIXTEEN_LANES 0
#endif
#if GACT_SIXTEEN_LANES
typedef float f16l __attribute__((vector_size(64)));
typedef int32_t i16l __attribute__((vector_size(64)));
typedef uint32_t u16l __attribute__((vector_size(64)));

inline f16l splat16(float x) { return f16l{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
inline i16l splat16_i(int32_t x) { return i16l{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
inline u16l splat16_u(uint32_t x) { return u16l{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
const u16l LANES16 = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

inline f8 low_half(f16l a) { return __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7); }
inline f8 high_half(f16l a) { return __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15); }
typedef uint16_t h16 __attribute__((vector_size(32)));
inline f16l load16(const float* p) { f16l a; std::memcpy(&a, p, sizeof(a)); return a; }
inline f16l load16(const bf16* p) {  // each bfloat16 the high half of a float
  // one word permute into the odd words, the even ones zeroed, where a widening and a shift
  // took two instructions (1.06-1.11x on bfloat16 quantize)
  const __m512i index = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7, 0, 6, 0, 5, 0, 4, 0,
                                         3, 0, 2, 0, 1, 0, 0, 0);
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return (f16l)_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, index, _mm512_castsi256_si512(raw));
}
inline f16l load16(const f16* p) {
  f16l a; const __m512 wide = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  std::memcpy(&a, &wide, sizeof(a)); return a;
}

inline i16l special16(f16l a, f16l extreme) { return (f16l)((i16l)a & splat16_i(0x7FFFFFFF)) >= extreme; }

// fmix32(g ^ k), given k_mixed = k ^ (k >> 16): the first step's shift distributes over the
// XOR, so the key costs nothing (one ternary logic op takes all three; 1.01-1.04x).
inline u16l fmix32_keyed(u16l g, u16l k_mixed) {
  u16l h = g ^ (g >> 16) ^ k_mixed;
  h *= splat16_u(M1); h ^= h >> 13; h *= splat16_u(M2); h ^= h >> 16;
  return h;
}
inline u16l fmix32(u16l h) { return fmix32_keyed(h, splat16_u(0)); }

// The pair hashes of the 32 elements first..first+31 (first a multiple of 32): lanes 0-7 are
// pair_hash8(first), lanes 8-15 pair_hash8(first + 16) (sixteen consecutive pairs share a high word).
inline u16l pair_hash16(uint64_t first, uint32_t key) {
  const uint64_t pair = (first >> 4) * 8;
  const u16l low = splat16_u((uint32_t)pair) + LANES16;
  return fmix32((low * splat16_u(GOLDEN)) ^ splat16_u(key ^ ((uint32_t)(pair >> 32) * M1)));
}

// The uniforms of elements first..first+15 (second: first+16..first+31) from pair_hash16(first):
// each lane's low half serves element l, its high half element l + 8, as in ``uniforms``. Each
// half is moved into a zeroed word (one word permute), then (2 * half + 1) * 2^-17 is taken as
// half * 2^-16 + 2^-17 in one exact multiply-add: three instructions a vector where setting
// mantissa bits took four (1.03-1.05x on quantize).
typedef uint16_t w32 __attribute__((vector_size(64)));
inline f16l uniforms16(u16l h, bool second) {
  const w32 words = (w32)h, zero = {};
  const w32 half = second ? __builtin_shufflevector(words, zero, 16, 32, 18, 32, 20, 32, 22, 32, 24, 32, 26, 32, 28, 32, 30, 32,
                                                    17, 32, 19, 32, 21, 32, 23, 32, 25, 32, 27, 32, 29, 32, 31, 32)
                          : __builtin_shufflevector(words, zero, 0, 32, 2, 32, 4, 32, 6, 32, 8, 32, 10, 32, 12, 32, 14, 32,
                                                    1, 32, 3, 32, 5, 32, 7, 32, 9, 32, 11, 32, 13, 32, 15, 32);
  const __m512 value = (__m512)__builtin_convertvector((i16l)half, f16l);
  return (f16l)_mm512_fmadd_ps(value, _mm512_set1_ps(1.0f / 65536), _mm512_set1_ps(1.0f / 131072));
}

typedef uint8_t b64 __attribute__((vector_size(64)));

// ---- 64 codes (c[q] lane l: element j + 16q + l) packed through one vector of bytes. Two
// dword packs and a word pack saturate them to 0..255 (a negative code, NaN's truncation
// among them, to 0) in the packs' order, per 128-bit block k: byte 16k + 4q + i holds element
// 16q + 4k + i. Each dword so holds four consecutive elements, which multiply-adds gather into
// one byte (2 bits) or two (4 bits), and one byte shuffle puts in order: half the instructions
// of shifting each vector's codes into place, and the clamp at the top once for 64 codes
// (1.03-1.13x on quantize at 2-8 bits).
inline b64 code_bytes64(const i16l* c) {
  return (b64)_mm512_packus_epi16(_mm512_packus_epi32((__m512i)c[0], (__m512i)c[1]),
                                  _mm512_packus_epi32((__m512i)c[2], (__m512i)c[3]));
}

// code_bytes64's bytes in element order
inline b64 in_element_order(b64 bytes) {
  return __builtin_shufflevector(bytes, bytes, 0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51, 4, 5, 6, 7, 20,
                                 21, 22, 23, 36, 37, 38, 39, 52, 53, 54, 55, 8, 9, 10, 11, 24, 25, 26, 27, 40, 41, 42, 43,
                                 56, 57, 58, 59, 12, 13, 14, 15, 28, 29, 30, 31, 44, 45, 46, 47, 60, 61, 62, 63);
}

// Bit ``bit`` of each of 64 code bytes (element order), as 1-bit codes: one test mask.
inline void store_bits64(uint8_t* out, b64 ordered, int bit) {
  const uint64_t mask = _mm512_test_epi8_mask((__m512i)ordered, _mm512_set1_epi8((char)bit));
  std::memcpy(out, &mask, 8);
}

// The codes of elements j..j+63 of a group (j a multiple of 64) into the group's code bytes as
// runtime.format lays them out; codes above ``top`` are taken as ``top`` (0: none are).
template <int BITS>
inline void store_group_codes64(uint8_t* codes, int64_t group, int64_t j, const i16l* c, int top) {
  b64 bytes = code_bytes64(c);
  if (top) bytes = (b64)_mm512_min_epu8((__m512i)bytes, _mm512_set1_epi8((char)top));
  if constexpr (BITS == 8) {
    const b64 ordered = in_element_order(bytes);
    std::memcpy(codes + j, &ordered, 64);
  } else if constexpr (BITS == 4) {  // dword 4k + q's two words: bytes 8q + 2k and 8q + 2k + 1
    const b64 pairs = (b64)_mm512_maddubs_epi16((__m512i)bytes, _mm512_set1_epi16(0x1001));  // low + 16 * high
    const b32 packed = __builtin_shufflevector(pairs, pairs, 0, 2, 16, 18, 32, 34, 48, 50, 4, 6, 20, 22, 36, 38, 52, 54,
                                               8, 10, 24, 26, 40, 42, 56, 58, 12, 14, 28, 30, 44, 46, 60, 62);
    std::memcpy(codes + j / 2, &packed, 32);
  } else if constexpr (BITS == 1) {
    store_bits64(codes + j / 8, in_element_order(bytes), 1);
  } else {  // 2 bits, and 3 bits' low plane: dword 4k + q becomes output byte 4q + k
    const b64 low = BITS == 3 ? (bytes & 3) : bytes;
    const __m512i pairs = _mm512_maddubs_epi16((__m512i)low, _mm512_set1_epi16(0x0401));  // c0 + 4 c1, c2 + 4 c3
    const b64 quads = (b64)_mm512_madd_epi16(pairs, _mm512_set1_epi32(0x00100001));    // their sum + 16 *
    const b16 packed = __builtin_shufflevector(quads, quads, 0, 16, 32, 48, 4, 20, 36, 52, 8, 24, 40, 56, 12, 28, 44, 60);
    std::memcpy(codes + j / 4, &packed, 16);
    if constexpr (BITS == 3) store_bits64(codes + group / 4 + j / 8, in_element_order(bytes), 4);  // the high plane
  }
}
#endif  // GACT_SIXTEEN_LANES

// One group of ``group`` elements at ``src`` (element ``base`` of the tensor): two passes
// from the L1 cache, the statistics, then noise, rounding and packing, sixteen or eight lanes at a time.
template <int BITS, typename T>
void encode_group(const T* src, uint64_t base, int64_t g, int64_t group, int64_t groups, uint8_t* blob,
                  uint32_t key, float dmax, float half_max) {
  constexpr int L = (1 << BITS) - 1;
  const f8 infinity = splat(INFINITY), extreme = splat(dmax);
  f8 low8 = infinity, high8 = -infinity;
  // First the common case: min, max, and whether any element is NaN or special, from the
  // largest magnitude's bits (NaN's lie above infinity's), compared once after the loop; min
  // and max skip NaN by their comparisons.
  i8 magnitude8 = splat_i(0);
#if GACT_SIXTEEN_LANES
  if ((group & 15) == 0) {  // sixteen lanes, then their halves folded into eight
    f16l low16 = splat16(INFINITY), high16 = splat16(-INFINITY);
    i16l magnitude16 = splat16_i(0);
    int64_t j = 0;
    if ((group & 31) == 0) {  // two chains of min and max, whose latency bounds the loop (3-4% of quantize)
      f16l low_b = low16, high_b = high16;
      for (; j < group; j += 32) {
        f16l a, b;
        if constexpr (std::is_same_v<T, bf16>) {  // 32 values from one load, in an order min and max ignore
          const __m512i raw = _mm512_loadu_si512(src + j), zero = _mm512_setzero_si512();  // (1.13-1.19x)
          a = (f16l)_mm512_unpacklo_epi16(zero, raw);
          b = (f16l)_mm512_unpackhi_epi16(zero, raw);
        } else {
          a = load16(src + j);
          b = load16(src + j + 16);
        }
        const i16l magnitude_a = (i16l)a & splat16_i(0x7FFFFFFF), magnitude_b = (i16l)b & splat16_i(0x7FFFFFFF);
        const i16l magnitude = magnitude_a > magnitude_b ? magnitude_a : magnitude_b;
        magnitude16 = magnitude > magnitude16 ? magnitude : magnitude16;
        low16 = a < low16 ? a : low16;
        high16 = a > high16 ? a : high16;
        low_b = b < low_b ? b : low_b;
        high_b = b > high_b ? b : high_b;
      }
      low16 = low_b < low16 ? low_b : low16;
      high16 = high_b > high16 ? high_b : high16;
    }
    for (; j < group; j += 16) {
      const f16l a = load16(src + j);
      const i16l magnitude = (i16l)a & splat16_i(0x7FFFFFFF);
      magnitude16 = magnitude > magnitude16 ? magnitude : magnitude16;
      low16 = a < low16 ? a : low16;
      high16 = a > high16 ? a : high16;
    }
    const f8 low_a = low_half(low16), low_b = high_half(low16), high_a = low_half(high16), high_b = high_half(high16);
    low8 = low_b < low_a ? low_b : low_a;
    high8 = high_b > high_a ? high_b : high_a;
    const i8 magnitude_a = (i8)low_half((f16l)magnitude16), magnitude_b = (i8)high_half((f16l)magnitude16);
    magnitude8 = magnitude_b > magnitude_a ? magnitude_b : magnitude_a;
  } else
#endif
  {
    for (int64_t j = 0; j < group; j += 8) {
      const f8 a = load8(src + j);
      const i8 magnitude = (i8)a & splat_i(0x7FFFFFFF);
      magnitude8 = magnitude > magnitude8 ? magnitude : magnitude8;
      low8 = a < low8 ? a : low8;
      high8 = a > high8 ? a : high8;
    }
  }
  const i8 odd_any = magnitude8 >= splat_i((int32_t)bits_of(dmax));
  // flagged: the group holds a special value, kept exactly under the top code
  bool flagged = false, has_nan = false;
  if (or_lanes((u8)odd_any)) {  // rare: which of the two
    i8 special_any = splat_i(0), nan_any = splat_i(0);
    for (int64_t j = 0; j < group; j += 8) {
      const f8 a = load8(src + j);
      special_any |= special8(a, extreme);
      nan_any |= a != a;
    }
    flagged = or_lanes((u8)special_any) != 0;
    has_nan = or_lanes((u8)nan_any) != 0;
  }
  bool all_special = false;
  int kind_low = 4, kind_high = -1;
  if (flagged) {  // rare: again, keeping special values out of min and max
    low8 = infinity; high8 = -infinity;
    i8 special_all = splat_i(-1);
    for (int64_t j = 0; j < group; j += 8) {
      const f8 a = load8(src + j);
      const i8 special = special8(a, extreme);
      special_all &= special;
      const f8 low = special ? infinity : a, high = special ? -infinity : a;
      low8 = low < low8 ? low : low8;
      high8 = high > high8 ? high : high8;
    }
    all_special = or_lanes(~(u8)special_all) == 0;
    for (int64_t j = 0; j < group; ++j) {  // which kinds of special value the group holds
      const float a = load1(src + j), m = std::fabs(a);
      if (!(m >= dmax)) continue;
      const int kind = (a > 0.0f ? 1 : 0) + (m == INFINITY ? 0 : 2);
      kind_low = std::min(kind_low, kind);
      kind_high = std::max(kind_high, kind);
    }
  }
  // min and max of the eight lanes (none holds NaN, so any order gives the same), in shuffles
  const auto fold = [](f8 v, bool larger) {
    f8 w = __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
    v = larger ? (w > v ? w : v) : (w < v ? w : v);
    w = __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5);
    v = larger ? (w > v ? w : v) : (w < v ? w : v);
    w = __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6);
    v = larger ? (w > v ? w : v) : (w < v ? w : v);
    return v[0];
  };
  float lo = fold(low8, false), hi = fold(high8, true);
  const GroupWords stored = group_words(L, lo, hi, flagged, has_nan, all_special, kind_low, kind_high, half_max);
  const int top = stored.top;
  const float used = stored.used;
  lo = stored.lo;
  const uint32_t word = group_word(stored.half_word, lo);
  std::memcpy(blob + 4 * g, &word, 4);
  const bool poison = stored.poison;
  uint8_t* codes = blob + 4 * groups + g * (group * BITS / 8);
  if (poison) {
    std::memset(codes, 0, group * BITS / 8);
    return;
  }

  // the group's reciprocal, rounded once, as runtime.reference takes it (a multiply an element)
  const float inverse = 1.0f / (used * 0.5f);
  const f8 lo_half = splat(lo * 0.5f), inverse8 = splat(inverse), ceiling = splat((float)top), zero = splat(0.0f);
  const auto code_of = [&](f8 a, f8 u) {
    // clamp(floor(t), 0, top) as clamp(t, 0, top) then truncation: equal for every t, NaN -> 0
    f8 t = (a * 0.5f - lo_half) * inverse8 + u;
    t = t > zero ? t : zero;
    t = t < ceiling ? t : ceiling;
    const i8 code = __builtin_convertvector(t, i8);
    return flagged ? (special8(a, extreme) ? splat_i(L) : code) : code;  // only such a group has elements to mark
  };
#if GACT_SIXTEEN_LANES
  if ((base & 63) == 0 && (group & 63) == 0) {
    // The common case at sixteen lanes: 64 elements a step, two vectors of pair hashes.
    const f16l lo_half16 = splat16(lo * 0.5f), inverse16 = splat16(inverse), ceiling16 = splat16((float)top),
               zero16 = splat16(0.0f), extreme16 = splat16(dmax);
    // careful: the group holds special values, which take the top code and may lie below the
    // min, or its halved scale's reciprocal is infinite (the scale subnormal), where 0 * inf is
    // NaN. Elsewhere t >= 0 and is never NaN, so the clamp at 0 is left out (5% of quantize),
    // and at 1 bit code 1 is t >= 1.
    const bool careful = flagged || !(inverse < INFINITY);
    const auto encode = [&](auto careful_type) {
      constexpr bool CAREFUL = decltype(careful_type)::value;
      const auto scaled = [&](f16l a, f16l u) { return (a * 0.5f - lo_half16) * inverse16 + u; };
      const auto code16 = [&](f16l a, f16l u) {  // code_of, sixteen lanes at a time
        f16l t = scaled(a, u);
        if constexpr (CAREFUL) {  // as code_of; elsewhere 0 <= t < top + 2, clamped at top as bytes
          t = (f16l)_mm512_max_ps((__m512)t, (__m512)zero16);  // t > 0 ? t : 0, NaN -> 0
          t = t < ceiling16 ? t : ceiling16;
        }
        const i16l code = __builtin_convertvector(t, i16l);
        if constexpr (CAREFUL) return special16(a, extreme16) ? splat16_i(L) : code;
        return code;
      };
      // The pair hashes' inputs advance by 16 pairs each 32 elements: their product with GOLDEN
      // by 16 * GOLDEN (mod 2^32), the key word with them unless the pair index's high word moves
      // within the group (past 2^33 elements). 1.07-1.19x on quantize with the clamp above.
      const uint64_t pair0 = (base >> 4) * 8;
      const bool one_high_word = ((pair0 + (uint64_t)group / 2) >> 32) == (pair0 >> 32);
      const uint32_t high_word = key ^ ((uint32_t)(pair0 >> 32) * M1);
      const u16l high_mixed = splat16_u(high_word ^ (high_word >> 16)), step = splat16_u(16u * GOLDEN);
      u16l golden_low = (splat16_u((uint32_t)pair0) + LANES16) * splat16_u(GOLDEN);
      for (int64_t j = 0; j < group; j += 64) {
        u16l first, second;
        if (one_high_word) {  // as pair_hash16(base + j, key) and pair_hash16(base + j + 32, key)
          first = fmix32_keyed(golden_low, high_mixed);
          second = fmix32_keyed(golden_low + step, high_mixed);
          golden_low += step + step;
        } else {
          first = pair_hash16(base + j, key);
          second = pair_hash16(base + j + 32, key);
        }
        if constexpr (BITS == 1 && !CAREFUL) {  // each vector's sixteen codes one compare, a mask
          const auto ones = [&](int64_t k, f16l u) {  // codes 1 of elements j + k .. j + k + 15
            return (uint64_t)_mm512_cmp_ps_mask((__m512)scaled(load16(src + j + k), u), _mm512_set1_ps(1.0f), _CMP_GE_OQ) << k;
          };
          const uint64_t words = ones(0, uniforms16(first, false)) | ones(16, uniforms16(first, true)) |
                                 ones(32, uniforms16(second, false)) | ones(48, uniforms16(second, true));
          std::memcpy(codes + j / 8, &words, 8);
          continue;
        }
        const i16l c[4] = {code16(load16(src + j), uniforms16(first, false)),
                           code16(load16(src + j + 16), uniforms16(first, true)),
                           code16(load16(src + j + 32), uniforms16(second, false)),
                           code16(load16(src + j + 48), uniforms16(second, true))};
        store_group_codes64<BITS>(codes, group, j, c, CAREFUL ? 0 : top);
      }
    };
    if (careful) encode(std::true_type{});
    else encode(std::false_type{});
    return;
  }
#endif
  if ((base & 15) == 0 && (group & 15) == 0) {
    // The common case: sixteen elements at a time, whole pairs of one vector of hashes,
    // with no branch on where a pair starts.
    const auto encode16 = [&](int64_t j, u8 hashes) {
      store_group_codes16<BITS>(codes, group, j, code_of(load8(src + j), uniforms(hashes, false)),
                                code_of(load8(src + j + 8), uniforms(hashes, true)));
    };
    int64_t j = 0;
    for (; j + 64 <= group; j += 64) {  // the hashes of 64 first: their multiplies overlap (10% faster)
      u8 hashes[4];
      for (int q = 0; q < 4; ++q) hashes[q] = pair_hash8(base + j + 16 * q, key);
      for (int q = 0; q < 4; ++q) encode16(j + 16 * q, hashes[q]);
    }
    for (; j < group; j += 16) encode16(j, pair_hash8(base + j, key));
    return;
  }
  u8 hashes = splat_u(0);
  uint64_t hashed = ~(uint64_t)0;  // the first index of the sixteen elements ``hashes`` serves
  if constexpr (BITS == 3) {  // a vector of eight at a time: two bytes of the low plane, one of the high
    for (int64_t j = 0; j < group; j += 8) {
      const uint64_t index = base + j;
      if ((index & ~(uint64_t)15) != hashed) { hashed = index & ~(uint64_t)15; hashes = pair_hash8(hashed, key); }
      const i8 code = code_of(load8(src + j), uniforms(hashes, index & 8));
      const uint32_t low = or_lanes((u8)(code & splat_i(3)) << (LANES * 2)), high = or_lanes((u8)(code >> 2) << LANES);
      std::memcpy(codes + j / 4, &low, 2);
      codes[group / 4 + j / 8] = (uint8_t)high;
    }
    return;
  }
  // Codes of up to 32 / (8 * BITS) vectors of eight are gathered into one 32-bit word.
  constexpr int VECTORS = BITS == 8 ? 1 : 4 / BITS;
  for (int64_t start = 0; start < group; start += 8 * VECTORS) {
   u8 word8 = splat_u(0);
   const int vectors = (int)std::min<int64_t>(VECTORS, (group - start) / 8);
   for (int v = 0; v < vectors; ++v) {
    const int64_t j = start + 8 * v;
    const f8 a = load8(src + j);
    // the noise: one vector of hashes serves this vector and the next
    const uint64_t index = base + j;
    if ((index & ~(uint64_t)15) != hashed) { hashed = index & ~(uint64_t)15; hashes = pair_hash8(hashed, key); }
    const i8 code = code_of(a, uniforms(hashes, index & 8));
    if constexpr (BITS == 8) {
      const b8 bytes = __builtin_convertvector(code, b8);
      std::memcpy(codes + j, &bytes, 8);
    } else {
      word8 |= (u8)code << (LANES * BITS + 8 * BITS * v);
    }
   }
   if constexpr (BITS != 8) {
     const uint32_t word = or_lanes(word8);
     std::memcpy(codes + start * BITS / 8, &word, vectors * BITS);
   }
  }
}

// Eight decoded values written as T, rounded to nearest even as torch converts float32.
inline void store8(float* p, f8 v) { std::memcpy(p, &v, sizeof(v)); }
inline void store8(bf16* p, f8 v) {
  const u8 bits = (u8)v;
  const u8 rounded = (bits + splat_u(0x7FFFu) + ((bits >> 16) & splat_u(1))) >> 16;
  const h8 halves = __builtin_convertvector(v != v ? splat_u(0x7FC0u) : rounded, h8);  // NaN as torch writes it
  std::memcpy(p, &halves, sizeof(halves));
}
#if defined(__F16C__)
inline void store8(f16* p, f8 v) {
  __m256 wide; std::memcpy(&wide, &v, sizeof(v));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(wide, _MM_FROUND_TO_NEAREST_INT));
}
#endif

#if GACT_SIXTEEN_LANES
inline void store16(float* p, f16l v) { std::memcpy(p, &v, sizeof(v)); }
inline void store16(bf16* p, f16l v) {  // as store8
  const u16l bits = (u16l)v;
  const u16l rounded = (bits + splat16_u(0x7FFFu) + ((bits >> 16) & splat16_u(1))) >> 16;
  const h16 halves = __builtin_convertvector(v != v ? splat16_u(0x7FC0u) : rounded, h16);
  std::memcpy(p, &halves, sizeof(halves));
}
inline void store16(f16* p, f16l v) {
  __m512 wide; std::memcpy(&wide, &v, sizeof(v));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(wide, _MM_FROUND_TO_NEAREST_INT));
}
#if defined(__AVX512BF16__)
// vcvtneps2bf16 rounds to nearest even as torch does, in one instruction where store16 takes
// six (1.3-1.6x on bfloat16 decode), but reads subnormal inputs as zero and keeps NaN's sign:
// only for groups whose values are neither (plain_range).
inline void store16_native(bf16* p, f16l v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh((__m512)v));
}
#endif
// Whether a group of this scale and min decodes to no subnormal value and no NaN: each of
// code * scale and the min is 0 or at least 2^-100, so a nonzero sum is at least 2^-123, normal.
inline bool plain_range(float scale, float lo) {
  return scale >= 0x1p-100f && (lo == 0.0f || std::fabs(lo) >= 0x1p-100f);
}

// The codes of elements j..j+15 of a group (j a multiple of 16), one per lane.
template <int BITS>
inline u16l load_codes16(const uint8_t* codes, int64_t group, int64_t j) {
  constexpr uint32_t L = (1u << BITS) - 1;
  if constexpr (BITS == 8) {  // GCC compiles the generic conversion of bytes to scalar code
    u16l code;
    const __m512i wide = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + j)));
    std::memcpy(&code, &wide, sizeof(code));
    return code;
  } else if constexpr (BITS == 3) {
    uint32_t low;
    uint16_t high;
    std::memcpy(&low, codes + j / 4, 4);
    std::memcpy(&high, codes + group / 4 + j / 8, 2);
    return ((splat16_u(low) >> (LANES16 * 2)) & splat16_u(3)) | (((splat16_u(high) >> LANES16) & splat16_u(1)) << 2);
  } else if constexpr (BITS == 4) {  // two words, eight codes each
    uint32_t words[2];
    std::memcpy(words, codes + j / 2, 8);
    const u16l both = __builtin_shufflevector(splat_u(words[0]), splat_u(words[1]), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                              11, 12, 13, 14, 15);
    return (both >> ((LANES16 & splat16_u(7)) * 4)) & splat16_u(L);
  } else {  // 1 or 2 bits: one word at most
    uint32_t packed = 0;
    std::memcpy(&packed, codes + j * BITS / 8, 2 * BITS);
    return (splat16_u(packed) >> (LANES16 * BITS)) & splat16_u(L);
  }
}
#endif  // GACT_SIXTEEN_LANES

// The codes of elements j..j+7 of a group (j a multiple of 8), one per lane.
template <int BITS>
inline u8 load_codes8(const uint8_t* codes, int64_t group, int64_t j) {
  constexpr uint32_t L = (1u << BITS) - 1;
  if constexpr (BITS == 8) {
#if defined(__AVX2__)
    u8 code;
    const __m256i wide = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + j)));
    std::memcpy(&code, &wide, sizeof(code));
    return code;
#else
    b8 bytes;
    std::memcpy(&bytes, codes + j, 8);
    return __builtin_convertvector(bytes, u8);
#endif
  } else if constexpr (BITS == 3) {
    uint32_t low = 0;
    std::memcpy(&low, codes + j / 4, 2);
    const uint32_t high = codes[group / 4 + j / 8];
    return ((splat_u(low) >> (LANES * 2)) & splat_u(3)) | (((splat_u(high) >> LANES) & splat_u(1)) << 2);
  } else {
    uint32_t packed = 0;
    std::memcpy(&packed, codes + j * BITS / 8, BITS);
    return (splat_u(packed) >> (LANES * BITS)) & splat_u(L);
  }
}

// ``dithered``: a dithered blob's group (runtime.format), its noise drawn again from ``key``
// (the call word): value = ((code + 0.5) - u) * scale + min.
template <int BITS, typename T>
void decode_group(const uint8_t* blob, int64_t numel, int64_t g, int64_t group, int64_t groups, T* out, float dmax,
                  bool dithered, uint32_t key) {
  constexpr uint32_t L = (1u << BITS) - 1;
  const uint32_t stored = load_word(blob, g);
  const float word = word_half(stored);
  const bool flagged = word_flagged(word);
  const float scale = word_scale(word, L);
  const uint32_t kind = (bits_of(word) >> 16) & 3u;
  const float extreme = kind >= 2 ? dmax : INFINITY;
  const f8 special = splat((kind & 1u) ? extreme : -extreme), scale8 = splat(scale), lo = splat(word_min(stored));
  const u8 marker = splat_u(flagged ? L : L + 1);  // a code no value has, when the group holds no special value
  const uint8_t* codes = blob + 4 * groups + g * (group * BITS / 8);
  const int64_t base = g * group;
  alignas(64) T tail[MAX_GROUP];
  const bool partial = base + group > numel;
  T* target = partial ? tail : out + base;
  int64_t j = 0;
  if (dithered) {  // (groups are a multiple of 16 elements: one pair hash serves sixteen)
    for (; j < group; j += 16) {
      const u8 hashes = pair_hash8((uint64_t)(base + j), key);
      for (int upper = 0; upper < 2; ++upper) {
        const u8 code = load_codes8<BITS>(codes, group, j + 8 * upper);
        const f8 shifted = (__builtin_convertvector((i8)code, f8) + 0.5f) - uniforms(hashes, upper);
        store8(target + j + 8 * upper, code == marker ? special : shifted * scale8 + lo);
      }
    }
  }
#if GACT_SIXTEEN_LANES
  if ((group & 15) == 0 && !dithered) {  // sixteen lanes
    const f16l special16 = splat16(special[0]), scale16 = splat16(scale), lo16 = splat16(lo[0]);
    const u16l marker16 = splat16_u(marker[0]);
    const auto decode = [&](auto store) {
      for (; j < group; j += 16) {
        const u16l code = load_codes16<BITS>(codes, group, j);
        const f16l product = __builtin_convertvector((i16l)code, f16l) * scale16;
        store(target + j, code == marker16 ? special16 : product + lo16);
      }
    };
#if defined(__AVX512BF16__)
    if constexpr (std::is_same_v<T, bf16>)
      if (plain_range(scale, lo[0])) decode([](bf16* p, f16l v) { store16_native(p, v); });
#endif
    decode([](T* p, f16l v) { store16(p, v); });  // the rest of the groups (j == group where taken above)
  }
#endif
  for (; j < group; j += 8) {
    const u8 code = load_codes8<BITS>(codes, group, j);
    const f8 product = __builtin_convertvector((i8)code, f8) * scale8;
    store8(target + j, code == marker ? special : product + lo);
  }
  if (partial) std::memcpy(out + base, tail, (numel - base) * sizeof(T));
}

template <int BITS, typename T>
void encode_all(const T* x, int64_t numel, int64_t group, uint8_t* blob, uint32_t key, float dmax,
                float half_max) {
  const int64_t groups = (numel + group - 1) / group, full = numel / group;
#pragma omp parallel for schedule(static) if (full > 64)
  for (int64_t g = 0; g < full; ++g)
    encode_group<BITS, T>(x + g * group, (uint64_t)(g * group), g, group, groups, blob, key, dmax, half_max);
  if (full < groups) {  // the last, partial group: its tail repeats the last element
    alignas(64) float tail[MAX_GROUP];
    const int64_t base = full * group;
    for (int64_t j = 0; j < group; ++j) tail[j] = load1(x + std::min(base + j, numel - 1));
    encode_group<BITS, float>(tail, (uint64_t)base, full, group, groups, blob, key, dmax, half_max);
  }
}

template <int BITS, typename T>
void decode_all(const uint8_t* blob, int64_t numel, int64_t group, T* out, float dmax, bool dithered, uint32_t key) {
  const int64_t groups = (numel + group - 1) / group;
#pragma omp parallel for schedule(static) if (groups > 64)
  for (int64_t g = 0; g < groups; ++g) decode_group<BITS, T>(blob, numel, g, group, groups, out, dmax, dithered, key);
}

template <typename T>
int decode_typed(const uint8_t* blob, int64_t numel, int64_t group, T* out, int bits, float dmax, bool dithered,
                 uint32_t key) {
  switch (bits) {
    case 1: decode_all<1>(blob, numel, group, out, dmax, dithered, key); return 0;
    case 2: decode_all<2>(blob, numel, group, out, dmax, dithered, key); return 0;
    case 3: decode_all<3>(blob, numel, group, out, dmax, dithered, key); return 0;
    case 4: decode_all<4>(blob, numel, group, out, dmax, dithered, key); return 0;
    case 8: decode_all<8>(blob, numel, group, out, dmax, dithered, key); return 0;
  }
  return 1;
}

template <typename T>
int encode_typed(const T* x, int64_t numel, int64_t group, uint8_t* blob, uint32_t key, int bits,
                 float dmax, float half_max) {
  switch (bits) {
    case 1: encode_all<1>(x, numel, group, blob, key, dmax, half_max); return 0;
    case 2: encode_all<2>(x, numel, group, blob, key, dmax, half_max); return 0;
    case 3: encode_all<3>(x, numel, group, blob, key, dmax, half_max); return 0;
    case 4: encode_all<4>(x, numel, group, blob, key, dmax, half_max); return 0;
    case 8: encode_all<8>(x, numel, group, blob, key, dmax, half_max); return 0;
  }
  return 1;
}

// ---- Feature-major order: a row-major [N tokens, C features] matrix whose blob takes the
// transpose (element c * N + t is token t of feature c), as ``feature_groups`` asks. With N a
// multiple of the group, each group is ``group`` tokens of one feature, so a block of eight
// (or sixteen) features and ``group`` tokens is eight (sixteen) groups, one per lane: one load
// of the block's features per token, no horizontal reduction, and each lane packs its own
// 32-bit words. The same float operations as encode_group, so the blob is the one of the
// transposed copy, bit for bit. ``V`` is the width: its vector types and their operations.

struct EightLanes {
  static constexpr int WIDTH = 8;
  typedef f8 F;
  typedef i8 I;
  typedef u8 U;
  static F splat(float x) { return ::splat(x); }
  static I splat_i(int32_t x) { return ::splat_i(x); }
  static U splat_u(uint32_t x) { return ::splat_u(x); }
  template <typename T> static F load(const T* p) { return load8(p); }
  static I special(F a, F extreme) { return special8(a, extreme); }
  static F uniforms(U h, bool upper) { return ::uniforms(h, upper); }
  static bool any(U v) { return or_lanes(v) != 0; }
  template <typename T> static void store(T* p, F v) { store8(p, v); }
};
#if GACT_SIXTEEN_LANES
struct SixteenLanes {  // where the matrix's features come in sixteens
  static constexpr int WIDTH = 16;
  typedef f16l F;
  typedef i16l I;
  typedef u16l U;
  static F splat(float x) { return splat16(x); }
  static I splat_i(int32_t x) { return splat16_i(x); }
  static U splat_u(uint32_t x) { return splat16_u(x); }
  template <typename T> static F load(const T* p) { return load16(p); }
  static I special(F a, F extreme) { return special16(a, extreme); }
  static F uniforms(U h, bool upper) { return uniforms_of<F>(h, upper); }
  static bool any(U v) { return or_lanes((u8)low_half((F)v) | (u8)high_half((F)v)) != 0; }
  template <typename T> static void store(T* p, F v) { store16(p, v); }
  // The codes of sixteen tokens of sixteen groups, WORDS 32-bit words a group (2 at 4 bits, 4 at
  // 8): words[i] holds, in lane l, word i of group l. A transpose of words within each 128-bit
  // block gives each group its 4 * WORDS bytes, stored at codes[l] + offset.
  template <int WORDS> static void store_words(uint8_t* const* codes, int64_t offset, const U* words) {
    const auto blocks = [](__m512i v, __m128i* out) {  // its four 128-bit blocks (immediate indices)
      out[0] = _mm512_castsi512_si128(v);
      out[1] = _mm512_extracti32x4_epi32(v, 1);
      out[2] = _mm512_extracti32x4_epi32(v, 2);
      out[3] = _mm512_extracti32x4_epi32(v, 3);
    };
    const __m512i w0 = (__m512i)words[0], w1 = (__m512i)words[1];
    const __m512i a = _mm512_unpacklo_epi32(w0, w1), b = _mm512_unpackhi_epi32(w0, w1);
    if constexpr (WORDS == 2) {  // a: groups 4k and 4k + 1 in block k, b: 4k + 2 and 4k + 3
      __m128i low[4], high[4];
      blocks(a, low);
      blocks(b, high);
      for (int k = 0; k < 4; ++k) {
        _mm_storel_epi64(reinterpret_cast<__m128i*>(codes[4 * k] + offset), low[k]);
        _mm_storeh_pd(reinterpret_cast<double*>(codes[4 * k + 1] + offset), _mm_castsi128_pd(low[k]));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(codes[4 * k + 2] + offset), high[k]);
        _mm_storeh_pd(reinterpret_cast<double*>(codes[4 * k + 3] + offset), _mm_castsi128_pd(high[k]));
      }
    } else {
      static_assert(WORDS == 4);
      const __m512i w2 = (__m512i)words[2], w3 = (__m512i)words[3];
      const __m512i c = _mm512_unpacklo_epi32(w2, w3), d = _mm512_unpackhi_epi32(w2, w3);
      const __m512i rows[4] = {_mm512_unpacklo_epi64(a, c), _mm512_unpackhi_epi64(a, c), _mm512_unpacklo_epi64(b, d),
                               _mm512_unpackhi_epi64(b, d)};  // rows[i], block k: group 4k + i
      for (int i = 0; i < 4; ++i) {
        __m128i row[4];
        blocks(rows[i], row);
        for (int k = 0; k < 4; ++k) _mm_storeu_si128(reinterpret_cast<__m128i*>(codes[4 * k + i] + offset), row[k]);
      }
    }
  }
};
#endif

template <int BITS, typename T, typename V>
void encode_block(const T* x, int64_t N, int64_t C, int64_t t0, int64_t c0, int64_t group, int64_t groups,
                  uint8_t* blob, uint32_t key, float dmax, float half_max) {
  constexpr int L = (1 << BITS) - 1;
  constexpr int W = 32 / BITS;  // tokens per 32-bit word of a lane (at 3 bits, see below)
  using F = typename V::F;
  using I = typename V::I;
  using U = typename V::U;
  constexpr int LANES_W = V::WIDTH;
  const F infinity = V::splat(INFINITY), extreme = V::splat(dmax);
  const T* src = x + t0 * C + c0;
  F lows = infinity, highs = -infinity;
  I magnitudes = V::splat_i(0);  // the largest magnitude's bits, as in encode_group
  for (int64_t j = 0; j < group; ++j) {
    const F a = V::load(src + j * C);
    const I magnitude = (I)a & V::splat_i(0x7FFFFFFF);
    magnitudes = magnitude > magnitudes ? magnitude : magnitudes;
    lows = a < lows ? a : lows;
    highs = a > highs ? a : highs;
  }
  I special_any = V::splat_i(0), nan_any = V::splat_i(0), special_all = V::splat_i(0);
  if (V::any((U)(magnitudes >= V::splat_i((int32_t)bits_of(dmax))))) {  // rare: which lanes, and which of the two
    for (int64_t j = 0; j < group; ++j) {
      const F a = V::load(src + j * C);
      special_any |= V::special(a, extreme);
      nan_any |= a != a;
    }
  }
  const bool any_flagged = V::any((U)special_any);
  int kind_low[LANES_W], kind_high[LANES_W];
  for (int l = 0; l < LANES_W; ++l) { kind_low[l] = 4; kind_high[l] = -1; }
  if (any_flagged) {  // rare: again, keeping special values out of min and max
    lows = infinity; highs = -infinity; special_all = V::splat_i(-1);
    for (int64_t j = 0; j < group; ++j) {
      const F a = V::load(src + j * C);
      const I special = V::special(a, extreme);
      special_all &= special;
      const F low = special ? infinity : a, high = special ? -infinity : a;
      lows = low < lows ? low : lows;
      highs = high > highs ? high : highs;
    }
    for (int64_t j = 0; j < group; ++j) {
      for (int l = 0; l < LANES_W; ++l) {
        const float a = load1(src + j * C + l), m = std::fabs(a);
        if (!(m >= dmax)) continue;
        const int kind = (a > 0.0f ? 1 : 0) + (m == INFINITY ? 0 : 2);
        kind_low[l] = std::min(kind_low[l], kind);
        kind_high[l] = std::max(kind_high[l], kind);
      }
    }
  }
  const int64_t group_bytes = group * BITS / 8;
  F lo_half, inverse, ceiling;
  uint8_t* codes[LANES_W];
  bool poison[LANES_W];
  for (int l = 0; l < LANES_W; ++l) {  // each lane's group words, as encode_group writes them
    const int64_t g = (c0 + l) * (N / group) + t0 / group;
    const bool flagged = special_any[l] != 0, has_nan = nan_any[l] != 0, all_special = special_all[l] != 0;
    const GroupWords stored = group_words(L, lows[l], highs[l], flagged, has_nan, all_special, kind_low[l],
                                          kind_high[l], half_max);
    poison[l] = stored.poison;
    const uint32_t word = group_word(stored.half_word, stored.lo);
    std::memcpy(blob + 4 * g, &word, 4);
    codes[l] = blob + 4 * groups + g * group_bytes;
    lo_half[l] = stored.lo * 0.5f;
    inverse[l] = 1.0f / (stored.used * 0.5f);
    ceiling[l] = (float)stored.top;
  }

  const F zero = V::splat(0.0f);
  U lane_words = V::splat_u(0), upper_words = V::splat_u(0);  // upper_words: the high plane's words at 3 bits
  U gathered[4] = {V::splat_u(0), V::splat_u(0), V::splat_u(0), V::splat_u(0)};  // at 4 and 8 bits: a lane's 16 tokens
  for (int64_t j = 0; j < group; j += 16) {
    // runtime.noise's pair hashes of tokens j..j+15 of the block's features: element
    // (c0 + l) * N + t0 + j + k, a multiple of 16 plus k, so hash k & 7, half k & 8
    U low, high;
    for (int l = 0; l < LANES_W; ++l) {
      const uint64_t pair = (((uint64_t)(c0 + l) * (uint64_t)N + (uint64_t)(t0 + j)) >> 4) * 8;
      low[l] = (uint32_t)pair;
      high[l] = key ^ ((uint32_t)(pair >> 32) * M1);
    }
    U hashes[8];
    for (int k = 0; k < 8; ++k) hashes[k] = fmix32(((low + V::splat_u((uint32_t)k)) * V::splat_u(GOLDEN)) ^ high);
    for (int k = 0; k < 16; ++k) {
      const int64_t t = j + k;
      const F a = V::load(src + t * C);
      // The next block's line of this row (blocks run feature by feature along the same rows), a
      // block ahead: rows a page or more apart defeat the hardware prefetchers (1.1-1.4x).
      if (c0 + LANES_W < C) __builtin_prefetch(src + t * C + 64 / sizeof(T));
      const F u = V::uniforms(hashes[k & 7], k & 8);
      F v = (a * 0.5f - lo_half) * inverse + u;
      v = v > zero ? v : zero;
      v = v < ceiling ? v : ceiling;
      I code = __builtin_convertvector(v, I);
      if (any_flagged) code = V::special(a, extreme) ? V::splat_i(L) : code;
      if constexpr (BITS == 3) {  // the two planes: 16 tokens per word of the low, 32 of the high
        // (the group is a multiple of 16 tokens: every low word is whole, a high one at least half)
        lane_words |= (U)(code & V::splat_i(3)) << V::splat_u((uint32_t)((t % 16) * 2));
        upper_words |= (U)(code >> 2) << V::splat_u((uint32_t)(t % 32));
        if ((t + 1) % 16 == 0) {
          for (int l = 0; l < LANES_W; ++l) { const uint32_t word = lane_words[l]; std::memcpy(codes[l] + (t - 15) / 4, &word, 4); }
          lane_words = V::splat_u(0);
        }
        if ((t + 1) % 32 == 0) {
          for (int l = 0; l < LANES_W; ++l) { const uint32_t word = upper_words[l]; std::memcpy(codes[l] + group / 4 + (t - 31) / 8, &word, 4); }
          upper_words = V::splat_u(0);
        } else if (t + 1 == group) {
          for (int l = 0; l < LANES_W; ++l) { const uint32_t word = upper_words[l]; std::memcpy(codes[l] + group / 4 + (t - 15) / 8, &word, 2); }
        }
        continue;
      }
      if constexpr ((BITS == 4 || BITS == 8) && LANES_W == 16) {  // sixteen tokens a lane, then one transpose
        constexpr int PER_WORD = 32 / BITS;
        gathered[k / PER_WORD] |= (U)code << V::splat_u((uint32_t)(BITS * (k % PER_WORD)));
        if (k == 15) {
          V::template store_words<BITS / 2>(codes, j * BITS / 8, gathered);
          for (U& word : gathered) word = V::splat_u(0);
        }
        continue;
      }
      lane_words |= (U)code << V::splat_u((uint32_t)((t % W) * BITS));
      if ((t + 1) % W == 0 || t + 1 == group) {
        const int64_t first = t - t % W, nbytes = (t + 1 - first) * BITS / 8;
        for (int l = 0; l < LANES_W; ++l) {
          const uint32_t word = lane_words[l];
          if (nbytes == 4) std::memcpy(codes[l] + first * BITS / 8, &word, 4);  // a constant size: inlined
          else std::memcpy(codes[l] + first * BITS / 8, &word, nbytes);
        }
        lane_words = V::splat_u(0);
      }
    }
  }
  for (int l = 0; l < LANES_W; ++l)
    if (poison[l]) std::memset(codes[l], 0, group_bytes);
}

// Up to SEGMENT_FEATURES / V::WIDTH vectors of features (v0 .., in vectors) of tokens t0 ..
// t0 + group - 1. Row by row, so the stores stay within a few rows at a time: a vector's
// features per row and 256 rows in flight, at a row stride of 4 KiB, thrashed one cache set.
constexpr int SEGMENT_FEATURES = 64;
constexpr int64_t LOCAL_CODES = 16384;  // bytes: a segment of 64 groups of 256 at 8 bits

template <int BITS, typename T, typename V>
void decode_block(const uint8_t* blob, int64_t N, int64_t C, int64_t t0, int64_t v0, int vectors, int64_t group,
                  int64_t groups, T* out, float dmax, bool dithered, uint32_t key) {
  constexpr uint32_t L = (1u << BITS) - 1;
  constexpr int W = BITS == 3 ? 16 : 32 / BITS;  // tokens per word read (at 3 bits, of the low plane)
  const int64_t group_bytes = group * BITS / 8;
  using F = typename V::F;
  using I = typename V::I;
  using U = typename V::U;
  constexpr int LANES_W = V::WIDTH, VECTORS = SEGMENT_FEATURES / LANES_W;
  F special[VECTORS], scales[VECTORS], lo[VECTORS];
  U marker[VECTORS];
  const uint8_t* codes[VECTORS][LANES_W];
  for (int v = 0; v < vectors; ++v) {
    for (int l = 0; l < LANES_W; ++l) {  // as decode_group reads a group's words
      const int64_t g = ((v0 + v) * LANES_W + l) * (N / group) + t0 / group;
      const uint32_t stored = load_word(blob, g);
      const float word = word_half(stored);
      const bool flagged = word_flagged(word);
      const float scale = word_scale(word, L);
      const uint32_t kind = (bits_of(word) >> 16) & 3u;
      const float extreme = kind >= 2 ? dmax : INFINITY;
      special[v][l] = (kind & 1u) ? extreme : -extreme;
      scales[v][l] = scale;
      lo[v][l] = word_min(stored);
      marker[v][l] = flagged ? L : L + 1;
      codes[v][l] = blob + 4 * groups + g * group_bytes;
    }
  }
  // The segment's codes, one group after another: gathered from the L1 cache below, where
  // straight from the blob they are 64 streams at once, more than the prefetcher follows.
  alignas(64) uint8_t local[LOCAL_CODES];
  if (group_bytes * LANES_W * vectors <= LOCAL_CODES) {
    for (int v = 0; v < vectors; ++v)
      for (int l = 0; l < LANES_W; ++l) {
        uint8_t* copy = local + (v * LANES_W + l) * group_bytes;
        std::memcpy(copy, codes[v][l], group_bytes);
        codes[v][l] = copy;
      }
  }
  T* dst = out + t0 * C + v0 * LANES_W;
  const bool next_segment = (v0 + VECTORS) * LANES_W < C;
  U packed[VECTORS], high[VECTORS];
  U chunk_low[VECTORS], chunk_high[VECTORS];  // dithered: the pair hashes' inputs for tokens of one 16-token chunk
  const auto decode = [&](auto store, auto dither) {
    for (int64_t j = 0; j < group; j += W) {
      const int64_t count = std::min<int64_t>(W, group - j);
      for (int v = 0; v < vectors; ++v) {
        for (int l = 0; l < LANES_W; ++l) {
          uint32_t word = 0;
          if constexpr (BITS == 3) {  // count is 16: the group is a multiple of 16 tokens
            uint16_t upper = 0;
            std::memcpy(&word, codes[v][l] + j / 4, 4);
            std::memcpy(&upper, codes[v][l] + group / 4 + j / 8, 2);
            high[v][l] = upper;
          } else if (count == W) {
            std::memcpy(&word, codes[v][l] + j * BITS / 8, 4);  // a constant size: inlined
          } else {
            std::memcpy(&word, codes[v][l] + j * BITS / 8, count * BITS / 8);
          }
          packed[v][l] = word;
        }
      }
      for (int64_t k = 0; k < count; ++k) {
        const U shift = V::splat_u((uint32_t)(k * (BITS == 3 ? 2 : BITS)));
        const int64_t t = j + k;
        if constexpr (decltype(dither)::value) {
          // runtime.noise's pairs, as encode_block draws them: element (feature c, token t0 + t) is
          // c * N + t0 + t in the blob's order, hash t & 7 of its 16-token chunk, half t & 8
          if (t % 16 == 0)
            for (int v = 0; v < vectors; ++v)
              for (int l = 0; l < LANES_W; ++l) {
                const uint64_t pair = (((uint64_t)((v0 + v) * LANES_W + l) * (uint64_t)N + (uint64_t)(t0 + t)) >> 4) * 8;
                chunk_low[v][l] = (uint32_t)pair;
                chunk_high[v][l] = key ^ ((uint32_t)(pair >> 32) * M1);
              }
        }
        for (int v = 0; v < vectors; ++v) {
          U code = (packed[v] >> shift) & V::splat_u(L);
          if constexpr (BITS == 3)
            code = (code & V::splat_u(3)) | (((high[v] >> V::splat_u((uint32_t)k)) & V::splat_u(1)) << 2);
          F value;
          if constexpr (decltype(dither)::value) {
            const U hash = fmix32(((chunk_low[v] + V::splat_u((uint32_t)(t & 7))) * V::splat_u(GOLDEN)) ^ chunk_high[v]);
            value = ((__builtin_convertvector((I)code, F) + 0.5f) - V::uniforms(hash, t & 8)) * scales[v] + lo[v];
          } else {
            value = __builtin_convertvector((I)code, F) * scales[v] + lo[v];
          }
          store(dst + (j + k) * C + v * LANES_W, code == marker[v] ? special[v] : value);
          // the next segment's line of this row, to be written: as in encode_block (1.03-1.45x)
          if (next_segment) __builtin_prefetch(dst + (j + k) * C + SEGMENT_FEATURES + v * LANES_W, 1);
        }
      }
    }
  };
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, bf16> && LANES_W == 16) {
    bool plain = true;
    for (int v = 0; v < vectors; ++v)
      for (int l = 0; l < LANES_W; ++l) plain &= plain_range(scales[v][l], lo[v][l]);
    if (plain && !dithered) return decode([](bf16* p, F v) { store16_native(p, v); }, std::false_type{});
  }
#endif
  if (dithered) return decode([](T* p, F v) { V::store(p, v); }, std::true_type{});
  decode([](T* p, F v) { V::store(p, v); }, std::false_type{});
}

// Blocks in token-major order, so that each thread reads whole rows of the matrix.
template <int BITS, typename T>
void encode_transposed_all(const T* x, int64_t N, int64_t C, int64_t group, uint8_t* blob, uint32_t key, float dmax,
                           float half_max) {
#if GACT_SIXTEEN_LANES
  if (C % 16 == 0) {
    const int64_t lanes = C / 16, blocks = (N / group) * lanes;
#pragma omp parallel for schedule(static) if (blocks > 8)
    for (int64_t b = 0; b < blocks; ++b)
      encode_block<BITS, T, SixteenLanes>(x, N, C, (b / lanes) * group, (b % lanes) * 16, group, C * (N / group), blob,
                                          key, dmax, half_max);
    return;
  }
#endif
  const int64_t lanes = C / 8, blocks = (N / group) * lanes;
#pragma omp parallel for schedule(static) if (blocks > 8)
  for (int64_t b = 0; b < blocks; ++b)
    encode_block<BITS, T, EightLanes>(x, N, C, (b / lanes) * group, (b % lanes) * 8, group, C * (N / group), blob, key,
                                      dmax, half_max);
}

template <int BITS, typename T, typename V>
void decode_segments(const uint8_t* blob, int64_t N, int64_t C, int64_t group, T* out, float dmax, bool dithered,
                     uint32_t key) {
  constexpr int64_t per_segment = SEGMENT_FEATURES / V::WIDTH;
  const int64_t vectors = C / V::WIDTH, segments = (vectors + per_segment - 1) / per_segment;
  const int64_t blocks = (N / group) * segments;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t v0 = (b % segments) * per_segment;
    decode_block<BITS, T, V>(blob, N, C, (b / segments) * group, v0, (int)std::min<int64_t>(per_segment, vectors - v0),
                             group, C * (N / group), out, dmax, dithered, key);
  }
}

template <int BITS, typename T>
void decode_transposed_all(const uint8_t* blob, int64_t N, int64_t C, int64_t group, T* out, float dmax, bool dithered,
                           uint32_t key) {
#if GACT_SIXTEEN_LANES
  // 16-bit outputs only: there sixteen lanes store 32 bytes a row and run 1.2-1.6x faster;
  // float32 gained at most 1.1x below 4 bits and lost at 4 and 8 (gathering sixteen words).
  if (C % 16 == 0 && sizeof(T) == 2)
    return decode_segments<BITS, T, SixteenLanes>(blob, N, C, group, out, dmax, dithered, key);
#endif
  decode_segments<BITS, T, EightLanes>(blob, N, C, group, out, dmax, dithered, key);
}

template <typename T>
int encode_transposed_typed(const T* x, int64_t N, int64_t C, int64_t group, uint8_t* blob, uint32_t key, int bits,
                            float dmax, float half_max) {
  switch (bits) {
    case 1: encode_transposed_all<1>(x, N, C, group, blob, key, dmax, half_max); return 0;
    case 2: encode_transposed_all<2>(x, N, C, group, blob, key, dmax, half_max); return 0;
    case 3: encode_transposed_all<3>(x, N, C, group, blob, key, dmax, half_max); return 0;
    case 4: encode_transposed_all<4>(x, N, C, group, blob, key, dmax, half_max); return 0;
    case 8: encode_transposed_all<8>(x, N, C, group, blob, key, dmax, half_max); return 0;
  }
  return 1;
}

template <typename T>
int decode_transposed_typed(const uint8_t* blob, int64_t N, int64_t C, int64_t group, T* out, int bits, float dmax,
                            bool dithered, uint32_t key) {
  switch (bits) {
    case 1: decode_transposed_all<1>(blob, N, C, group, out, dmax, dithered, key); return 0;
    case 2: decode_transposed_all<2>(blob, N, C, group, out, dmax, dithered, key); return 0;
    case 3: decode_transposed_all<3>(blob, N, C, group, out, dmax, dithered, key); return 0;
    case 4: decode_transposed_all<4>(blob, N, C, group, out, dmax, dithered, key); return 0;
    case 8: decode_transposed_all<8>(blob, N, C, group, out, dmax, dithered, key); return 0;
  }
  return 1;
}

// Bool masks, one bit an element (runtime.format): element k in bit k % 8 of byte k / 8.
// The torch reference spends a dozen full passes on this (casts, shifts, a sum); here
// eight elements are one multiply and one table lookup.
struct SpreadTable {  // byte b -> eight bytes, byte k holding bit k of b
  uint64_t bytes[256];
  constexpr SpreadTable() : bytes() {
    for (int b = 0; b < 256; ++b)
      for (int k = 0; k < 8; ++k) bytes[b] |= (uint64_t)((b >> k) & 1) << (8 * k);
  }
};
constexpr SpreadTable SPREAD{};

// The low bits of eight bytes, gathered into one byte: each byte's bit lands at 56 + its
// index, and no two partial products share a bit, so nothing carries.
inline uint8_t gather_bits(uint64_t eight) {
  return (uint8_t)(((eight & 0x0101010101010101ull) * 0x0102040810204080ull) >> 56);
}

struct CallKey { uint32_t k0, k1; };

// A call's key: given as [k0, k1], or (``from_state``) derived from a site's state as
// runtime.noise.call_key does.
inline CallKey call_key(const int64_t* key, int from_state) {
  const uint32_t k0 = (uint32_t)key[0];
  const uint32_t second = (uint32_t)key[1];
  return {k0, from_state ? fmix32((second * GOLDEN) ^ k0) : second};
}

inline int64_t body_bytes(int64_t numel, int64_t group, int bits) {
  const int64_t groups = (numel + group - 1) / group;
  return groups * 4 + groups * (group * bits / 8);
}

// Where a dithered blob keeps its key: the body rounded up to 8 bytes (runtime.format.key_offset).
inline int64_t key_offset(int64_t numel, int64_t group, int bits) { return (body_bytes(numel, group, bits) + 7) / 8 * 8; }

// k0 then k1, each little-endian, as runtime.reference.key_bytes writes them.
inline void store_key(uint8_t* at, CallKey key) {
  for (int b = 0; b < 4; ++b) {
    at[b] = (uint8_t)(key.k0 >> (8 * b));
    at[4 + b] = (uint8_t)(key.k1 >> (8 * b));
  }
}

inline CallKey load_key(const uint8_t* at) {
  CallKey key{0, 0};
  for (int b = 0; b < 4; ++b) {
    key.k0 |= (uint32_t)at[b] << (8 * b);
    key.k1 |= (uint32_t)at[4 + b] << (8 * b);
  }
  return key;
}

// Zeroes what follows the groups of a blob of ``nbytes`` (its padding and tag), then writes a
// dithered blob's key (runtime.format). Here rather than in Python, where slicing and zeroing
// the tail cost more than encoding a small tensor.
inline void finish_tail(uint8_t* blob, int64_t numel, int64_t group, int bits, int64_t nbytes, bool dithered,
                        CallKey key) {
  const int64_t body = body_bytes(numel, group, bits);
  if (nbytes > body) std::memset(blob + body, 0, nbytes - body);
  if (dithered) store_key(blob + key_offset(numel, group, bits), key);
}

// The hash word of the key a dithered blob keeps (0 for a plain blob, whose decode draws no noise).
inline uint32_t kept_word(const uint8_t* blob, int64_t numel, int64_t group, int bits, bool dithered) {
  if (!dithered) return 0u;
  const CallKey key = load_key(blob + key_offset(numel, group, bits));
  return call_word(key.k0, key.k1);
}

}  // namespace

// dtype: 0 float32, 1 bfloat16, 2 float16. Returns 0, or 1 for an unsupported width, 2 for
// an unsupported group size or dtype. ``nbytes``: the blob's length, whose tail this zeroes;
// ``dithered``: the blob keeps its call's key there too (runtime.format).
extern "C" int gact_encode(const void* x, int64_t numel, int64_t group, uint8_t* blob, int64_t nbytes,
                           const int64_t* key, int from_state, int bits, float dmax, float half_max, int dtype,
                           int dithered) {
  if (group > MAX_GROUP || group % 8) return 2;
  if (dtype != GACT_DTYPE) return 2;
  const CallKey call = call_key(key, from_state);
  const int status = encode_typed(static_cast<const Value*>(x), numel, group, blob, call_word(call.k0, call.k1), bits,
                                  dmax, half_max);
  if (!status) finish_tail(blob, numel, group, bits, nbytes, dithered, call);
  return status;
}

// The noise of elements first..first+count-1 (both multiples of 16), for tests of the index arithmetic.
extern "C" void gact_noise(uint64_t first, int64_t count, const int64_t* key, float* out) {
  const uint32_t word = call_word((uint32_t)key[0], (uint32_t)key[1]);
  for (int64_t j = 0; j < count; j += 16) {
    const u8 hashes = pair_hash8(first + j, word);
    const f8 low = uniforms(hashes, false), high = uniforms(hashes, true);
    std::memcpy(out + j, &low, sizeof(low));
    std::memcpy(out + j + 8, &high, sizeof(high));
  }
}

// A bool mask's bits into ceil(numel / 8) bytes at ``out``, and zeros up to its length ``nbytes``.
extern "C" void gact_pack_bool(const uint8_t* mask, int64_t numel, uint8_t* out, int64_t nbytes) {
  const int64_t whole = numel / 8;
#pragma omp parallel for schedule(static) if (whole > 262144)
  for (int64_t i = 0; i < whole; ++i) {
    uint64_t eight;
    std::memcpy(&eight, mask + 8 * i, 8);
    out[i] = gather_bits(eight);
  }
  if (numel % 8) {
    uint8_t last = 0;
    for (int64_t k = 0; k < numel % 8; ++k) last |= (uint8_t)((mask[8 * whole + k] & 1) << k);
    out[whole] = last;
  }
  const int64_t used = (numel + 7) / 8;
  if (nbytes > used) std::memset(out + used, 0, nbytes - used);
}

// The mirror: numel bools (bytes 0 or 1) at ``out``.
extern "C" void gact_unpack_bool(const uint8_t* packed, int64_t numel, uint8_t* out) {
  const int64_t whole = numel / 8;
#pragma omp parallel for schedule(static) if (whole > 262144)
  for (int64_t i = 0; i < whole; ++i) std::memcpy(out + 8 * i, &SPREAD.bytes[packed[i]], 8);
  for (int64_t k = 0; k < numel % 8; ++k) out[8 * whole + k] = (packed[whole] >> k) & 1;
}

struct FloatSpreadTable {  // byte b -> eight floats, float k holding bit k of b
  float floats[256][8];
  constexpr FloatSpreadTable() : floats() {
    for (int b = 0; b < 256; ++b)
      for (int k = 0; k < 8; ++k) floats[b][k] = (float)((b >> k) & 1);
  }
};
constexpr FloatSpreadTable FLOAT_SPREAD{};

// A mask's bits as floats 0 and 1 (for a backward that tests them: see runtime.ops.unpack_mask).
extern "C" void gact_unpack_mask(const uint8_t* packed, int64_t numel, float* out) {
  const int64_t whole = numel / 8;
#pragma omp parallel for schedule(static) if (whole > 262144)
  for (int64_t i = 0; i < whole; ++i) std::memcpy(out + 8 * i, FLOAT_SPREAD.floats[packed[i]], 8 * sizeof(float));
  for (int64_t k = 0; k < numel % 8; ++k) out[8 * whole + k] = (float)((packed[whole] >> k) & 1);
}

// dtype as for gact_encode; 3 when this machine cannot write float16 (no F16C): decode to float32.
// ``dithered``: the blob keeps its call's key (runtime.format), whose noise the decode subtracts.
extern "C" int gact_decode(const uint8_t* blob, int64_t numel, int64_t group, void* out, int bits, float dmax,
                           int dtype, int dithered) {
  if (group > MAX_GROUP || group % 8 || dtype != GACT_DTYPE || (dithered && group % 16)) return 2;
#if GACT_DTYPE == 2 && !defined(__F16C__)
  return 3;
#else
  return decode_typed(blob, numel, group, static_cast<Value*>(out), bits, dmax, dithered,
                      kept_word(blob, numel, group, bits, dithered));
#endif
}

// The blob of the transpose of a row-major [tokens, features] matrix: tokens a multiple of
// ``group``, ``group`` of 16, features of 8 (else 2); dtype and the rest as for gact_encode.
extern "C" int gact_encode_transposed(const void* x, int64_t tokens, int64_t features, int64_t group, uint8_t* blob,
                                      int64_t nbytes, const int64_t* key, int from_state, int bits, float dmax,
                                      float half_max, int dtype, int dithered) {
  if (group <= 0 || group % 16 || tokens % group || features % 8) return 2;
  if (dtype != GACT_DTYPE) return 2;
  const CallKey call = call_key(key, from_state);
  const int status = encode_transposed_typed(static_cast<const Value*>(x), tokens, features, group, blob,
                                             call_word(call.k0, call.k1), bits, dmax, half_max);
  if (!status) finish_tail(blob, tokens * features, group, bits, nbytes, dithered, call);
  return status;
}

// Decodes such a blob back into the row-major [tokens, features] matrix; answers and takes
// ``dithered`` as gact_decode.
extern "C" int gact_decode_transposed(const uint8_t* blob, int64_t tokens, int64_t features, int64_t group, void* out,
                                      int bits, float dmax, int dtype, int dithered) {
  if (group <= 0 || group % 16 || tokens % group || features % 8 || dtype != GACT_DTYPE) return 2;
#if GACT_DTYPE == 2 && !defined(__F16C__)
  return 3;
#else
  return decode_transposed_typed(blob, tokens, features, group, static_cast<Value*>(out), bits, dmax, dithered,
                                 kept_word(blob, tokens * features, group, bits, dithered));
#endif
}
