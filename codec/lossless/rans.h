// Order-0 rANS byte coder (32-bit states, 16-bit renormalization, eight
// interleaved states). Produces a self-describing blob:
//
//   varint  symbol_count                (0: nothing follows)
//   u8      mode                        0 = run of one symbol, 1 = rANS,
//                                       2 = rANS with one state
//   run:    u8 symbol
//   rANS:   u8 scale_bits (8..12)
//           u8 distinct_symbols - 1
//           symbol set: ascending list if <= 32 distinct, else 32-byte bitmap
//           varint freq-1 for each present symbol but the last (implied)
//           8 x u32 final encoder states
//           8 x varint stream length in 16-bit words
//           8 streams of little-endian 16-bit words, one per state
//           (symbol i belongs to state i % 8)
//   mode 2: as rANS with one state: scale, symbols, frequencies,
//           u32 final state, varint stream length, one stream
//
// Decoding is memory-safe on arbitrary input: every read is bounds-checked,
// and a stream whose states do not return to their initial value or that
// leaves bytes unread is reported as corrupt.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "codec/lossless/entropy.h"

namespace ckptfs::lossless {

inline constexpr unsigned kRansMaxScaleBits = 12;
inline constexpr unsigned kRansMinScaleBits = 8;

// Scales `h` (which must count `total` > 0 symbols) to frequencies summing
// to exactly 1 << scale_bits, never giving 0 to a present symbol, and
// adjusting rounding so the coded-size loss is minimal.
std::array<uint32_t, 256> NormalizeFrequencies(const Histogram& h, uint64_t total, unsigned scale_bits);

// Appends the blob for `in` to `out`. `hist` may be passed when the caller
// already has the histogram of `in` (it is computed otherwise).
void RansEncode(std::span<const uint8_t> in, std::vector<uint8_t>* out, const Histogram* hist = nullptr);

// For short inputs, whose tables weigh more than their decoding speed:
// below kRansOneStateMax symbols one state (mode 2) instead of eight (35
// bytes fewer), and the scale whose table and payload together are the
// smallest rather than the finest. RansDecode reads both.
inline constexpr uint64_t kRansOneStateMax = 1u << 14;
void RansEncodeCompact(std::span<const uint8_t> in, std::vector<uint8_t>* out);

// Symbol count recorded in a blob's header.
Result<uint64_t> RansDecodedSize(std::span<const uint8_t> blob);

// Decodes `blob` into exactly out.size() bytes; a blob of a different
// length, or one that does not decode cleanly, is Corruption.
Status RansDecode(std::span<const uint8_t> blob, std::span<uint8_t> out);

}  // namespace ckptfs::lossless
