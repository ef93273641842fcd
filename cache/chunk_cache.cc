#include "cache/chunk_cache.h"

#include <algorithm>

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
  std::vector<Evicted> evicted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = map_.find(key); it != map_.end()) UnlinkLocked(it->second);
    // Oversized chunks would evict everything and still not fit.
    if (!bytes || bytes->size() > capacity_) return;
    bytes_ += bytes->size();
    lru_.push_front(Entry{.key = key, .bytes = std::move(bytes), .read = 0, .spent = false, .given = {}});
    map_.emplace(key, lru_.begin());
    EvictLocked(&evicted);
  }
  for (Evicted& e : evicted) evict_unread_(e.key, std::move(e.bytes), std::move(e.unread));
}

bool ChunkCache::NoteRead(const ChunkKey& key, uint64_t begin, uint64_t end) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end() || end <= begin) return false;
  Entry& e = *it->second;
  e.read += end - begin;
  // The pages [begin, end) covers whole (the last one may be short).
  const uint64_t size = e.bytes->size();
  const uint64_t pages = (size + kUnreadPage - 1) / kUnreadPage;
  const uint64_t first = (begin + kUnreadPage - 1) / kUnreadPage;
  const uint64_t past = end >= size ? pages : end / kUnreadPage;
  if (first < past && e.given.empty()) e.given.assign((pages + 63) / 64, 0);
  for (uint64_t p = first; p < past; ++p) e.given[p / 64] |= uint64_t{1} << (p % 64);
  if (e.spent || e.read < e.bytes->size()) return false;
  e.spent = true;
  spent_bytes_ += e.bytes->size();
  spent_.splice(spent_.begin(), lru_, it->second);
  return true;
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

std::vector<ChunkCache::Range> ChunkCache::UnreadOf(const Entry& e) {
  std::vector<Range> out;
  const uint64_t size = e.bytes->size();
  for (uint64_t p = 0; p * kUnreadPage < size; ++p) {
    if (!e.given.empty() && (e.given[p / 64] >> (p % 64) & 1)) continue;
    const uint64_t begin = p * kUnreadPage, end = std::min(size, begin + kUnreadPage);
    if (!out.empty() && out.back().end == begin) {
      out.back().end = end;
    } else {
      out.push_back(Range{begin, end});
    }
  }
  return out;
}

std::vector<ChunkCache::Range> ChunkCache::Unread(const ChunkKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  return it == map_.end() ? std::vector<Range>{} : UnreadOf(*it->second);
}

void ChunkCache::EvictLocked(std::vector<Evicted>* out) {
  while (bytes_ > capacity_ && !(lru_.empty() && spent_.empty())) {
    const Iter victim = std::prev(spent_.empty() ? lru_.end() : spent_.end());
    if (!victim->spent && evict_unread_) {
      std::vector<Range> unread = UnreadOf(*victim);
      if (!unread.empty()) out->push_back(Evicted{victim->key, victim->bytes, std::move(unread)});
    }
    UnlinkLocked(victim);
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
