#include "cache/chunk_buffers.h"

#include <gtest/gtest.h>

#include <memory>

namespace ckptfs {
namespace {

constexpr size_t kChunk = 1 << 20;

TEST(ChunkBuffersTest, ReusesAFreedBufferAndItsMemory) {
  ChunkBuffers pool(4 * kChunk);
  std::shared_ptr<ChunkBuffer> a = pool.Acquire(kChunk);
  ASSERT_EQ(a->size(), kChunk);
  const uint8_t* first = a->data();
  a.reset();
  EXPECT_EQ(pool.free_bytes(), kChunk);
  std::shared_ptr<ChunkBuffer> b = pool.Acquire(kChunk - 100);  // a file's shorter last chunk
  EXPECT_EQ(b->data(), first);
  EXPECT_EQ(b->size(), kChunk - 100);
  EXPECT_EQ(pool.free_bytes(), 0u);
  EXPECT_EQ(pool.reused(), 1u);
}

TEST(ChunkBuffersTest, KeepsNoMoreThanItsBound) {
  ChunkBuffers pool(2 * kChunk);
  { auto a = pool.Acquire(kChunk), b = pool.Acquire(kChunk), c = pool.Acquire(kChunk); }
  EXPECT_EQ(pool.free_bytes(), 2 * kChunk);
}

TEST(ChunkBuffersTest, SmallAndTooLargeRequestsAreFreshBuffers) {
  ChunkBuffers pool(4 * kChunk);
  pool.Acquire(ChunkBuffers::kMinKept / 2).reset();
  EXPECT_EQ(pool.free_bytes(), 0u);  // small ones are not kept
  pool.Acquire(kChunk).reset();
  std::shared_ptr<ChunkBuffer> big = pool.Acquire(2 * kChunk);
  EXPECT_EQ(big->size(), 2 * kChunk);
  EXPECT_EQ(pool.reused(), 0u);
  EXPECT_EQ(pool.free_bytes(), kChunk);
}

TEST(ChunkBuffersTest, ABufferOutlivingItsPoolIsFreed) {
  std::shared_ptr<ChunkBuffer> kept;
  {
    ChunkBuffers pool(4 * kChunk);
    kept = pool.Acquire(kChunk);
  }
  (*kept)[0] = 1;
  kept.reset();  // returns to the shelf the buffer holds, not a dangling pool
}

}  // namespace
}  // namespace ckptfs
