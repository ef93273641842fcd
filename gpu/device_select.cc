#include "gpu/device_select.h"

namespace ckptfs::gpu {

Result<DeviceChoice> ChooseDevice(DeviceRequest request, const CudaOptions& cuda) {
  // The CPU device is a static: share it without ownership.
  std::shared_ptr<const ComputeDevice> cpu(&CpuComputeDevice(), [](const ComputeDevice*) {});
  if (request == DeviceRequest::kCpu) return DeviceChoice{cpu, "compute device: cpu (device=cpu)"};
  CudaOptions opts = cuda;
  opts.calibrate = request == DeviceRequest::kAuto;
  Result<std::unique_ptr<ComputeDevice>> gpu = OpenCudaDevice(opts);
  if (gpu.ok()) {
    std::shared_ptr<const ComputeDevice> dev(std::move(*gpu));
    return DeviceChoice{dev, "compute device: " + dev->Name() + " (device=" + DeviceRequestName(request) + ")"};
  }
  if (request == DeviceRequest::kGpu) {
    return gpu.status().WithContext("device=gpu");
  }
  return DeviceChoice{cpu, "compute device: cpu (device=auto, " + gpu.status().message() + ")"};
}

}  // namespace ckptfs::gpu
