// Finds which fixed-size blocks of a buffer are entirely zero, so the
// encoder can store them as holes. The CPU version is the reference; the
// CUDA version (zero_scan.cu, built only when nvcc is present) must agree
// bit for bit (tests/unit/gpu_test.cc when a device is available).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ckptfs::gpu {

// out[i] = 1 if bytes [i*block, (i+1)*block) of data (clipped) are all zero.
void ZeroBlocksCpu(std::span<const uint8_t> data, size_t block, std::vector<uint8_t>* out);

// True when this build has CUDA and a device is usable.
bool CudaAvailable();
// GPU version; falls back to the CPU when CUDA is unavailable.
void ZeroBlocks(std::span<const uint8_t> data, size_t block, std::vector<uint8_t>* out);

}  // namespace ckptfs::gpu
