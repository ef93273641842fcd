// The CUDA ComputeDevice: the encoder's per-element steps on a GPU
// (kernels in gpu/kernels.cu, definitions shared with the CPU in
// codec/element_ops.h), so that its output is the CPU's, byte for byte.
//
// Memory is bounded: `memory_bytes` of device memory and as much pinned
// host memory, split into a few contexts (a stream and its buffers) that
// concurrent jobs take in turn. A job larger than a context's slot runs as
// several slices. Input already in pinned memory is copied straight to the
// device; other input is staged through the pinned buffers.
//
// When the build has no CUDA (nvcc absent), OpenCudaDevice says so.
#pragma once

#include <cstddef>
#include <memory>

#include "codec/compute_device.h"

namespace ckptfs::gpu {

struct CudaOptions {
  size_t memory_bytes = size_t{256} << 20;  // device memory (and pinned host memory) the device may hold
  int ordinal = 0;                          // which visible GPU
  // Time a chunk-sized job on the GPU and on the CPU at open, and keep jobs
  // on the CPU when the GPU is not faster (device=auto). Off: always offload
  // jobs of at least min_job_bytes() (device=gpu, benches, tests).
  bool calibrate = false;
};

// Whether this build has the CUDA implementation.
bool BuiltWithCuda();

// The GPU, ready for jobs; ENODEV with the reason when there is none that
// can run this build's kernels, ENOMEM when memory_bytes cannot be had.
Result<std::unique_ptr<ComputeDevice>> OpenCudaDevice(const CudaOptions& opts);

// Host memory the device copies from without staging (cudaHostAlloc);
// plain memory when the build or the machine has no CUDA.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool pinned() const { return pinned_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool pinned_ = false;
};

}  // namespace ckptfs::gpu
