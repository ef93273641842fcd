#include "cache/read_order.h"

#include <algorithm>

namespace ckptfs {

ReadOrder::ReadOrder(std::vector<Range> ranges) : order_(std::move(ranges)) {
  by_offset_.reserve(order_.size());
  for (uint32_t i = 0; i < order_.size(); ++i) by_offset_.push_back(Start{order_[i].begin, i});
  std::sort(by_offset_.begin(), by_offset_.end(), [](const Start& a, const Start& b) { return a.begin < b.begin; });
}

std::vector<uint64_t> ReadOrder::ChunksAfter(uint64_t offset, uint64_t chunk_bytes, uint64_t chunk_count,
                                             uint64_t max_chunks) const {
  std::vector<uint64_t> out;
  if (chunk_bytes == 0 || max_chunks == 0) return out;
  auto it = std::upper_bound(by_offset_.begin(), by_offset_.end(), offset,
                             [](uint64_t off, const Start& s) { return off < s.begin; });
  if (it == by_offset_.begin()) return out;
  const uint32_t rank = std::prev(it)->rank;
  const Range& here = order_[rank];
  if (offset >= here.end) return out;
  auto in_here = [&](uint64_t c) { return c >= here.begin / chunk_bytes && c <= (here.end - 1) / chunk_bytes; };
  // Bounded per read however many small records share the chunks listed.
  const size_t stop = std::min(order_.size(), size_t{rank} + 1 + kMaxRecordsAhead);
  for (size_t r = rank + 1; r < stop && out.size() < max_chunks; ++r) {
    const Range& next = order_[r];
    if (next.end <= next.begin) continue;
    const uint64_t last = std::min((next.end - 1) / chunk_bytes, chunk_count == 0 ? 0 : chunk_count - 1);
    for (uint64_t c = next.begin / chunk_bytes; c <= last && out.size() < max_chunks; ++c) {
      // Consecutive records share chunks: each is listed once.
      if (!in_here(c) && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
    }
  }
  return out;
}

}  // namespace ckptfs
