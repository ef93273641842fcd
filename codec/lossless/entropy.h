// Order-0 statistics of byte streams: the yardstick the lossless tensor
// codec is measured against, and what it uses to choose transforms cheaply.
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace ckptfs::lossless {

using Histogram = std::array<uint64_t, 256>;

// Counts of each byte value.
Histogram ByteHistogram(std::span<const uint8_t> bytes);

// Total bits an ideal order-0 coder needs for a stream with these counts:
// sum over symbols of -count * log2(count / total). 0 for empty or single-symbol input.
double HistogramEntropyBits(const Histogram& h);

// Same as HistogramEntropyBits(ByteHistogram(bytes)).
double Order0EntropyBits(std::span<const uint8_t> bytes);

// Number of byte values that occur at least once.
unsigned DistinctSymbols(const Histogram& h);

}  // namespace ckptfs::lossless
