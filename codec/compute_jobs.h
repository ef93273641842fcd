// Argument checks every ComputeDevice runs before touching a job, so that a
// caller's mistake is an InvalidArgument with a message, on every device,
// instead of an out-of-bounds access on one of them.
#pragma once

#include <string>

#include "codec/compute_device.h"

namespace ckptfs {

inline bool LaneWidthOk(unsigned w) { return w == 2 || w == 4 || w == 8; }

inline Status CheckJob(const SplitJob& j) {
  if (!LaneWidthOk(j.w))
    return Status::InvalidArgument("split: lane width " + std::to_string(j.w) + " is not 2, 4 or 8");
  if (j.src.size() % j.w != 0) return Status::InvalidArgument("split: source is not a whole number of lanes");
  if (j.planes.size() != j.w) return Status::InvalidArgument("split: need one plane per lane byte");
  for (uint8_t* p : j.planes) {
    if (p == nullptr && !j.src.empty()) return Status::InvalidArgument("split: null plane");
  }
  if (!j.hists.empty() && j.hists.size() != j.w) return Status::InvalidArgument("split: need one histogram per plane");
  if (j.hist_stride == 0) return Status::InvalidArgument("split: histogram stride 0");
  return Status::Ok();
}

inline Status CheckJob(const ResidualJob& j) {
  if (j.base.size() != j.raw.size() || j.out.size() != j.raw.size()) {
    return Status::InvalidArgument("residual: raw, base and output sizes differ");
  }
  uint64_t prev_end = 0;
  for (const LaneRun& r : j.runs) {
    if (!LaneWidthOk(r.width) || r.begin < prev_end || r.end < r.begin || r.end > j.raw.size() ||
        (r.end - r.begin) % r.width != 0) {
      return Status::InvalidArgument(
          "residual: lane runs must be sorted, disjoint, whole lanes of 2, 4 or 8 bytes "
          "inside the chunk");
    }
    prev_end = r.end;
  }
  return Status::Ok();
}

inline Status CheckJob(const QClassJob& j) {
  if (j.w.size() != j.r.size() || j.forced.size() != j.r.size() || j.out.size() != j.r.size()) {
    return Status::InvalidArgument("qclass: residual, weight, forced and output sizes differ");
  }
  return Status::Ok();
}

inline Status CheckJob(const NearestLevelJob& j) {
  if (j.out.size() != j.r.size()) return Status::InvalidArgument("nearest level: residual and output sizes differ");
  if (j.bounds.size() >= 0xFFFF) return Status::InvalidArgument("nearest level: too many levels");
  return Status::Ok();
}

}  // namespace ckptfs
