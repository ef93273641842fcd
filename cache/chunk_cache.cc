#include "cache/chunk_cache.h"

namespace ckptfs {

ChunkBytes ChunkCache::Get(const ChunkKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->bytes;
}

bool ChunkCache::Contains(const ChunkKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.contains(key) || loading_.contains(key);
}

Result<ChunkBytes> ChunkCache::GetOrLoad(const ChunkKey& key, const std::function<Result<ChunkBytes>()>& load) {
  std::promise<Result<ChunkBytes>> promise;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (auto it = map_.find(key); it != map_.end()) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->bytes;
    }
    ++misses_;
    if (auto it = loading_.find(key); it != loading_.end()) {
      std::shared_future<Result<ChunkBytes>> pending = it->second;
      lock.unlock();
      return pending.get();
    }
    loading_.emplace(key, promise.get_future().share());
  }
  Result<ChunkBytes> loaded = load();
  if (loaded.ok()) Put(key, loaded.value());
  {
    std::lock_guard<std::mutex> lock(mu_);
    loading_.erase(key);
  }
  promise.set_value(loaded);
  return loaded;
}

void ChunkCache::Put(const ChunkKey& key, ChunkBytes bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it != map_.end()) {
    bytes_ -= it->second->bytes ? it->second->bytes->size() : 0;
    lru_.erase(it->second);
    map_.erase(it);
  }
  // Oversized chunks would evict everything and still not fit.
  if (!bytes || bytes->size() > capacity_) return;
  bytes_ += bytes->size();
  lru_.push_front(Entry{key, std::move(bytes)});
  map_.emplace(key, lru_.begin());
  EvictLocked();
}

void ChunkCache::ErasePack(uint64_t pack) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (it->key.pack == pack) {
      bytes_ -= it->bytes->size();
      map_.erase(it->key);
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
}

void ChunkCache::EvictLocked() {
  while (bytes_ > capacity_ && !lru_.empty()) {
    Entry& victim = lru_.back();
    bytes_ -= victim.bytes->size();
    map_.erase(victim.key);
    lru_.pop_back();
  }
}

uint64_t ChunkCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

uint64_t ChunkCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

uint64_t ChunkCache::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

}  // namespace ckptfs
