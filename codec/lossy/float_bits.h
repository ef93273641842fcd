// Exact conversions between the floating-point element types lossy mode
// touches (f32, f16, bf16) and f32, done on bit patterns so that every
// machine (and every GPU) decodes a lossy stream to the same bytes: no
// libm, no rounding mode, no fused multiply-add.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "codec/dtype.h"

namespace ckptfs::lossy {

inline bool LossyDTypeSupported(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// Mantissa bits: one unit of the integer bit pattern of a positive float is
// 2^-mantissa of a doubling, which makes the pattern a piecewise-linear log2.
inline unsigned MantissaBits(DType t) { return t == DType::kF32 ? 23 : t == DType::kF16 ? 10 : 7; }

// Largest finite positive value's bit pattern.
inline uint32_t MaxFiniteBits(DType t) { return t == DType::kF32 ? 0x7F7FFFFFu : t == DType::kF16 ? 0x7BFFu : 0x7F7Fu; }

inline uint32_t LoadBits(DType t, const uint8_t* p, size_t i) {
  if (t == DType::kF32) {
    uint32_t v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  uint16_t v;
  std::memcpy(&v, p + 2 * i, 2);
  return v;
}

inline void StoreBits(DType t, uint8_t* p, size_t i, uint32_t bits) {
  if (t == DType::kF32) {
    std::memcpy(p + 4 * i, &bits, 4);
  } else {
    const uint16_t v = static_cast<uint16_t>(bits);
    std::memcpy(p + 2 * i, &v, 2);
  }
}

inline bool BitsNegativeOrNonFinite(DType t, uint32_t bits) {
  if (t == DType::kF32) return (bits >> 31) != 0 || (bits & 0x7F800000u) == 0x7F800000u;
  if (t == DType::kF16) return (bits >> 15) != 0 || (bits & 0x7C00u) == 0x7C00u;
  return (bits >> 15) != 0 || (bits & 0x7F80u) == 0x7F80u;
}

inline float HalfBitsToFloat(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while ((man & 0x400) == 0) man <<= 1, --exp;
    bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
  }
  return std::bit_cast<float>(bits);
}

// Round to nearest, ties to even; NaN stays NaN, overflow becomes infinity.
inline uint32_t FloatToHalfBits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) return sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u : 0u);
  if (ax >= 0x477FF000u) return sign | 0x7C00u;  // rounds past the largest half
  if (ax < 0x38800000u) {                        // half subnormal or zero
    if (ax < 0x33000000u) return sign;           // below half the smallest subnormal
    const uint32_t exp = ax >> 23;
    const uint32_t man = (ax & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14..24
    const uint32_t half = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    return sign | (half + (rem > mid || (rem == mid && (half & 1))));
  }
  const uint32_t rebias = ax - 0x38000000u;  // exponent 127 -> 15
  const uint32_t half = rebias >> 13;
  const uint32_t rem = rebias & 0x1FFFu;
  return sign | (half + (rem > 0x1000u || (rem == 0x1000u && (half & 1))));
}

inline float BitsToFloat(DType t, uint32_t bits) {
  if (t == DType::kF32) return std::bit_cast<float>(bits);
  if (t == DType::kF16) return HalfBitsToFloat(bits);
  return std::bit_cast<float>(bits << 16);
}

inline uint32_t FloatToBits(DType t, float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if (t == DType::kF32) return x;
  if (t == DType::kF16) return FloatToHalfBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (x >> 16) | 0x40u;  // quiet NaN
  return (x + 0x7FFFu + ((x >> 16) & 1)) >> 16;
}

}  // namespace ckptfs::lossy
