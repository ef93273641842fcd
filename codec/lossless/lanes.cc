#include "codec/lossless/lanes.h"

#include <bit>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <immintrin.h>
#include <tmmintrin.h>
#endif

#include "codec/cpu_features.h"

namespace ckptfs::lossless {
namespace {

template <typename U>
U LoadLe(const uint8_t* p) {
  U v = 0;
  for (size_t i = 0; i < sizeof(U); ++i) v |= static_cast<U>(static_cast<U>(p[i]) << (8 * i));
  return v;
}

// Portable reference loops; the SIMD paths below hand them their tails.
template <typename U>
void SplitScalar(bool rotate, const uint8_t* src, size_t begin, size_t lanes, uint8_t* const* planes) {
  constexpr unsigned W = sizeof(U);
  for (size_t i = begin; i < lanes; ++i) {
    U v = LoadLe<U>(src + i * W);
    if (rotate) v = std::rotl(v, 1);
    for (unsigned k = 0; k < W; ++k) planes[k][i] = static_cast<uint8_t>(v >> (8 * k));
  }
}

template <typename U>
void MergeScalar(bool rotate, const uint8_t* const* planes, size_t begin, size_t lanes, uint8_t* dst) {
  constexpr unsigned W = sizeof(U);
  for (size_t i = begin; i < lanes; ++i) {
    U v = 0;
    for (unsigned k = 0; k < W; ++k) v |= static_cast<U>(static_cast<U>(planes[k][i]) << (8 * k));
    if (rotate) v = std::rotr(v, 1);
    for (unsigned k = 0; k < W; ++k) dst[i * W + k] = static_cast<uint8_t>(v >> (8 * k));
  }
}

#if defined(__SSE2__)
// SSE2 is part of x86-64, so no runtime dispatch is needed.
inline __m128i Load(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline void Store(uint8_t* p, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }

size_t Split16(bool rotate, const uint8_t* src, size_t lanes, uint8_t* const* planes) {
  const __m128i lo_mask = _mm_set1_epi16(0xFF);
  size_t i = 0;
  for (; i + 16 <= lanes; i += 16) {
    __m128i a = Load(src + 2 * i), b = Load(src + 2 * i + 16);
    if (rotate) {
      a = _mm_or_si128(_mm_slli_epi16(a, 1), _mm_srli_epi16(a, 15));
      b = _mm_or_si128(_mm_slli_epi16(b, 1), _mm_srli_epi16(b, 15));
    }
    Store(planes[0] + i, _mm_packus_epi16(_mm_and_si128(a, lo_mask), _mm_and_si128(b, lo_mask)));
    Store(planes[1] + i, _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)));
  }
  return i;
}

size_t Merge16(bool rotate, const uint8_t* const* planes, size_t lanes, uint8_t* dst) {
  size_t i = 0;
  for (; i + 16 <= lanes; i += 16) {
    __m128i lo = Load(planes[0] + i), hi = Load(planes[1] + i);
    __m128i a = _mm_unpacklo_epi8(lo, hi), b = _mm_unpackhi_epi8(lo, hi);
    if (rotate) {
      a = _mm_or_si128(_mm_srli_epi16(a, 1), _mm_slli_epi16(a, 15));
      b = _mm_or_si128(_mm_srli_epi16(b, 1), _mm_slli_epi16(b, 15));
    }
    Store(dst + 2 * i, a);
    Store(dst + 2 * i + 16, b);
  }
  return i;
}

inline __m128i Rotl32(__m128i v) { return _mm_or_si128(_mm_slli_epi32(v, 1), _mm_srli_epi32(v, 31)); }
inline __m128i Rotr32(__m128i v) { return _mm_or_si128(_mm_srli_epi32(v, 1), _mm_slli_epi32(v, 31)); }

// Byte k of four registers of 32-bit lanes, packed into 16 bytes.
inline __m128i PlaneOf(const __m128i* v, int shift) {
  const __m128i m = _mm_set1_epi32(0xFF);
  __m128i x0 = _mm_and_si128(_mm_srl_epi32(v[0], _mm_cvtsi32_si128(shift)), m);
  __m128i x1 = _mm_and_si128(_mm_srl_epi32(v[1], _mm_cvtsi32_si128(shift)), m);
  __m128i x2 = _mm_and_si128(_mm_srl_epi32(v[2], _mm_cvtsi32_si128(shift)), m);
  __m128i x3 = _mm_and_si128(_mm_srl_epi32(v[3], _mm_cvtsi32_si128(shift)), m);
  return _mm_packus_epi16(_mm_packs_epi32(x0, x1), _mm_packs_epi32(x2, x3));
}

size_t Split32(bool rotate, const uint8_t* src, size_t lanes, uint8_t* const* planes) {
  size_t i = 0;
  for (; i + 16 <= lanes; i += 16) {
    __m128i v[4];
    for (int j = 0; j < 4; ++j) {
      v[j] = Load(src + 4 * i + 16 * j);
      if (rotate) v[j] = Rotl32(v[j]);
    }
    for (int k = 0; k < 4; ++k) Store(planes[k] + i, PlaneOf(v, 8 * k));
  }
  return i;
}

// With SSSE3, one byte shuffle per register groups each byte position of
// its four lanes, and a 4x4 transpose of 32-bit words makes the planes:
// about half the instructions of the SSE2 pack sequence.
__attribute__((target("ssse3"))) size_t Split32Ssse3(bool rotate, const uint8_t* src, size_t lanes,
                                                     uint8_t* const* planes) {
  const __m128i group = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  size_t i = 0;
  for (; i + 16 <= lanes; i += 16) {
    __m128i v[4];
    for (int j = 0; j < 4; ++j) {
      v[j] = Load(src + 4 * i + 16 * j);
      if (rotate) v[j] = Rotl32(v[j]);
      v[j] = _mm_shuffle_epi8(v[j], group);  // [b0 x4 | b1 x4 | b2 x4 | b3 x4]
    }
    __m128i t0 = _mm_unpacklo_epi32(v[0], v[1]), t1 = _mm_unpacklo_epi32(v[2], v[3]);
    __m128i t2 = _mm_unpackhi_epi32(v[0], v[1]), t3 = _mm_unpackhi_epi32(v[2], v[3]);
    Store(planes[0] + i, _mm_unpacklo_epi64(t0, t1));
    Store(planes[1] + i, _mm_unpackhi_epi64(t0, t1));
    Store(planes[2] + i, _mm_unpacklo_epi64(t2, t3));
    Store(planes[3] + i, _mm_unpackhi_epi64(t2, t3));
  }
  return i;
}

// AVX2 does 32 lanes a step: the SSSE3 byte grouping in each 128-bit half,
// a dword permute that gathers each byte position of 8 lanes into one
// 64-bit word, and a 4x4 transpose of 64-bit words.
#define CKPTFS_AVX2 __attribute__((target("avx2")))
CKPTFS_AVX2 inline __m256i Group32(__m256i v) {
  const __m256i group = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,  //
                                         0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm256_shuffle_epi8(v, group);  // a 4x4 byte transpose: its own inverse
}

CKPTFS_AVX2 size_t Split32Avx2(bool rotate, const uint8_t* src, size_t lanes, uint8_t* const* planes) {
  const __m256i gather = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  size_t i = 0;
  for (; i + 32 <= lanes; i += 32) {
    __m256i v[4];
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 4 * i + 32 * j));
      if (rotate) v[j] = _mm256_or_si256(_mm256_slli_epi32(v[j], 1), _mm256_srli_epi32(v[j], 31));
      v[j] = _mm256_permutevar8x32_epi32(Group32(v[j]), gather);  // 64-bit word k: byte k of 8 lanes
    }
    const __m256i t0 = _mm256_unpacklo_epi64(v[0], v[1]), t1 = _mm256_unpackhi_epi64(v[0], v[1]);
    const __m256i t2 = _mm256_unpacklo_epi64(v[2], v[3]), t3 = _mm256_unpackhi_epi64(v[2], v[3]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(planes[0] + i), _mm256_permute2x128_si256(t0, t2, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(planes[1] + i), _mm256_permute2x128_si256(t1, t3, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(planes[2] + i), _mm256_permute2x128_si256(t0, t2, 0x31));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(planes[3] + i), _mm256_permute2x128_si256(t1, t3, 0x31));
  }
  return i;
}

CKPTFS_AVX2 size_t Merge32Avx2(bool rotate, const uint8_t* const* planes, size_t lanes, uint8_t* dst) {
  const __m256i scatter = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);  // inverse of Split32Avx2's gather
  size_t i = 0;
  for (; i + 32 <= lanes; i += 32) {
    __m256i p[4];
    for (int k = 0; k < 4; ++k) p[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(planes[k] + i));
    const __m256i u0 = _mm256_unpacklo_epi64(p[0], p[1]), u1 = _mm256_unpackhi_epi64(p[0], p[1]);
    const __m256i u2 = _mm256_unpacklo_epi64(p[2], p[3]), u3 = _mm256_unpackhi_epi64(p[2], p[3]);
    const __m256i v[4] = {_mm256_permute2x128_si256(u0, u2, 0x20), _mm256_permute2x128_si256(u1, u3, 0x20),
                          _mm256_permute2x128_si256(u0, u2, 0x31), _mm256_permute2x128_si256(u1, u3, 0x31)};
    for (int j = 0; j < 4; ++j) {
      __m256i x = Group32(_mm256_permutevar8x32_epi32(v[j], scatter));
      if (rotate) x = _mm256_or_si256(_mm256_srli_epi32(x, 1), _mm256_slli_epi32(x, 31));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 4 * i + 32 * j), x);
    }
  }
  return i;
}

size_t Merge32(bool rotate, const uint8_t* const* planes, size_t lanes, uint8_t* dst) {
  size_t i = 0;
  for (; i + 16 <= lanes; i += 16) {
    __m128i p0 = Load(planes[0] + i), p1 = Load(planes[1] + i);
    __m128i p2 = Load(planes[2] + i), p3 = Load(planes[3] + i);
    __m128i lo01 = _mm_unpacklo_epi8(p0, p1), hi01 = _mm_unpackhi_epi8(p0, p1);
    __m128i lo23 = _mm_unpacklo_epi8(p2, p3), hi23 = _mm_unpackhi_epi8(p2, p3);
    __m128i r[4] = {_mm_unpacklo_epi16(lo01, lo23), _mm_unpackhi_epi16(lo01, lo23), _mm_unpacklo_epi16(hi01, hi23),
                    _mm_unpackhi_epi16(hi01, hi23)};
    for (int j = 0; j < 4; ++j) Store(dst + 4 * i + 16 * j, rotate ? Rotr32(r[j]) : r[j]);
  }
  return i;
}
#else
size_t Split16(bool, const uint8_t*, size_t, uint8_t* const*) { return 0; }
size_t Merge16(bool, const uint8_t* const*, size_t, uint8_t*) { return 0; }
size_t Split32(bool, const uint8_t*, size_t, uint8_t* const*) { return 0; }
size_t Split32Ssse3(bool, const uint8_t*, size_t, uint8_t* const*) { return 0; }
size_t Split32Avx2(bool, const uint8_t*, size_t, uint8_t* const*) { return 0; }
size_t Merge32Avx2(bool, const uint8_t* const*, size_t, uint8_t*) { return 0; }
size_t Merge32(bool, const uint8_t* const*, size_t, uint8_t*) { return 0; }
#endif

}  // namespace

void SplitLanes(unsigned w, bool rotate, const uint8_t* src, size_t lanes, uint8_t* const* planes) {
  if (lanes == 0) return;
  switch (w) {
    case 2:
      SplitScalar<uint16_t>(rotate, src, Split16(rotate, src, lanes, planes), lanes, planes);
      return;
    case 4:
      SplitScalar<uint32_t>(rotate, src,
                            CpuHasAvx2()    ? Split32Avx2(rotate, src, lanes, planes)
                            : CpuHasSsse3() ? Split32Ssse3(rotate, src, lanes, planes)
                                            : Split32(rotate, src, lanes, planes),
                            lanes, planes);
      return;
    case 8:
      SplitScalar<uint64_t>(rotate, src, 0, lanes, planes);
      return;
    default:
      std::memcpy(planes[0], src, lanes);
      return;
  }
}

void MergeLanes(unsigned w, bool rotate, const uint8_t* const* planes, size_t lanes, uint8_t* dst) {
  if (lanes == 0) return;
  switch (w) {
    case 2:
      MergeScalar<uint16_t>(rotate, planes, Merge16(rotate, planes, lanes, dst), lanes, dst);
      return;
    case 4:
      MergeScalar<uint32_t>(
          rotate, planes, CpuHasAvx2() ? Merge32Avx2(rotate, planes, lanes, dst) : Merge32(rotate, planes, lanes, dst),
          lanes, dst);
      return;
    case 8:
      MergeScalar<uint64_t>(rotate, planes, 0, lanes, dst);
      return;
    default:
      std::memcpy(dst, planes[0], lanes);
      return;
  }
}

}  // namespace ckptfs::lossless
