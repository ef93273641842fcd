// The build without nvcc: no GPU device, and plain memory for "pinned" buffers.
#include "gpu/cuda_device.h"

namespace ckptfs::gpu {

bool BuiltWithCuda() { return false; }

Result<std::unique_ptr<ComputeDevice>> OpenCudaDevice(const CudaOptions&) {
  return Status::Error(ENODEV,
                       "no usable GPU: this ckptfs was built without CUDA (no nvcc, or CKPTFS_WITH_CUDA=OFF, when it was configured)");
}

PinnedBuffer::PinnedBuffer(size_t bytes)
    : data_(static_cast<uint8_t*>(::operator new(bytes == 0 ? 1 : bytes))), size_(bytes) {}

PinnedBuffer::~PinnedBuffer() { ::operator delete(data_); }

}  // namespace ckptfs::gpu
