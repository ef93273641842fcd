#include "store/delta_planner.h"

#include <algorithm>
#include <cstring>
#include <tuple>

#include "base/le.h"
#include "codec/delta_chunk.h"
#include "store/base_closeness.h"

namespace ckptfs {

DeltaPlanner::DeltaPlanner(PackIndex* index, BaseSource* bases, std::span<const TensorRange> tensors,
                           const ChunkEncoderOptions& enc, uint32_t keyframe_every, BaseAdmission* admission,
                           const ByteSource* file)
    : index_(index),
      bases_(bases),
      tensors_(tensors),
      topts_{enc.zstd_level, enc.planes},
      keyframe_every_(keyframe_every),
      admission_(admission),
      file_(file) {
  if (keyframe_every_ > 0 && enc.tensor_codec) FindPredecessor();
}

void DeltaPlanner::FindPredecessor() {
  std::vector<BaseChoice> candidates =
      index_->FindBaseCandidates(tensors_, kCloseCandidateShare, file_ != nullptr ? kMaxComparedBases : 1);
  if (candidates.empty()) return;
  const size_t pick = file_ != nullptr ? ClosestBase(*file_, tensors_, candidates, *bases_) : 0;
  if (!index_->PinCandidate(candidates[pick].pack)) return;
  base_ = std::move(candidates[pick]);
  pins_.push_back(base_->pack);
  if (!Admitted(base_->pack)) {
    base_.reset();
    return;
  }
  for (ObjectId other : index_->FillByName(&*base_, tensors_)) {
    pins_.push_back(other);
    if (Admitted(other)) continue;
    for (size_t i = 0; i < base_->other.size(); ++i) {
      if (base_->other[i].pack == other) base_->other[i] = {}, base_->base_offset[i].reset();
    }
  }
}

void DeltaPlanner::SetLossy(LossyCoder* coder, uint32_t keyframe_every, const CrcPass* crc) {
  lossy_ = coder;
  lossy_keyframe_every_ = keyframe_every;
  if (crc != nullptr && coder->NeedsCrcPass()) crc_ = *crc;
  if (!base_ && keyframe_every > 0) FindPredecessor();
}

std::span<const uint8_t> DeltaPlanner::LossyBase(uint64_t offset, std::span<const uint8_t> raw,
                                                 std::span<const TensorRange> ranges, uint8_t* depth) {
  *depth = 0;
  if (!lossy_->HasWork(offset, raw.size()) || !LoadBaseBytes(offset, raw, ranges) ||
      base_depth_ + 1u > lossy_keyframe_every_) {
    return {};
  }
  *depth = static_cast<uint8_t>(base_depth_ + 1);
  return base_bytes_;
}

Status DeltaPlanner::CrcPassChunk(uint64_t off, uint64_t len) {
  if (!lossy_->CrcChunk(off, len)) return Status::Ok();
  crc_buf_.resize(len);
  RETURN_IF_ERROR(crc_->env->PReadExact(crc_->src_fd, crc_buf_, off));
  uint8_t depth = 0;
  RETURN_IF_ERROR(lossy_->Reconstruct(
      off, crc_buf_, LossyBase(off, crc_buf_, RangesOverlapping(tensors_, off, off + len), &depth), &lossy_scratch_));
  if (crc_->bases != nullptr && base_for_offset_ == off && base_off_) {
    crc_->bases->Put(off, base_pack_, *base_off_, &base_bytes_);
    base_for_offset_ = UINT64_MAX;  // base_bytes_ went with them
  }
  return Status::Ok();
}

Result<std::optional<ChunkPlan>> DeltaPlanner::TransformLossy(uint64_t offset, std::span<uint8_t> raw,
                                                              std::span<const TensorRange> ranges) {
  if (lossy_ == nullptr) return std::optional<ChunkPlan>{};
  if (crc_) {
    RETURN_IF_ERROR(crc_->pass->RunThrough(lossy_->CrcPassEnd(offset, raw.size()),
                                           [this](uint64_t off, uint64_t len) { return CrcPassChunk(off, len); }));
  }
  uint8_t depth = 0;
  ASSIGN_OR_RETURN(std::optional<LossyChunk> chunk,
                   lossy_->Encode(offset, raw, LossyBase(offset, raw, ranges, &depth), &lossy_scratch_));
  if (!chunk) return std::optional<ChunkPlan>{};
  ChunkPlan p = chunk->used_base ? RefPlan(ChunkCodec::kLossy, base_pack_, *base_off_, depth)
                                 : RefPlan(ChunkCodec::kLossy, 0, 0, 0);
  p.payload.insert(p.payload.end(), chunk->payload.begin(), chunk->payload.end());
  return std::optional<ChunkPlan>(std::move(p));
}

void DeltaPlanner::FinishMeta(PackMeta* meta) {
  if (lossy_ == nullptr) return;
  meta->lossy = lossy_->info();
  meta->input = input_;
}

std::vector<ObjectId> DeltaPlanner::ReleasePins() {
  std::vector<ObjectId> dead;
  for (ObjectId id : pins_) {
    std::vector<ObjectId> d = index_->Unpin(id);
    dead.insert(dead.end(), d.begin(), d.end());
  }
  pins_.clear();
  return dead;
}

ChunkPlan DeltaPlanner::RefPlan(ChunkCodec codec, ObjectId base, uint64_t base_offset, uint8_t depth) {
  ChunkPlan p{codec, std::vector<uint8_t>(kBaseRefSize), base, depth};
  le::Put64(p.payload, 0, base);
  le::Put64(p.payload, 8, base_offset);
  return p;
}

double DeltaPlanner::DeltaKeep(uint8_t depth) { return std::max(0.1, 1.0 - 0.2 * depth); }

std::optional<ChunkPlan> DeltaPlanner::PlanRef(uint64_t offset, std::span<const uint8_t> raw, uint64_t content_hash,
                                               std::span<const TensorRange> ranges) {
  if (std::optional<ChunkPlan> ref = PlanDedup(raw, content_hash)) return ref;
  // Unchanged since the predecessor, at the matching tensor position.
  if (LoadBaseBytes(offset, raw, ranges) && std::memcmp(base_bytes_.data(), raw.data(), raw.size()) == 0) {
    return RefPlan(ChunkCodec::kRef, base_pack_, *base_off_, base_depth_);
  }
  return std::nullopt;
}

std::optional<ChunkPlan> DeltaPlanner::PlanDedup(std::span<const uint8_t> raw, uint64_t content_hash) {
  std::optional<std::pair<ObjectId, uint64_t>> hit = index_->FindChunk(content_hash, raw.size());
  if (!hit) return std::nullopt;
  pins_.push_back(hit->first);
  if (!Admitted(hit->first)) return std::nullopt;
  // A hash match is a hint, not a proof: compare the bytes.
  std::vector<uint8_t>& stored = other_bytes_;
  stored.resize(raw.size());
  if (!bases_->ReadPackRangeOnce(hit->first, hit->second, stored).ok()) return std::nullopt;
  if (std::memcmp(stored.data(), raw.data(), raw.size()) != 0) return std::nullopt;
  return RefPlan(ChunkCodec::kRef, hit->first, hit->second, index_->RangeDepth(hit->first, hit->second, raw.size()));
}

bool DeltaPlanner::LoadBaseBytes(uint64_t offset, std::span<const uint8_t> raw, std::span<const TensorRange> ranges) {
  if (base_for_offset_ == offset) return base_off_.has_value();
  base_for_offset_ = offset;
  base_off_.reset();
  if (!base_ || ranges.empty()) return false;
  std::optional<std::pair<ObjectId, uint64_t>> at = BaseOffset(offset, raw.size(), ranges);
  if (!at) return false;
  // The CRC pass may have read them for this chunk already.
  const bool handed = crc_ && crc_->bases != nullptr &&
                      crc_->bases->Take(offset, at->first, at->second, &base_bytes_) &&
                      base_bytes_.size() == raw.size();
  if (!handed) {
    base_bytes_.resize(raw.size());
    if (!bases_->ReadBaseWindow(at->first, at->second, base_bytes_, /*once=*/true).ok()) return false;
  }
  base_pack_ = at->first;
  base_off_ = at->second;
  base_depth_ = WindowDepth(at->first, at->second, raw.size());
  return true;
}

uint8_t DeltaPlanner::WindowDepth(ObjectId pack, uint64_t offset, size_t len) const {
  const uint64_t lead = BaseWindowLead(offset);  // the leading zeros decode from nothing
  return lead >= len ? 0 : index_->RangeDepth(pack, offset + lead, len - lead);
}

std::optional<std::pair<ObjectId, uint64_t>> DeltaPlanner::BaseOffset(uint64_t offset, size_t len,
                                                                      std::span<const TensorRange> ranges) const {
  const TensorRange* best = nullptr;
  uint64_t best_overlap = 0;
  for (const TensorRange& r : ranges) {
    const uint64_t lo = std::max(offset, r.offset), hi = std::min(offset + len, r.offset + r.length);
    if (hi > lo && hi - lo > best_overlap) best = &r, best_overlap = hi - lo;
  }
  if (best == nullptr) return std::nullopt;
  const size_t idx = static_cast<size_t>(best - tensors_.data());
  if (idx >= base_->base_offset.size() || !base_->base_offset[idx]) return std::nullopt;
  const uint64_t tensor_base = *base_->base_offset[idx];
  const bool other = idx < base_->other.size() && base_->other[idx].pack != 0;
  const ObjectId pack = other ? base_->other[idx].pack : base_->pack;
  const uint64_t pack_size = other ? base_->other[idx].logical_size : base_->logical_size;
  // The chunk keeps its position relative to that tensor. Where the tensor
  // sits further into this file than into the base (the header grew), the
  // window of a chunk near the start begins before the base: those bytes
  // read as zeros (a leading window, pack version 5); the tensor bytes
  // still line up.
  const uint64_t base_off = tensor_base + offset - best->offset;  // wraps back for chunks starting before it
  const uint64_t lead = offset < best->offset && best->offset - offset > tensor_base ? uint64_t{0} - base_off : 0;
  if (lead > 0) {
    if (lead >= len || len - lead > pack_size) return std::nullopt;
  } else if (base_off > pack_size || pack_size - base_off < len) {
    return std::nullopt;
  }
  return std::make_pair(pack, base_off);
}

std::optional<ChunkPlan> DeltaPlanner::PlanDelta(uint64_t offset, std::span<const uint8_t> raw,
                                                 std::span<const TensorRange> ranges,
                                                 const std::function<size_t()>& standalone_size) {
  if (!LoadBaseBytes(offset, raw, ranges)) return std::nullopt;
  std::optional<ChunkPlan> plan;
  if (base_depth_ + 1u <= keyframe_every_) {  // otherwise a keyframe: the chain stops here
    const uint8_t depth = static_cast<uint8_t>(base_depth_ + 1);
    plan = DeltaAgainst(base_pack_, *base_off_, depth, offset, raw, base_bytes_, ranges,
                        {DeltaKeep(depth), &standalone_size});
  }
  if (base_depth_ == 0) return plan;
  // Parts that barely change (metadata, frozen layers) code as small against
  // the chain's keyframe as against the predecessor: take the keyframe when it
  // costs little more, so such chunks never build deep chains.
  std::optional<ChunkPlan> rooted = PlanAgainstKeyframe(offset, raw, ranges, {DeltaKeep(1), &standalone_size});
  if (rooted && (!plan || rooted->payload.size() <= plan->payload.size() + plan->payload.size() / 4)) return rooted;
  return plan;
}

std::optional<ChunkPlan> DeltaPlanner::DeltaAgainst(ObjectId pack, uint64_t pack_offset, uint8_t depth, uint64_t offset,
                                                    std::span<const uint8_t> raw, std::span<const uint8_t> base,
                                                    std::span<const TensorRange> ranges, const DeltaLimit& limit) {
  ChunkPlan plan = RefPlan(ChunkCodec::kDelta, pack, pack_offset, depth);
  if (!EncodeDeltaChunk(raw, base, offset, ranges, topts_, &plan.payload, limit).ok()) return std::nullopt;
  return plan;
}

std::optional<ChunkPlan> DeltaPlanner::PlanAgainstKeyframe(uint64_t offset, std::span<const uint8_t> raw,
                                                           std::span<const TensorRange> ranges,
                                                           const DeltaLimit& limit) {
  ObjectId pack = base_pack_;
  uint64_t pack_offset = *base_off_;
  // Follow the references of the chunks the window lies in down to a chunk
  // that decodes on its own (across a move of the file's tensors too).
  for (uint32_t hops = 0; hops <= keyframe_every_; ++hops) {
    std::optional<std::pair<ObjectId, uint64_t>> next = bases_->BaseOfChunk(pack, pack_offset, raw.size());
    if (!next) break;
    std::tie(pack, pack_offset) = *next;
  }
  if (pack == base_pack_ || !index_->Contains(pack) || WindowDepth(pack, pack_offset, raw.size()) != 0 ||
      !Admitted(pack)) {
    return std::nullopt;
  }
  std::vector<uint8_t>& root = other_bytes_;
  root.resize(raw.size());
  if (!bases_->ReadBaseWindow(pack, pack_offset, root, /*once=*/true).ok()) return std::nullopt;
  return DeltaAgainst(pack, pack_offset, 1, offset, raw, root, ranges, limit);
}

}  // namespace ckptfs
