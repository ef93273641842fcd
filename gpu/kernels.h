// Launchers of the CUDA kernels behind gpu/cuda_device.h. Each works on
// device pointers, is queued on `stream` and returns the launch's error;
// the per-element work is codec/element_ops.h, shared with the CPU.
// Only gpu/kernels.cu (nvcc) defines these; host code sees plain C++.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "codec/compute_device.h"

namespace ckptfs::gpu {

inline constexpr unsigned kMaxPlanes = 8;
struct DevicePlanes {
  uint8_t* p[kMaxPlanes];
};

// planes.p[k][i] = byte k of (maybe rotated) lane i, for i < lanes.
cudaError_t LaunchSplit(unsigned w, bool rotate, const uint8_t* src, size_t lanes, DevicePlanes planes,
                        cudaStream_t stream);

// counts[k * 256 + b] += how many of planes.p[k][0, stride, 2*stride, ...
// (< lanes)] equal b, for k < w. `counts` must be zeroed first.
cudaError_t LaunchSampledHistograms(unsigned w, DevicePlanes planes, size_t lanes, size_t stride, uint32_t* counts,
                                    cudaStream_t stream);

// out = raw ^ base over n bytes, then zigzag lane differences over `runs`
// (device copy of `run_count` LaneRuns, offsets relative to raw, none with
// more than max_run_lanes lanes; run_count < 2^31, max_run_lanes < 2^28).
cudaError_t LaunchResidual(const uint8_t* raw, const uint8_t* base, uint8_t* out, size_t n, const LaneRun* runs,
                           size_t run_count, size_t max_run_lanes, cudaStream_t stream);

cudaError_t LaunchQClasses(const double* r, const double* w, const uint8_t* forced, uint32_t* out, size_t n,
                           cudaStream_t stream);

cudaError_t LaunchNearestLevels(const double* r, const double* bounds, uint32_t bound_count, uint16_t* out, size_t n,
                                cudaStream_t stream);

// A trivial kernel that proves this build's code runs on the device
// (cudaErrorNoKernelImageForDevice on an architecture it was not built for).
cudaError_t ProbeKernel(cudaStream_t stream);

}  // namespace ckptfs::gpu
