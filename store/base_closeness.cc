#include "store/base_closeness.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "codec/lossy/float_bits.h"

namespace ckptfs {
namespace {

constexpr uint64_t kSampleBytes = 4096;
// What a differing non-finite element adds: more than any finite pair.
constexpr double kFar = 1e30;

double ElementAsDouble(DType t, const uint8_t* p, size_t i) {
  if (t == DType::kF64) {
    double d;
    std::memcpy(&d, p + 8 * i, 8);
    return d;
  }
  return lossy::BitsToFloat(t, lossy::LoadBits(t, p, i));
}

bool ComparesAsFloat(DType t) { return t == DType::kF64 || lossy::LossyDTypeSupported(t); }

// The largest range every candidate holds.
std::optional<size_t> SharedLargestRange(std::span<const TensorRange> ranges, std::span<const BaseChoice> candidates) {
  std::optional<size_t> best;
  for (size_t i = 0; i < ranges.size(); ++i) {
    bool everywhere = true;
    for (const BaseChoice& c : candidates) everywhere &= i < c.base_offset.size() && c.base_offset[i].has_value();
    if (everywhere && (!best || ranges[i].length > ranges[*best].length)) best = i;
  }
  return best;
}

}  // namespace

double SampleDistance(DType t, std::span<const uint8_t> a, std::span<const uint8_t> b) {
  double d = 0;
  if (!ComparesAsFloat(t)) {
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) d += a[i] != b[i];
    return d;
  }
  const size_t es = DTypeSize(t), n = std::min(a.size(), b.size()) / es;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(a.data() + i * es, b.data() + i * es, es) == 0) continue;
    const double x = ElementAsDouble(t, a.data(), i), y = ElementAsDouble(t, b.data(), i);
    d += std::isfinite(x) && std::isfinite(y) ? std::fabs(x - y) : kFar;
  }
  return d;
}

size_t ClosestBase(const ByteSource& file, std::span<const TensorRange> ranges,
                   std::span<const BaseChoice> candidates, BaseSource& bases) {
  if (candidates.size() < 2) return 0;
  const std::optional<size_t> r = SharedLargestRange(ranges, candidates);
  if (!r) return 0;
  const TensorRange& t = ranges[*r];
  const uint64_t es = std::max<uint64_t>(1, DTypeSize(t.dtype));
  const uint64_t len = std::min(kSampleBytes, t.length) / es * es;
  const uint64_t within = (t.length - len) / 2 / es * es;  // the middle: past any leading padding or bias
  if (len == 0) return 0;
  std::vector<uint8_t> mine(len), theirs(len);
  if (!file.ReadAt(t.offset + within, mine).ok()) return 0;
  size_t best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (size_t c = 0; c < candidates.size(); ++c) {
    if (!bases.ReadPackRange(candidates[c].pack, *candidates[c].base_offset[*r] + within, theirs).ok()) continue;
    const double d = SampleDistance(t.dtype, mine, theirs);
    // Between equally close ones (copies of one save, a lossless file and
    // its lossy twin that reconstructs exactly), the shallower chain costs
    // every read and every delta planned against it less.
    const bool shallower = d == best_distance && candidates[c].depth < candidates[best].depth;
    if (d < best_distance || shallower) best = c, best_distance = d;
  }
  return best;
}

}  // namespace ckptfs
