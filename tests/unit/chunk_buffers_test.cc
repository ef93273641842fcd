#include "cache/chunk_buffers.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
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

// Whether [p, p + n) is mapped: msync fails with ENOMEM on an unmapped page.
bool Mapped(const uint8_t* p, size_t n) {
  return ::msync(const_cast<uint8_t*>(p), n, MS_ASYNC) == 0 || errno != ENOMEM;
}

// A buffer still referenced when its pool goes returns, on its last
// release, to the shelf it holds (not to the destroyed pool), and the shelf,
// owned by nothing else then, frees it: a 2 MiB buffer is a mapping of its
// own, so freed means unmapped.
TEST(ChunkBuffersTest, ABufferOutlivingItsPoolIsFreed) {
  constexpr size_t kMapped = size_t{2} << 20;
  std::shared_ptr<ChunkBuffer> kept;
  {
    ChunkBuffers pool(4 * kMapped);
    kept = pool.Acquire(kMapped);
  }
  (*kept)[0] = 1;
  (*kept)[kMapped - 1] = 2;
  const uint8_t* data = kept->data();
  ASSERT_TRUE(Mapped(data, kMapped));
  kept.reset();
  EXPECT_FALSE(Mapped(data, kMapped));
}

// Buffers of 2 MiB and more are a mapping of their own, aligned for huge
// pages, and hold what is written to them across reuse; smaller ones come
// from malloc. Growing one moves its bytes to a new mapping.
TEST(ChunkBuffersTest, LargeBuffersAreHugePageAlignedMappings) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  for (const size_t size : {size_t{2} << 20, (size_t{4} << 20) + 1, size_t{64} << 10}) {
    ChunkBuffer b(size);
    if (size >= kHuge) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kHuge, 0u) << size;
    }
    for (size_t i = 0; i < size; i += 4096) b[i] = static_cast<uint8_t>(i >> 12);
    b[size - 1] = 0xA5;
    b.resize(size + (size_t{3} << 20));
    for (size_t i = 0; i + 1 < size; i += 4096) ASSERT_EQ(b[i], static_cast<uint8_t>(i >> 12)) << size;
    EXPECT_EQ(b[size - 1], 0xA5);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kHuge, 0u) << size;
  }
}

}  // namespace
}  // namespace ckptfs
