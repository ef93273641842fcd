#include "codec/compute_device.h"

#include "codec/compute_jobs.h"
#include "codec/element_ops.h"
#include "codec/lossless/lanes.h"

namespace ckptfs {
namespace {

void SampledCounts(const uint8_t* plane, size_t n, size_t stride, ByteCounts* h) {
  h->fill(0);
  for (size_t i = 0; i < n; i += stride) ++(*h)[plane[i]];
}

class CpuDevice final : public ComputeDevice {
 public:
  std::string Name() const override { return "cpu"; }
  bool accelerated() const override { return false; }
  size_t min_job_bytes() const override { return 0; }

  Status Split(const SplitJob& job) const override {
    RETURN_IF_ERROR(CheckJob(job));
    const size_t lanes = job.src.size() / job.w;
    lossless::SplitLanes(job.w, job.rotate, job.src.data(), lanes, job.planes.data());
    for (size_t k = 0; k < job.hists.size(); ++k) SampledCounts(job.planes[k], lanes, job.hist_stride, &job.hists[k]);
    return Status::Ok();
  }

  Status Residual(const ResidualJob& job) const override {
    RETURN_IF_ERROR(CheckJob(job));
    const uint8_t* raw = job.raw.data();
    const uint8_t* base = job.base.data();
    uint8_t* out = job.out.data();
    for (size_t i = 0; i < job.raw.size(); ++i) out[i] = raw[i] ^ base[i];
    for (const LaneRun& run : job.runs) {
      for (uint64_t at = run.begin; at < run.end; at += run.width) ops::DiffLaneW(run.width, raw, base, out, at);
    }
    return Status::Ok();
  }

  Status QClasses(const QClassJob& job) const override {
    RETURN_IF_ERROR(CheckJob(job));
    for (size_t i = 0; i < job.r.size(); ++i) {
      job.out[i] = job.forced[i] ? ops::kQClassForced : ops::QClassOf(job.w[i], job.r[i]);
    }
    return Status::Ok();
  }

  Status NearestLevels(const NearestLevelJob& job) const override {
    RETURN_IF_ERROR(CheckJob(job));
    const uint32_t nb = static_cast<uint32_t>(job.bounds.size());
    for (size_t i = 0; i < job.r.size(); ++i) job.out[i] = ops::NearestLevelIndex(job.bounds.data(), nb, job.r[i]);
    return Status::Ok();
  }
};

}  // namespace

const ComputeDevice& CpuComputeDevice() {
  static const CpuDevice cpu;
  return cpu;
}

Result<DeviceRequest> ParseDeviceRequest(const std::string& text) {
  if (text == "auto") return DeviceRequest::kAuto;
  if (text == "cpu") return DeviceRequest::kCpu;
  if (text == "gpu" || text == "cuda") return DeviceRequest::kGpu;
  return Status::InvalidArgument("device=" + text +
                                 ": use auto (a GPU when one is visible, else the CPU), cpu, or gpu (fail "
                                 "without one)");
}

const char* DeviceRequestName(DeviceRequest r) {
  switch (r) {
    case DeviceRequest::kAuto:
      return "auto";
    case DeviceRequest::kCpu:
      return "cpu";
    case DeviceRequest::kGpu:
      return "gpu";
  }
  return "?";
}

}  // namespace ckptfs
