// How a GPU job is cut into slices that fit one context's buffers. Host
// code only, shared by the CUDA device and the tests' emulated device, so
// the cutting is tested on machines without a GPU.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "codec/compute_device.h"

namespace ckptfs::gpu {

// Split slices start on multiples of this many lanes, which keeps the
// sampled histograms' grid (a stride dividing it) the same in every slice.
inline constexpr size_t kSliceLaneAlign = 4096;

// Lanes per split slice for a slot of `slot` bytes.
inline size_t SplitSliceLanes(unsigned w, size_t slot) {
  return std::max<size_t>(slot / w / kSliceLaneAlign * kSliceLaneAlign, kSliceLaneAlign);
}

// Where a residual slice starting at `begin` may end: at most `slot` bytes
// on, and never inside a lane of a run (a run's lanes start at its begin).
inline size_t ResidualSliceEnd(const ResidualJob& job, size_t begin, size_t slot) {
  size_t end = std::min(job.raw.size(), begin + slot);
  for (const LaneRun& r : job.runs) {
    if (r.begin < end && end < r.end) end = r.begin + (end - r.begin) / r.width * r.width;
  }
  return end;
}

// The runs' parts inside [begin, end), relative to begin; `max_lanes` gets
// the most lanes any of them has.
inline std::vector<LaneRun> RunsInSlice(const ResidualJob& job, size_t begin, size_t end, size_t* max_lanes) {
  std::vector<LaneRun> local;
  *max_lanes = 0;
  for (const LaneRun& r : job.runs) {
    const uint64_t b = std::max<uint64_t>(r.begin, begin), e = std::min<uint64_t>(r.end, end);
    if (b >= e) continue;
    local.push_back({b - begin, e - begin, r.width});
    *max_lanes = std::max<size_t>(*max_lanes, (e - b) / r.width);
  }
  return local;
}

}  // namespace ckptfs::gpu
