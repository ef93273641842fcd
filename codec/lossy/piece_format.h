// What the lossy piece encoder and decoder (quantizer_encode.cc,
// quantizer_decode.cc) share: the header flag, the level storage and the
// reconstruction of an element from its symbol, which must give the same
// bits on both sides. Both files are compiled with -ffp-contract=off.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "codec/dtype.h"
#include "codec/lossy/float_bits.h"
#include "codec/lossy/quantizer.h"

namespace ckptfs::lossy::piece {

inline constexpr uint8_t kFlagAgainstBase = 1;
inline constexpr uint8_t kFlagUniformGrid = 2;  // version 2, kValue

// Multiples of a grid's first level beyond this are refused: the levels
// must stay exact in a double and far from overflowing an int64.
inline constexpr int64_t kMaxGridMultiple = int64_t{1} << 40;

// A log-domain level's step beyond this is refused: every bit pattern
// lies within 2^32 of every other, so no encoder needs more, and adding a
// step to one can then never overflow.
inline constexpr int64_t kMaxLevelStep = int64_t{1} << 32;

inline uint64_t ZigZag(int64_t v) { return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63); }
inline int64_t UnZigZag(uint64_t v) { return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1); }

inline uint32_t ClampBits(DType t, int64_t bits) {
  return static_cast<uint32_t>(std::clamp<int64_t>(bits, 0, MaxFiniteBits(t)));
}

// Levels as the decoder will see them: f32 values, or whole bit-pattern steps.
struct StoredLevels {
  std::vector<float> value;
  std::vector<int64_t> steps;
  std::optional<UniformGrid> grid;  // value holds its levels, stored as the grid
};

// Level i of a grid of k levels, as both sides compute it.
inline float GridLevel(const UniformGrid& g, unsigned i) {
  return static_cast<float>(static_cast<double>(g.step) * static_cast<double>(g.first + static_cast<int64_t>(i)));
}

// The element a symbol decodes to: the encoder's reconstruction. The
// decoder (quantizer_decode.cc, Rebuild) computes the same per element
// without branching on the symbol; tests check both give the same bits.
inline uint32_t Reconstruct(DType t, Domain d, uint32_t pred_bits, unsigned sym, const StoredLevels& lv) {
  if (sym == 0) return pred_bits;
  if (d == Domain::kValue) return FloatToBits(t, BitsToFloat(t, pred_bits) + lv.value[sym - 1]);
  return ClampBits(t, static_cast<int64_t>(pred_bits) + lv.steps[sym - 1]);
}

}  // namespace ckptfs::lossy::piece
