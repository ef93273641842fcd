// CUDA zero-block scan: one thread block per data block, a shared flag.
#include <cuda_runtime.h>

#include "gpu/zero_scan.h"

namespace ckptfs::gpu {
namespace {

__global__ void ZeroBlocksKernel(const uint8_t* data, size_t size, size_t block, uint8_t* out) {
  __shared__ int nonzero;
  const size_t b = blockIdx.x;
  if (threadIdx.x == 0) nonzero = 0;
  __syncthreads();
  const size_t begin = b * block;
  const size_t end = begin + block < size ? begin + block : size;
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    if (data[i] != 0) {
      nonzero = 1;
      break;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) out[b] = nonzero ? 0 : 1;
}

}  // namespace

bool CudaAvailable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void ZeroBlocks(std::span<const uint8_t> data, size_t block, std::vector<uint8_t>* out) {
  if (!CudaAvailable() || block == 0 || data.empty()) {
    ZeroBlocksCpu(data, block, out);
    return;
  }
  const size_t n = (data.size() + block - 1) / block;
  uint8_t* d_data = nullptr;
  uint8_t* d_out = nullptr;
  if (cudaMalloc(&d_data, data.size()) != cudaSuccess || cudaMalloc(&d_out, n) != cudaSuccess) {
    cudaFree(d_data);
    ZeroBlocksCpu(data, block, out);
    return;
  }
  cudaMemcpy(d_data, data.data(), data.size(), cudaMemcpyHostToDevice);
  ZeroBlocksKernel<<<static_cast<unsigned>(n), 256>>>(d_data, data.size(), block, d_out);
  out->assign(n, 0);
  cudaMemcpy(out->data(), d_out, n, cudaMemcpyDeviceToHost);
  cudaFree(d_data);
  cudaFree(d_out);
}

}  // namespace ckptfs::gpu
