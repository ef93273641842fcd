// Decoded-chunk LRU shared by all open files. Bounded by bytes, not entries,
// so resident memory does not grow with file size (invariant 6).
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace ckptfs {

using ChunkBytes = std::shared_ptr<const std::vector<uint8_t>>;

struct ChunkKey {
  uint64_t pack = 0;
  uint64_t index = 0;
  bool operator==(const ChunkKey&) const = default;
};

class ChunkCache {
 public:
  explicit ChunkCache(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  ChunkBytes Get(const ChunkKey& key);
  // Returns the cached chunk, or runs `load` once for all concurrent callers
  // of the same key while the others wait: a burst of readahead requests
  // for one chunk costs one decode and one buffer, not one per thread.
  Result<ChunkBytes> GetOrLoad(const ChunkKey& key, const std::function<Result<ChunkBytes>()>& load);
  // Inserts (or replaces) and evicts least-recently-used entries beyond
  // capacity. A chunk larger than the capacity is not cached.
  void Put(const ChunkKey& key, ChunkBytes bytes);
  // Drops every chunk of `pack` (called when a pack is deleted).
  void ErasePack(uint64_t pack);

  uint64_t bytes() const;
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
  };
  void EvictLocked();

  const uint64_t capacity_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // front = most recent
  std::unordered_map<ChunkKey, std::list<Entry>::iterator, KeyHash> map_;
  std::unordered_map<ChunkKey, std::shared_future<Result<ChunkBytes>>, KeyHash> loading_;
  uint64_t bytes_ = 0;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
};

}  // namespace ckptfs
