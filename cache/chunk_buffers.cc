#include "cache/chunk_buffers.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <new>

namespace ckptfs {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;

size_t WholeHugePages(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }
}  // namespace

// A mapping of its own, not malloc's: madvise marks a whole mapping range,
// and on malloc's heap the mark would outlive the buffer and let the kernel
// back small allocations there with huge pages (RSS the cache does not count).
void* AllocateChunkMemory(size_t bytes) {
  if (bytes < kHugePage) return ::operator new(bytes);
  const size_t whole = WholeHugePages(bytes);
  // Map one huge page more, then unmap what lies before and after the
  // aligned range.
  void* m = ::mmap(nullptr, whole + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t at = reinterpret_cast<uintptr_t>(m);
  const uintptr_t aligned = (at + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > at) ::munmap(m, aligned - at);
  if (const size_t after = at + whole + kHugePage - (aligned + whole); after > 0) {
    ::munmap(reinterpret_cast<void*>(aligned + whole), after);
  }
  void* p = reinterpret_cast<void*>(aligned);
  // Best effort: where huge pages are off, the buffer works as it is.
  (void)::madvise(p, whole, MADV_HUGEPAGE);
  return p;
}

void FreeChunkMemory(void* p, size_t bytes) {
  if (bytes < kHugePage) return ::operator delete(p);
  ::munmap(p, WholeHugePages(bytes));
}

ChunkBuffers::ChunkBuffers(uint64_t max_free_bytes) : shelf_(std::make_shared<Shelf>(max_free_bytes)) {}

void ChunkBuffers::Shelf::Give(ChunkBuffer* b) {
  std::unique_ptr<ChunkBuffer> owned(b);
  if (owned->capacity() < kMinKept) return;
  std::lock_guard lk(mu);
  if (free_bytes + owned->capacity() > max_free) return;
  free_bytes += owned->capacity();
  free.push_back(std::move(owned));
}

std::shared_ptr<ChunkBuffer> ChunkBuffers::Acquire(size_t size) {
  std::unique_ptr<ChunkBuffer> b;
  if (size >= kMinKept) {
    std::lock_guard lk(shelf_->mu);
    // The smallest one that fits: the last chunk of a file is shorter, and
    // should not take a full-size buffer another chunk could use.
    auto best = shelf_->free.end();
    for (auto it = shelf_->free.begin(); it != shelf_->free.end(); ++it) {
      if ((*it)->capacity() >= size && (best == shelf_->free.end() || (*it)->capacity() < (*best)->capacity()))
        best = it;
    }
    if (best != shelf_->free.end()) {
      b = std::move(*best);
      shelf_->free.erase(best);
      shelf_->free_bytes -= b->capacity();
      ++shelf_->reused;
    }
  }
  if (!b) b = std::make_unique<ChunkBuffer>();
  // Within the capacity, resize neither reallocates nor (ChunkAllocator) writes.
  b->resize(size);
  return std::shared_ptr<ChunkBuffer>(b.release(), [shelf = shelf_](ChunkBuffer* p) { shelf->Give(p); });
}

uint64_t ChunkBuffers::free_bytes() const {
  std::lock_guard lk(shelf_->mu);
  return shelf_->free_bytes;
}

uint64_t ChunkBuffers::reused() const {
  std::lock_guard lk(shelf_->mu);
  return shelf_->reused;
}

ChunkBuffers& ChunkBuffers::Default() {
  // Never destroyed: buffers still referenced at exit return to its shelf.
  static ChunkBuffers* const buffers = new ChunkBuffers(32u << 20);
  return *buffers;
}

}  // namespace ckptfs
