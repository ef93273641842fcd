#include "store/pack_index.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace ckptfs {
namespace {

// Candidates for a predecessor: the most recently sealed live files only,
// so choosing one stays cheap in a store with many files.
constexpr size_t kMaxBaseCandidates = 64;

using SigKey = std::tuple<uint64_t, uint8_t, uint64_t>;  // name (or 0), element type, byte length

SigKey Signature(const TensorRange& t, bool named) {
  return {named ? t.name : 0, static_cast<uint8_t>(t.dtype), t.length};
}

bool AnyNamed(std::span<const TensorRange> ranges) {
  return std::any_of(ranges.begin(), ranges.end(), [](const TensorRange& t) { return t.name != 0; });
}

// The new ranges of each signature, in file order.
std::map<SigKey, std::vector<size_t>> BySignature(std::span<const TensorRange> ranges, bool named) {
  std::map<SigKey, std::vector<size_t>> out;
  for (size_t i = 0; i < ranges.size(); ++i) out[Signature(ranges[i], named)].push_back(i);
  return out;
}

// Where `candidate`'s tensors of each signature fall, k-th to k-th, for the
// new ranges of that signature.
BaseChoice MatchTensors(ObjectId id, uint64_t logical_size, const std::vector<TensorRange>& candidate,
                        const std::map<SigKey, std::vector<size_t>>& wanted, bool named, size_t n_ranges) {
  BaseChoice choice{id, logical_size, 0, std::vector<std::optional<uint64_t>>(n_ranges), {}};
  std::map<SigKey, size_t> seen;
  for (const TensorRange& t : candidate) {
    auto w = wanted.find(Signature(t, named));
    if (w == wanted.end()) continue;
    size_t& k = seen[w->first];
    if (k < w->second.size()) {
      choice.base_offset[w->second[k]] = t.offset;
      choice.matched_bytes += t.length;
    }
    ++k;
  }
  return choice;
}

}  // namespace

void PackIndex::Add(ObjectId id, const PackMeta& meta, uint64_t logical_size, uint32_t chunk_size,
                    uint64_t stored_size) {
  std::lock_guard lk(mu_);
  if (packs_.count(id)) return;
  Entry e{meta, logical_size, chunk_size, stored_size};
  totals_.stored += stored_size;
  for (ObjectId b : meta.bases) {
    auto it = packs_.find(b);
    if (it != packs_.end()) ++it->second.users;
  }
  packs_.emplace(id, std::move(e));
}

void PackIndex::RecountUsers() {
  std::lock_guard lk(mu_);
  for (auto& [id, e] : packs_) e.users = 0;
  for (auto& [id, e] : packs_) {
    for (ObjectId b : e.meta.bases) {
      auto it = packs_.find(b);
      if (it != packs_.end()) ++it->second.users;
    }
  }
}

bool PackIndex::Contains(ObjectId id) const {
  std::lock_guard lk(mu_);
  return packs_.count(id) != 0;
}

std::optional<std::vector<ObjectId>> PackIndex::BasesOf(ObjectId id) const {
  std::lock_guard lk(mu_);
  auto it = packs_.find(id);
  if (it == packs_.end()) return std::nullopt;
  return it->second.meta.bases;
}

void PackIndex::AddRoot(ObjectId id) {
  std::lock_guard lk(mu_);
  auto it = packs_.find(id);
  if (it == packs_.end()) return;
  if (!it->second.candidate()) IndexChunksLocked(id, it->second);
  ++it->second.roots;
  totals_.root_logical += it->second.logical_size;
}

std::vector<ObjectId> PackIndex::DropRoot(ObjectId id) {
  std::lock_guard lk(mu_);
  std::vector<ObjectId> dead;
  auto it = packs_.find(id);
  if (it == packs_.end()) return {id};  // unknown to the index: only the stub knew it
  if (it->second.roots > 0) {
    --it->second.roots;
    totals_.root_logical -= it->second.logical_size;
  }
  if (!it->second.candidate()) UnindexChunksLocked(id, it->second);
  CollectLocked(id, &dead);
  return dead;
}

void PackIndex::Retire(ObjectId id) {
  std::lock_guard lk(mu_);
  auto it = packs_.find(id);
  if (it == packs_.end()) return;
  ++it->second.retired;
  if (it->second.roots > 0) {
    --it->second.roots;
    totals_.root_logical -= it->second.logical_size;
  }
}

std::vector<ObjectId> PackIndex::Unretire(ObjectId id) { return EndHold(id, &Entry::retired); }

std::vector<ObjectId> PackIndex::Unpin(ObjectId id) { return EndHold(id, &Entry::pins); }

std::vector<ObjectId> PackIndex::EndHold(ObjectId id, uint32_t Entry::*hold) {
  std::lock_guard lk(mu_);
  std::vector<ObjectId> dead;
  auto it = packs_.find(id);
  if (it == packs_.end() || it->second.*hold == 0) return dead;
  --(it->second.*hold);
  if (!it->second.candidate()) UnindexChunksLocked(id, it->second);
  CollectLocked(id, &dead);
  return dead;
}

void PackIndex::CollectLocked(ObjectId id, std::vector<ObjectId>* dead) {
  std::vector<ObjectId> todo{id};
  while (!todo.empty()) {
    const ObjectId cur = todo.back();
    todo.pop_back();
    auto it = packs_.find(cur);
    if (it == packs_.end() || !DeletableLocked(it->second)) continue;
    for (ObjectId b : it->second.meta.bases) {
      auto bit = packs_.find(b);
      if (bit == packs_.end() || bit->second.users == 0) continue;
      --bit->second.users;
      todo.push_back(b);
    }
    totals_.stored -= it->second.stored_size;
    packs_.erase(it);
    dead->push_back(cur);
  }
}

void PackIndex::IndexChunksLocked(ObjectId id, const Entry& e) {
  for (uint64_t i = 0; i < e.meta.chunk_hash.size(); ++i) by_hash_.try_emplace(e.meta.chunk_hash[i], id, i);
}

void PackIndex::UnindexChunksLocked(ObjectId id, const Entry& e) {
  for (uint64_t h : e.meta.chunk_hash) {
    auto it = by_hash_.find(h);
    if (it != by_hash_.end() && it->second.first == id) by_hash_.erase(it);
  }
}

std::vector<BaseChoice> PackIndex::FindBaseCandidates(std::span<const TensorRange> ranges, double share, size_t max) {
  std::vector<BaseChoice> out;
  if (ranges.empty() || max == 0) return out;
  // Packs sealed before the mount have no names (their meta block keeps
  // none): their tensors match by element type and length alone.
  const bool new_named = AnyNamed(ranges);
  const std::map<SigKey, std::vector<size_t>> wanted = BySignature(ranges, false);
  const std::map<SigKey, std::vector<size_t>> wanted_named = BySignature(ranges, true);
  std::lock_guard lk(mu_);
  for (ObjectId id : RecentCandidatesLocked([](ObjectId, const Entry& e) { return !e.meta.tensors.empty(); })) {
    const Entry& e = packs_.at(id);
    const bool named = new_named && AnyNamed(e.meta.tensors);
    BaseChoice choice =
        MatchTensors(id, e.logical_size, e.meta.tensors, named ? wanted_named : wanted, named, ranges.size());
    if (choice.matched_bytes == 0) continue;
    choice.depth = e.meta.max_depth();
    out.push_back(std::move(choice));
  }
  // Most matched first; among equals, the most recent (stable: `recent` order).
  std::stable_sort(out.begin(), out.end(),
                   [](const BaseChoice& a, const BaseChoice& b) { return a.matched_bytes > b.matched_bytes; });
  if (!out.empty()) {
    const double floor = share * static_cast<double>(out[0].matched_bytes);
    auto cut = std::find_if(out.begin(), out.end(),
                            [&](const BaseChoice& c) { return static_cast<double>(c.matched_bytes) < floor; });
    out.erase(cut, out.end());
  }
  if (out.size() > max) out.resize(max);
  return out;
}

std::vector<ObjectId> PackIndex::FillByName(BaseChoice* choice, std::span<const TensorRange> ranges) {
  std::map<uint64_t, size_t> missing;  // name -> new range, for names the new file holds once
  std::map<uint64_t, size_t> count;
  for (const TensorRange& t : ranges) ++count[t.name];
  for (size_t i = 0; i < ranges.size() && i < choice->base_offset.size(); ++i) {
    if (ranges[i].name != 0 && count[ranges[i].name] == 1 && !choice->base_offset[i]) missing[ranges[i].name] = i;
  }
  std::vector<ObjectId> pinned;
  if (missing.empty()) return pinned;
  std::lock_guard lk(mu_);
  const ObjectId chosen = choice->pack;
  auto named_elsewhere = [chosen](ObjectId id, const Entry& e) { return id != chosen && AnyNamed(e.meta.tensors); };
  for (ObjectId id : RecentCandidatesLocked(named_elsewhere)) {
    Entry& e = packs_.at(id);
    std::map<uint64_t, const TensorRange*> mine;  // names it holds once
    for (const TensorRange& t : e.meta.tensors) {
      if (t.name == 0) continue;
      auto [it, fresh] = mine.emplace(t.name, &t);
      if (!fresh) it->second = nullptr;
    }
    bool used = false;
    for (auto m = missing.begin(); m != missing.end();) {
      auto it = mine.find(m->first);
      const TensorRange& want = ranges[m->second];
      if (it == mine.end() || it->second == nullptr || it->second->dtype != want.dtype ||
          it->second->length != want.length) {
        ++m;
        continue;
      }
      if (choice->other.empty()) choice->other.resize(choice->base_offset.size());
      choice->base_offset[m->second] = it->second->offset;
      choice->other[m->second] = {id, e.logical_size};
      choice->matched_bytes += want.length;
      used = true;
      m = missing.erase(m);
    }
    if (used) {
      ++e.pins;
      pinned.push_back(id);
    }
    if (missing.empty()) break;
  }
  return pinned;
}

std::vector<ObjectId> PackIndex::RecentCandidatesLocked(const std::function<bool(ObjectId, const Entry&)>& keep) const {
  std::vector<std::pair<uint64_t, ObjectId>> recent;
  for (const auto& [id, e] : packs_) {
    if (e.candidate() && keep(id, e)) recent.emplace_back(e.meta.sealed_ns, id);
  }
  const size_t n = std::min(recent.size(), kMaxBaseCandidates);
  std::partial_sort(recent.begin(), recent.begin() + n, recent.end(), std::greater<>());
  std::vector<ObjectId> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(recent[i].second);
  return out;
}

bool PackIndex::PinCandidate(ObjectId pack) {
  std::lock_guard lk(mu_);
  auto it = packs_.find(pack);
  if (it == packs_.end() || !it->second.candidate()) return false;
  ++it->second.pins;
  return true;
}

std::optional<std::pair<ObjectId, uint64_t>> PackIndex::FindChunk(uint64_t hash, uint64_t raw_len) {
  std::lock_guard lk(mu_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  Entry& e = packs_.at(it->second.first);
  const uint64_t off = it->second.second * e.chunk_size;
  if (off >= e.logical_size || std::min<uint64_t>(e.chunk_size, e.logical_size - off) != raw_len) return std::nullopt;
  ++e.pins;
  return std::make_pair(it->second.first, off);
}

std::optional<SameInputPack> PackIndex::FindSameInput(const Digest128& digest, uint64_t logical_size) {
  std::lock_guard lk(mu_);
  Entry* best = nullptr;
  ObjectId best_id = 0;
  for (auto& [id, e] : packs_) {
    // A pack neither a file nor another pack holds is on its way out (or
    // not yet named by its stub): pinning and unpinning it would delete it.
    if (!e.meta.input || e.meta.input->digest != digest || e.logical_size != logical_size || e.chunk_size == 0 ||
        !(e.candidate() || e.users > 0)) {
      continue;
    }
    if (best == nullptr || (best->meta.input->copy_of != 0 && e.meta.input->copy_of == 0)) best = &e, best_id = id;
  }
  if (best == nullptr) return std::nullopt;
  ++best->pins;
  return SameInputPack{best_id, best->chunk_size, best->meta.lossy};
}

uint8_t PackIndex::RangeDepth(ObjectId pack, uint64_t off, uint64_t len) const {
  std::lock_guard lk(mu_);
  auto it = packs_.find(pack);
  if (it == packs_.end() || it->second.chunk_size == 0 || len == 0) return 0;
  const Entry& e = it->second;
  uint8_t depth = 0;
  for (uint64_t i = off / e.chunk_size; i <= (off + len - 1) / e.chunk_size && i < e.meta.chunk_depth.size(); ++i) {
    depth = std::max(depth, e.meta.chunk_depth[i]);
  }
  return depth;
}

size_t PackIndex::size() const {
  std::lock_guard lk(mu_);
  return packs_.size();
}

PackIndex::Totals PackIndex::totals() const {
  std::lock_guard lk(mu_);
  return totals_;
}

}  // namespace ckptfs
