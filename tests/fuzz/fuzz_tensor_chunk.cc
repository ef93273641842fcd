// libFuzzer entry for the tensor chunk decoder (chunk codec kTensor): the
// first 4 bytes (LE) give the chunk size, capped at 1 MiB; the rest is the
// stored payload. Decoding must fail cleanly or fill exactly the chunk.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/tensor_chunk.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t n = uint32_t(data[0]) | uint32_t(data[1]) << 8 | uint32_t(data[2]) << 16 | uint32_t(data[3]) << 24;
  std::vector<uint8_t> out(std::min<uint32_t>(n, 1u << 20));
  (void)ckptfs::DecodeTensorChunk(std::span<const uint8_t>(data + 4, size - 4), out);
  return 0;
}
