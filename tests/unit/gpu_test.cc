// The CPU zero scan is the reference; ZeroBlocks (GPU when there is a
// device, else the CPU fallback) must agree with it bit for bit, and with
// the chunk encoder's own zero detection.
#include <gtest/gtest.h>

#include <vector>

#include "codec/chunk_codec.h"
#include "gpu/zero_scan.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

TEST(ZeroScanTest, CpuReference) {
  std::vector<uint8_t> data(10, 0);
  data[5] = 1;
  std::vector<uint8_t> out;
  gpu::ZeroBlocksCpu(data, 4, &out);
  EXPECT_EQ(out, (std::vector<uint8_t>{1, 0, 1}));  // last block is clipped to 2 bytes
  gpu::ZeroBlocksCpu({}, 4, &out);
  EXPECT_TRUE(out.empty());
  gpu::ZeroBlocksCpu(data, 0, &out);
  EXPECT_TRUE(out.empty());
}

TEST(ZeroScanTest, DispatchAgreesWithCpuAndEncoder) {
  const size_t block = 4096;
  std::vector<uint8_t> data = test::RandomBytes(block * 37 + 123, 5);
  for (size_t b = 0; b < 38; b += 3) {  // zero out every third block
    std::fill(data.begin() + b * block, data.begin() + std::min(data.size(), (b + 1) * block), 0);
  }
  data[block * 9 + block - 1] = 7;  // block 9 is zero but for its last byte
  std::vector<uint8_t> cpu, dispatched;
  gpu::ZeroBlocksCpu(data, block, &cpu);
  gpu::ZeroBlocks(data, block, &dispatched);
  EXPECT_EQ(cpu, dispatched) << "CUDA available: " << gpu::CudaAvailable();
  for (size_t b = 0; b < cpu.size(); ++b) {
    std::span<const uint8_t> part(data.data() + b * block, std::min(block, data.size() - b * block));
    std::vector<uint8_t> stored;
    EXPECT_EQ(cpu[b] == 1, EncodeChunk(part, {}, &stored) == ChunkCodec::kZero) << "block " << b;
  }
}

}  // namespace
}  // namespace ckptfs
