// What the grid predictor's fit (grid_encode.cc) and its transform
// (grid_decode.cc) share: how terms scale into fields and how residuals are
// biased or folded.
#pragma once

#include <cstdint>

namespace ckptfs::lossless::grid {

// Terms are stored in units of 8 (1/32 octave of F's 1/256-octave scale).
inline constexpr int kTermShift = 3;
inline constexpr uint16_t kBias = 0x8000;

inline uint16_t Scaled(uint32_t term) { return static_cast<uint16_t>(term << kTermShift); }

inline uint16_t Fold(uint16_t d) {
  return static_cast<uint16_t>((d << 1) ^ static_cast<uint16_t>(static_cast<int16_t>(d) >> 15));
}
inline uint16_t Unfold(uint16_t z) { return static_cast<uint16_t>((z >> 1) ^ (0u - (z & 1u))); }

}  // namespace ckptfs::lossless::grid
