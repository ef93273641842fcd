// Which ComputeDevice the encoder gets for -o device=auto|cpu|gpu, and a
// line saying why, for the log.
#pragma once

#include <memory>
#include <string>

#include "codec/compute_device.h"
#include "gpu/cuda_device.h"

namespace ckptfs::gpu {

struct DeviceChoice {
  std::shared_ptr<const ComputeDevice> device;  // never null
  std::string why;                              // "compute device: ..."
};

// kAuto takes the GPU when one can run this build's kernels, and sends it
// jobs only if it measured faster than the CPU at open (CudaOptions::calibrate);
// else the CPU. kGpu always sends jobs to the GPU, and fails (ENODEV, saying
// why) without one; kCpu never touches CUDA.
Result<DeviceChoice> ChooseDevice(DeviceRequest request, const CudaOptions& cuda);

}  // namespace ckptfs::gpu
