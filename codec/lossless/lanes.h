// Splitting little-endian lanes into byte planes and merging them back, the
// hot loops of the lossless tensor codec. With `rotate`, each lane is first
// rotated left by one bit, so a float's sign moves to the bottom and its
// exponent fills the top byte (fp32, bf16) or the top bits (fp16, fp64).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckptfs::lossless {

// planes[k][i] = byte k of (maybe rotated) lane i; w is 1, 2, 4 or 8.
void SplitLanes(unsigned w, bool rotate, const uint8_t* src, size_t lanes, uint8_t* const* planes);

// Inverse of SplitLanes.
void MergeLanes(unsigned w, bool rotate, const uint8_t* const* planes, size_t lanes, uint8_t* dst);

}  // namespace ckptfs::lossless
