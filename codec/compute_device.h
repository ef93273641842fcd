// The encoder's data-parallel steps, behind one interface so that a GPU can
// run them (gpu/cuda_device.h) while the CPU stays the reference
// (CpuComputeDevice). Every step is exact integer or comparison work whose
// result is defined element by element (codec/element_ops.h), so a stream
// encoded with any device is byte-identical to the CPU's: the device never
// makes a choice that the stream would have to record.
//
// Encoders take a `const ComputeDevice*` in their options; null means the
// CPU inline. Jobs smaller than min_job_bytes() run inline too, since a GPU
// round trip costs more than the work.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "base/status.h"

namespace ckptfs {

// Counts of each byte value (same type as lossless::Histogram).
using ByteCounts = std::array<uint64_t, 256>;

// Splits little-endian lanes into byte planes: planes[k][i] = byte k of lane
// i, rotated left by one bit first when `rotate`. With `hists` non-empty,
// hists[k] also receives the histogram of planes[k] at lanes 0, stride,
// 2*stride, ... (the encoder's sampled histogram).
struct SplitJob {
  unsigned w = 4;  // 2, 4 or 8
  bool rotate = false;
  std::span<const uint8_t> src;      // w * lanes bytes
  std::span<uint8_t* const> planes;  // w pointers to `lanes` bytes each
  size_t hist_stride = 1;
  std::span<ByteCounts> hists;  // empty, or w histograms (overwritten)
};

// A run of whole w-byte lanes, chunk-relative, for ResidualJob.
struct LaneRun {
  uint64_t begin = 0;
  uint64_t end = 0;    // end - begin is a multiple of width
  unsigned width = 0;  // 2, 4 or 8
};

// The delta residual of a chunk against its base (codec/delta_chunk.h):
// zigzag(raw - base) of each lane inside `runs` (sorted, disjoint), raw ^
// base for every other byte.
struct ResidualJob {
  std::span<const uint8_t> raw;
  std::span<const uint8_t> base;  // raw.size() bytes
  std::span<const LaneRun> runs;
  std::span<uint8_t> out;  // raw.size() bytes
};

// Lossy prune-mask classes (codec/lossy/quantizer.cc): out[i] = the top bits
// of the double w[i] * r[i] * r[i], or UINT32_MAX where forced[i] != 0.
struct QClassJob {
  std::span<const double> r;
  std::span<const double> w;
  std::span<const uint8_t> forced;
  std::span<uint32_t> out;
};

// Lossy level assignment: out[i] = the number of bounds <= r[i] (bounds
// ascending), i.e. the index of the nearest level.
struct NearestLevelJob {
  std::span<const double> r;
  std::span<const double> bounds;
  std::span<uint16_t> out;
};

class ComputeDevice {
 public:
  virtual ~ComputeDevice() = default;
  // "cpu", or the GPU's index and name.
  virtual std::string Name() const = 0;
  virtual bool accelerated() const = 0;
  // Jobs with fewer input bytes are better run inline on the CPU.
  virtual size_t min_job_bytes() const = 0;
  // Safe to call from several threads; a GPU serialises or interleaves them.
  virtual Status Split(const SplitJob& job) const = 0;
  virtual Status Residual(const ResidualJob& job) const = 0;
  virtual Status QClasses(const QClassJob& job) const = 0;
  virtual Status NearestLevels(const NearestLevelJob& job) const = 0;
};

// The reference implementation (always available).
const ComputeDevice& CpuComputeDevice();

// Whether `dev` should take a job of `bytes` input bytes.
inline bool Offload(const ComputeDevice* dev, size_t bytes) {
  return dev != nullptr && dev->accelerated() && bytes >= dev->min_job_bytes();
}

// What the user asked for with -o device=...
enum class DeviceRequest { kAuto, kCpu, kGpu };
Result<DeviceRequest> ParseDeviceRequest(const std::string& text);
const char* DeviceRequestName(DeviceRequest r);

}  // namespace ckptfs
