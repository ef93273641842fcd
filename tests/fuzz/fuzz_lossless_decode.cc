// libFuzzer entry for the lossless tensor codec's decoder: the first 4
// bytes (LE) give the output size, capped at 1 MiB; the rest is the blob.
// Decoding must fail cleanly or fill exactly the output, never touch
// memory outside either span.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/lossless/plane_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t n = uint32_t(data[0]) | uint32_t(data[1]) << 8 | uint32_t(data[2]) << 16 | uint32_t(data[3]) << 24;
  std::vector<uint8_t> out(std::min<uint32_t>(n, 1u << 20));
  (void)ckptfs::lossless::DecodeTensorBytes(std::span<const uint8_t>(data + 4, size - 4), out);
  return 0;
}
