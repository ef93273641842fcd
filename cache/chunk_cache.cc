#include "cache/chunk_cache.h"

namespace ckptfs {

void ChunkCache::TouchLocked(Iter it) {
  std::list<Entry>& list = it->spent ? spent_ : lru_;
  list.splice(list.begin(), list, it);
}

void ChunkCache::UnlinkLocked(Iter it) {
  bytes_ -= it->bytes ? it->bytes->size() : 0;
  if (it->spent) spent_bytes_ -= it->bytes->size();
  map_.erase(it->key);
  (it->spent ? spent_ : lru_).erase(it);
}

ChunkBytes ChunkCache::Get(const ChunkKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  TouchLocked(it->second);
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
      TouchLocked(it->second);
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
  if (auto it = map_.find(key); it != map_.end()) UnlinkLocked(it->second);
  // Oversized chunks would evict everything and still not fit.
  if (!bytes || bytes->size() > capacity_) return;
  bytes_ += bytes->size();
  lru_.push_front(Entry{key, std::move(bytes)});
  map_.emplace(key, lru_.begin());
  EvictLocked();
}

void ChunkCache::NoteRead(const ChunkKey& key, uint64_t begin, uint64_t end) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end() || end <= begin) return;
  Entry& e = *it->second;
  e.read += end - begin;
  if (e.spent || e.read < e.bytes->size()) return;
  e.spent = true;
  spent_bytes_ += e.bytes->size();
  spent_.splice(spent_.begin(), lru_, it->second);
}

void ChunkCache::ErasePack(uint64_t pack) {
  std::lock_guard<std::mutex> lock(mu_);
  for (std::list<Entry>* list : {&lru_, &spent_}) {
    for (auto it = list->begin(); it != list->end();) {
      auto next = std::next(it);
      if (it->key.pack == pack) UnlinkLocked(it);
      it = next;
    }
  }
}

void ChunkCache::EvictLocked() {
  while (bytes_ > capacity_ && !(lru_.empty() && spent_.empty())) {
    UnlinkLocked(std::prev(spent_.empty() ? lru_.end() : spent_.end()));
  }
}

uint64_t ChunkCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

uint64_t ChunkCache::UnspentBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_ - spent_bytes_;
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
