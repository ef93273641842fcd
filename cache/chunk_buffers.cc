#include "cache/chunk_buffers.h"

#include <algorithm>

namespace ckptfs {

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
