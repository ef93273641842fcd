#include "store/base_handoff.h"

namespace ckptfs {
namespace {
constexpr size_t kSpareBuffers = 2;
}  // namespace

void BaseHandoff::Put(uint64_t offset, ObjectId pack, uint64_t pack_offset, std::vector<uint8_t>* bytes) {
  std::lock_guard lock(mu_);
  if (bytes->empty() || held_bytes_ + bytes->size() > budget_) return;
  auto [it, added] = held_.try_emplace(Key{offset, pack, pack_offset});
  if (!added) return;
  held_bytes_ += bytes->size();
  it->second.swap(*bytes);
  bytes->clear();
  if (!spare_.empty()) {
    bytes->swap(spare_.back());
    spare_.pop_back();
  }
}

bool BaseHandoff::Take(uint64_t offset, ObjectId pack, uint64_t pack_offset, std::vector<uint8_t>* out) {
  std::lock_guard lock(mu_);
  auto it = held_.find(Key{offset, pack, pack_offset});
  if (it == held_.end()) return false;
  held_bytes_ -= it->second.size();
  out->swap(it->second);
  if (spare_.size() < kSpareBuffers && it->second.capacity() > 0) spare_.push_back(std::move(it->second));
  held_.erase(it);
  return true;
}

uint64_t BaseHandoff::held() const {
  std::lock_guard lock(mu_);
  return held_bytes_;
}

}  // namespace ckptfs
