// Decoded-chunk LRU shared by all open files. Bounded by bytes, not entries,
// so resident memory does not grow with file size (invariant 6).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/huge_pages.h"
#include "base/status.h"

namespace ckptfs {

// Leaves new elements uninitialised: a chunk is decoded straight into its
// buffer, so zeroing it first would be one more pass over every byte read.
// Its memory comes from AllocateBuffer: from 2 MiB on huge pages
// (base/huge_pages.h; with 8 concurrent readers of 512 MB the daemon used
// 2.33-2.48 s of CPU instead of 2.69-2.94 s).
template <class T>
struct ChunkAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = ChunkAllocator<U>;
  };
  ChunkAllocator() = default;
  template <class U>
  ChunkAllocator(const ChunkAllocator<U>&) noexcept {}
  T* allocate(size_t n) {
    void* p = AllocateBuffer(n * sizeof(T), alignof(std::max_align_t));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) noexcept { FreeBuffer(p, n * sizeof(T)); }
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

using ChunkBuffer = std::vector<uint8_t, ChunkAllocator<uint8_t>>;
using ChunkBytes = std::shared_ptr<const ChunkBuffer>;

struct ChunkKey {
  uint64_t pack = 0;
  uint64_t index = 0;
  bool operator==(const ChunkKey&) const = default;
};

class ChunkCache {
 public:
  // Bytes [begin, end) of a chunk.
  struct Range {
    uint64_t begin = 0;
    uint64_t end = 0;
  };
  // Told of a chunk evicted with bytes it has not handed on yet (see
  // NoteRead), which lie in `unread` (whole pages of kUnreadPage, in order).
  // The owner may keep those bytes elsewhere, where the reader will find
  // them without a second decode (fuse/page_push.h: the kernel's page cache).
  using EvictUnread = std::function<void(const ChunkKey&, ChunkBytes, std::vector<Range> unread)>;

  explicit ChunkCache(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // Set before the cache is shared; runs on the thread whose insert evicted
  // the chunk, outside the cache's lock, and must not block.
  void SetEvictUnread(EvictUnread fn) { evict_unread_ = std::move(fn); }

  ChunkBytes Get(const ChunkKey& key);
  // Cached or being loaded; counts neither a hit nor a miss.
  bool Contains(const ChunkKey& key) const;
  // Returns the cached chunk, or runs `load` once for all concurrent callers
  // of the same key while the others wait: a burst of readahead requests
  // for one chunk costs one decode and one buffer, not one per thread.
  Result<ChunkBytes> GetOrLoad(const ChunkKey& key, const std::function<Result<ChunkBytes>()>& load);
  // Inserts (or replaces) and evicts least-recently-used entries beyond
  // capacity. A chunk larger than the capacity is not cached.
  void Put(const ChunkKey& key, ChunkBytes bytes);
  // Drops every chunk of `pack` (called when a pack is deleted).
  void ErasePack(uint64_t pack);
  // Bytes [begin, end) of a cached chunk were handed on: to the kernel,
  // whose page cache now holds them, or to a delta decoder as its base.
  // Once as many bytes as the chunk holds were, it is spent and evicted
  // before every chunk that still has bytes to give. A reader that visits
  // a file's records out of order (torch.load) leaves chunks half read;
  // plain LRU would evict those and decode them a second time.
  // Returns true when this read made the chunk spent.
  bool NoteRead(const ChunkKey& key, uint64_t begin, uint64_t end);
  // The bytes of a cached chunk not handed on yet, as page-aligned ranges
  // (empty when every page was, or when it is not cached).
  std::vector<Range> Unread(const ChunkKey& key) const;

  // The granularity of Unread and of EvictUnread's ranges: the kernel's
  // page, which is what a read through the mount asks for.
  static constexpr uint64_t kUnreadPage = 4096;

  uint64_t bytes() const;
  // Bytes of cached chunks that still have bytes to give (not spent), and
  // of chunks being loaded: what an insert must not evict to stay useful.
  uint64_t UnspentBytes() const;
  uint64_t capacity() const { return capacity_; }
  uint64_t hits() const;
  uint64_t misses() const;

 private:
  struct KeyHash {
    size_t operator()(const ChunkKey& k) const { return std::hash<uint64_t>()(k.pack * 1000003u ^ k.index); }
  };
  struct Entry {
    ChunkKey key;
    ChunkBytes bytes;
    uint64_t read = 0;   // bytes handed on (a range handed twice counts twice)
    bool spent = false;  // in spent_, not lru_
    std::vector<uint64_t> given;  // a bit per kUnreadPage handed on whole; empty: none
  };
  struct Evicted {
    ChunkKey key;
    ChunkBytes bytes;
    std::vector<Range> unread;
  };
  using Iter = std::list<Entry>::iterator;
  static std::vector<Range> UnreadOf(const Entry& e);
  // Evicts beyond capacity; the unspent chunks evicted go to `out` for
  // EvictUnread when it is set.
  void EvictLocked(std::vector<Evicted>* out);
  void TouchLocked(Iter it);
  void UnlinkLocked(Iter it);

  const uint64_t capacity_;
  EvictUnread evict_unread_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;    // front = most recent; chunks with bytes still to give
  std::list<Entry> spent_;  // front = most recent; fully read, evicted first
  std::unordered_map<ChunkKey, Iter, KeyHash> map_;
  std::unordered_map<ChunkKey, std::shared_future<Result<ChunkBytes>>, KeyHash> loading_;
  uint64_t bytes_ = 0;
  uint64_t spent_bytes_ = 0;  // of the chunks in spent_
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
};

}  // namespace ckptfs
