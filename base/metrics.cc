#include "base/metrics.h"

#include <algorithm>

namespace ckptfs {

void ErrorHistogram::Observe(double v) {
  const size_t i = static_cast<size_t>(std::lower_bound(kBounds.begin(), kBounds.end(), v) - kBounds.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

ErrorHistogram::Snapshot ErrorHistogram::Take() const {
  Snapshot s;
  uint64_t running = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = running;
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

Metrics& GlobalMetrics() {
  static Metrics m;
  return m;
}

}  // namespace ckptfs
