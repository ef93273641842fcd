// Recycles the buffers chunks are decoded into. A fresh buffer of a chunk's
// size (4 MiB) comes from mmap, so decoding into it page-faults on every
// page and freeing it unmaps them all again: perf of the daemon during a
// cold torch.load put ~35% of its CPU there (faults, page clearing, munmap).
// A buffer whose last reference drops (evicted and replied) goes back to a
// bounded shelf instead, and the next decode reuses its resident pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "cache/chunk_cache.h"

namespace ckptfs {

class ChunkBuffers {
 public:
  // max_free_bytes: the most bytes kept on the shelf; beyond, freed buffers
  // go back to the allocator.
  explicit ChunkBuffers(uint64_t max_free_bytes);

  // A buffer of `size` bytes, contents unspecified. When its last reference
  // drops it returns to the shelf, which outlives this object if need be.
  std::shared_ptr<ChunkBuffer> Acquire(size_t size);

  uint64_t free_bytes() const;
  // Acquires served from the shelf (tests and stats).
  uint64_t reused() const;

  // The process's shelf for decoded chunks (32 MiB).
  static ChunkBuffers& Default();

  // Buffers smaller than this are not kept: malloc serves them from its
  // heap, without faults on every page.
  static constexpr size_t kMinKept = 256 << 10;

 private:
  struct Shelf {
    explicit Shelf(uint64_t max) : max_free(max) {}
    void Give(ChunkBuffer* b);
    const uint64_t max_free;
    mutable std::mutex mu;
    std::vector<std::unique_ptr<ChunkBuffer>> free;
    uint64_t free_bytes = 0;
    uint64_t reused = 0;
  };
  std::shared_ptr<Shelf> shelf_;
};

}  // namespace ckptfs
