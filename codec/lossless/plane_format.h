// What the plane codec's encoder and decoder (plane_codec_encode.cc,
// plane_codec_decode.cc) share: the lane layout each dtype gets, which
// transforms apply to it, and the context split's buckets.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "codec/dtype.h"
#include "codec/lossless/entropy.h"

namespace ckptfs::lossless::plane {

inline constexpr unsigned kMaxLane = 8;
inline constexpr uint8_t kMaxDType = static_cast<uint8_t>(DType::kC128);
inline constexpr unsigned kMaxBuckets = 64;

// Complex numbers are pairs of floats whose parts share statistics, so
// they are coded as float lanes. Unknown data is coded as bytes.
inline unsigned LaneSize(DType t) {
  switch (t) {
    case DType::kC64:
      return 4;
    case DType::kC128:
      return 8;
    case DType::kUnknown:
      return 1;
    default:
      return DTypeSize(t);
  }
}

// The exponent regrouping only helps multi-byte IEEE-style floats; for fp8
// any bit permutation within the byte leaves order-0 statistics unchanged.
inline bool RotationApplies(DType t) { return DTypeIsFloat(t) && LaneSize(t) >= 2; }

// The predictor works on exponent plus 8 mantissa bits, which only fp32's
// rotated top two planes hold without the sign mixed in.
inline bool GridApplies(DType t) { return t == DType::kF32; }

struct BucketMap {
  unsigned count = 1;
  std::array<uint8_t, 256> of{};  // context byte -> bucket; bucket 0 pools the rare ones
};

inline std::array<size_t, kMaxBuckets + 1> BucketStarts(const BucketMap& m, const Histogram& ctx_hist) {
  std::array<size_t, kMaxBuckets + 1> start{};
  for (unsigned c = 0; c < 256; ++c) start[m.of[c] + 1] += ctx_hist[c];
  for (unsigned b = 0; b < m.count; ++b) start[b + 1] += start[b];
  return start;
}

}  // namespace ckptfs::lossless::plane
