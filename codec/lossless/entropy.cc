#include "codec/lossless/entropy.h"

#include <cmath>

namespace ckptfs::lossless {

Histogram ByteHistogram(std::span<const uint8_t> bytes) {
  // Four interleaved tables break the store-to-load dependency a single
  // table hits on runs of equal bytes (the common case in exponent planes).
  uint32_t part[4][256] = {};
  const uint8_t* p = bytes.data();
  size_t n = bytes.size();
  // 32-bit sub-counters must not overflow: flush every 2^30 bytes.
  Histogram h{};
  while (n > 0) {
    size_t block = n < (size_t{1} << 30) ? n : (size_t{1} << 30);
    size_t i = 0;
    for (; i + 4 <= block; i += 4) {
      ++part[0][p[i]];
      ++part[1][p[i + 1]];
      ++part[2][p[i + 2]];
      ++part[3][p[i + 3]];
    }
    for (; i < block; ++i) ++part[0][p[i]];
    for (int s = 0; s < 256; ++s) {
      h[s] += uint64_t{part[0][s]} + part[1][s] + part[2][s] + part[3][s];
      part[0][s] = part[1][s] = part[2][s] = part[3][s] = 0;
    }
    p += block;
    n -= block;
  }
  return h;
}

double HistogramEntropyBits(const Histogram& h) {
  uint64_t total = 0;
  for (uint64_t c : h) total += c;
  if (total == 0) return 0.0;
  // sum -c*log2(c/N) = N*log2(N) - sum c*log2(c): one log per symbol, no division.
  double sum = 0.0;
  for (uint64_t c : h) {
    if (c != 0) sum += static_cast<double>(c) * std::log2(static_cast<double>(c));
  }
  double bits = static_cast<double>(total) * std::log2(static_cast<double>(total)) - sum;
  return bits > 0.0 ? bits : 0.0;  // rounding can leave -epsilon for one symbol
}

double Order0EntropyBits(std::span<const uint8_t> bytes) { return HistogramEntropyBits(ByteHistogram(bytes)); }

unsigned DistinctSymbols(const Histogram& h) {
  unsigned n = 0;
  for (uint64_t c : h) n += c != 0;
  return n;
}

}  // namespace ckptfs::lossless
