// The store's in-memory index of its packs: who refers to whom (so a pack
// is deleted only when no file and no other pack needs it), the tensor
// signatures that find a new checkpoint's predecessor (lineage), and the
// content hashes of chunks (dedup). Everything here is rebuilt from the
// packs' meta blocks and the stubs at mount: it is a cache, not a source of
// truth. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "store/object_id.h"
#include "store/pack_meta.h"

namespace ckptfs {

// The predecessor chosen for a new file, and where each of the new file's
// tensors sits in it.
struct BaseChoice {
  ObjectId pack = 0;
  uint64_t logical_size = 0;
  uint64_t matched_bytes = 0;
  std::vector<std::optional<uint64_t>> base_offset;  // per new tensor range
  // Per new tensor range (empty: none), another pack holding its
  // same-named predecessor, when `pack` does not (FillByName); pack 0: none.
  struct Other {
    ObjectId pack = 0;
    uint64_t logical_size = 0;
  };
  std::vector<Other> other;
  uint8_t depth = 0;  // the deepest delta chain among the pack's chunks
};

// A pack sealed from the same input as a new file (PackIndex::FindSameInput).
struct SameInputPack {
  ObjectId pack = 0;
  uint32_t chunk_size = 0;
  std::optional<LossyInfo> lossy;  // its meta block's lossy section
};

class PackIndex {
 public:
  // A pack that exists on disk, `stored_size` bytes long. Its bases gain a user.
  void Add(ObjectId id, const PackMeta& meta, uint64_t logical_size, uint32_t chunk_size, uint64_t stored_size = 0);
  // After adding packs in any order (at mount): counts users afresh.
  void RecountUsers();
  bool Contains(ObjectId id) const;
  // The packs `id` stores chunks against (its meta block's), when indexed.
  std::optional<std::vector<ObjectId>> BasesOf(ObjectId id) const;
  // A stub names (root) / stops naming (drop) the pack. Returns the packs
  // that nothing needs any more, to delete: the pack itself and, in turn,
  // bases only it kept alive.
  void AddRoot(ObjectId id);
  std::vector<ObjectId> DropRoot(ObjectId id);
  // A file being rewritten in place keeps its previous version as a
  // lineage candidate until its next seal (then Unretire), instead of
  // dropping it when the rewrite starts.
  void Retire(ObjectId id);
  std::vector<ObjectId> Unretire(ObjectId id);
  // Ends a pin that FindBase or FindChunk took for a seal.
  std::vector<ObjectId> Unpin(ObjectId id);

  // The live files whose tensors (matched by element type, length and
  // order) cover at least `share` of the best one's matched bytes, at most `max`, most matched first and then most recent;
  // none pinned. Several shards of one save (DCP ranks) match a successor
  // equally well by layout alone: the caller tells them apart by content.
  // Tensors that both files name (TensorRange::name, packs sealed since the
  // mount) match by name, element type and length instead.
  std::vector<BaseChoice> FindBaseCandidates(std::span<const TensorRange> ranges, double share, size_t max);
  // The named ranges `choice` left unmatched take the most recent live pack
  // holding a tensor of the same name, element type and length (one such
  // name in each file), as BaseChoice::other. Some writers split one save
  // into data files differently each time, so one step's file may have its
  // predecessors in several files. Returns those packs, each
  // pinned once for the caller (Unpin them).
  std::vector<ObjectId> FillByName(BaseChoice* choice, std::span<const TensorRange> ranges);
  // Pins `pack` for the caller if it is still a live file's pack.
  bool PinCandidate(ObjectId pack);
  // A live pack's chunk with this content hash and length, as (pack, logical
  // offset); pinned for the caller.
  std::optional<std::pair<ObjectId, uint64_t>> FindChunk(uint64_t hash, uint64_t raw_len);
  // An indexed pack sealed from input with this digest (PackMeta::input)
  // and of this logical size: a live file's, or one that a live pack stores
  // chunks against (so it stays while that pack does). One coded from the
  // input rather than a copy of another, when there is one, so that copies
  // refer to it directly. Pinned for the caller.
  std::optional<SameInputPack> FindSameInput(const Digest128& digest, uint64_t logical_size);
  // The delta depth of [off, off+len) of `pack` (the deepest chunk it touches).
  uint8_t RangeDepth(ObjectId pack, uint64_t off, uint64_t len) const;

  size_t size() const;
  // For the daemon's metrics: logical bytes of the packs stubs name (the
  // sealed files), and bytes of every indexed pack.
  struct Totals {
    uint64_t root_logical = 0;
    uint64_t stored = 0;
  };
  Totals totals() const;

 private:
  struct Entry {
    PackMeta meta;
    uint64_t logical_size = 0;
    uint32_t chunk_size = 0;
    uint64_t stored_size = 0;
    uint32_t roots = 0, users = 0, pins = 0, retired = 0;
    bool candidate() const { return roots > 0 || retired > 0; }
  };
  bool DeletableLocked(const Entry& e) const { return !e.candidate() && e.users == 0 && e.pins == 0; }
  // Removes `id` and cascades to bases that became unneeded.
  void CollectLocked(ObjectId id, std::vector<ObjectId>* dead);
  // Ends one hold of kind `hold` (a pin or a retirement) and collects.
  std::vector<ObjectId> EndHold(ObjectId id, uint32_t Entry::*hold);
  void IndexChunksLocked(ObjectId id, const Entry& e);
  void UnindexChunksLocked(ObjectId id, const Entry& e);
  // The most recently sealed live packs that `keep`, newest first, at most
  // kMaxBaseCandidates of them (choosing a base stays cheap in a big store).
  std::vector<ObjectId> RecentCandidatesLocked(const std::function<bool(ObjectId, const Entry&)>& keep) const;

  mutable std::mutex mu_;
  std::unordered_map<ObjectId, Entry> packs_;
  std::unordered_map<uint64_t, std::pair<ObjectId, uint64_t>> by_hash_;  // -> (pack, chunk index)
  Totals totals_;
};

}  // namespace ckptfs
