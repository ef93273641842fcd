#include <algorithm>

#include "gpu/zero_scan.h"

namespace ckptfs::gpu {

void ZeroBlocksCpu(std::span<const uint8_t> data, size_t block, std::vector<uint8_t>* out) {
  const size_t n = block == 0 ? 0 : (data.size() + block - 1) / block;
  out->assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    auto part = data.subspan(i * block, std::min(block, data.size() - i * block));
    (*out)[i] = std::all_of(part.begin(), part.end(), [](uint8_t b) { return b == 0; }) ? 1 : 0;
  }
}

#ifndef CKPTFS_HAVE_CUDA_IMPL
bool CudaAvailable() { return false; }
void ZeroBlocks(std::span<const uint8_t> data, size_t block, std::vector<uint8_t>* out) {
  ZeroBlocksCpu(data, block, out);
}
#endif

}  // namespace ckptfs::gpu
