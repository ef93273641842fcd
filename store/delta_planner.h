// Stores a new pack's chunks against what the store already holds: a chunk
// whose bytes exist in a live pack becomes a reference (dedup); otherwise a
// chunk whose tensors the predecessor file also holds is coded as a delta
// against the predecessor's bytes at the matching position (lineage). Chains
// stop at `keyframe_every` deltas, so a read decodes at most that many.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "codec/chunk_codec.h"
#include "codec/delta_chunk.h"
#include "codec/lossy/file_coder.h"
#include "store/base_handoff.h"
#include "store/leading_pass.h"
#include "store/pack.h"
#include "store/pack_index.h"

namespace ckptfs {

// Cluster mode (store/cluster/seal_pin.h): a pack is used as a base only once it is
// admitted, which pins it for the seal; one that is not admitted is not used.
class BaseAdmission {
 public:
  virtual ~BaseAdmission() = default;
  virtual bool Admit(ObjectId pack) = 0;
};

class DeltaPlanner : public ChunkPlanner {
 public:
  // `tensors`: the new file's ranges, the same span WritePack gets.
  // `file`, when given (it outlives the planner), tells apart predecessors
  // that match its layout equally well by content (store/base_closeness.h).
  DeltaPlanner(PackIndex* index, BaseSource* bases, std::span<const TensorRange> tensors,
               const ChunkEncoderOptions& enc, uint32_t keyframe_every, BaseAdmission* admission = nullptr,
               const ByteSource* file = nullptr);
  DeltaPlanner(const DeltaPlanner&) = delete;
  DeltaPlanner& operator=(const DeltaPlanner&) = delete;

  std::optional<ChunkPlan> PlanRef(uint64_t offset, std::span<const uint8_t> raw, uint64_t content_hash,
                                   std::span<const TensorRange> ranges) override;
  std::optional<ChunkPlan> PlanDelta(uint64_t offset, std::span<const uint8_t> raw, std::span<const TensorRange> ranges,
                                     const std::function<size_t()>& standalone_size) override;

  // A read of a chunk at delta depth d decodes d + 1 chunks, so the deeper
  // a delta, the more it must save: 20% at depth 1, 40% at depth 2, ... and
  // 90% from depth 5 on (near-identical chunks, such as frozen layers, stay
  // deltas at any depth). The share of the standalone size a delta at
  // `depth` must come in under.
  static double DeltaKeep(uint8_t depth);

  // A plan whose payload starts with the base reference (base pack, offset
  // in its logical bytes): the whole payload of a ref, the head of a delta's
  // or a lossy chunk's.
  static ChunkPlan RefPlan(ChunkCodec codec, ObjectId base, uint64_t base_offset, uint8_t depth);

  // The predecessor, when one was found (0 otherwise).
  ObjectId base_pack() const { return base_ ? base_->pack : 0; }
  // Ends the planner's pins; returns packs nothing needs any more (to delete).
  std::vector<ObjectId> ReleasePins();

  // Lossy mode for this file (`coder` outlives the planner): chunks holding
  // lossy tensors are coded against the predecessor's reconstructed bytes
  // (closed loop), in chains of at most `keyframe_every`. `crc`, for a
  // coder that NeedsCrcPass: TransformLossy first runs the CRC pass as far
  // as the chunk needs, on this planner's thread.
  struct CrcPass {
    LeadingPass* pass;   // shared by every planner of the seal
    BaseHandoff* bases;  // ... too; may be null
    Env* env;
    int src_fd;  // the file being sealed
  };
  void SetLossy(LossyCoder* coder, uint32_t keyframe_every, const CrcPass* crc = nullptr);
  Result<std::optional<ChunkPlan>> TransformLossy(uint64_t offset, std::span<uint8_t> raw,
                                                  std::span<const TensorRange> ranges) override;
  // What the lossy file was coded from, for the meta block (same_input.h).
  void SetInput(const Digest128& digest) { input_ = InputDigest{digest, 0}; }
  bool Rewrites() const override { return lossy_ != nullptr; }
  void FinishMeta(PackMeta* meta) override;

 private:
  // The CRC pass's work on one chunk (LossyCoder::Reconstruct).
  Status CrcPassChunk(uint64_t off, uint64_t len);
  std::optional<ChunkPlan> PlanDedup(std::span<const uint8_t> raw, uint64_t content_hash);
  // The predecessor's bytes at this chunk's position (read once per chunk).
  bool LoadBaseBytes(uint64_t offset, std::span<const uint8_t> raw, std::span<const TensorRange> ranges);
  // A delta against the keyframe at the root of the chain the predecessor's
  // chunk belongs to (BaseSource::BaseOfChunk), if under `limit`.
  std::optional<ChunkPlan> PlanAgainstKeyframe(uint64_t offset, std::span<const uint8_t> raw,
                                               std::span<const TensorRange> ranges, const DeltaLimit& limit);
  std::optional<ChunkPlan> DeltaAgainst(ObjectId pack, uint64_t pack_offset, uint8_t depth, uint64_t offset,
                                        std::span<const uint8_t> raw, std::span<const uint8_t> base,
                                        std::span<const TensorRange> ranges, const DeltaLimit& limit);
  // Which pack holds the predecessor's bytes of this chunk and where,
  // judged by the tensor that covers most of it: a window of the chunk's
  // length, which may start before the pack but not run past its end.
  std::optional<std::pair<ObjectId, uint64_t>> BaseOffset(uint64_t offset, size_t len,
                                                          std::span<const TensorRange> ranges) const;
  // The delta depth of a base window (pack_format.h: it may start before the pack).
  uint8_t WindowDepth(ObjectId pack, uint64_t offset, size_t len) const;
  bool Admitted(ObjectId pack) { return admission_ == nullptr || admission_->Admit(pack); }
  // Picks the predecessor (lineage) and pins it.
  void FindPredecessor();
  // The predecessor's bytes a lossy chunk is predicted from (empty: none,
  // a keyframe, or no lossy tensor here), and the depth the chunk gets with them.
  std::span<const uint8_t> LossyBase(uint64_t offset, std::span<const uint8_t> raw, std::span<const TensorRange> ranges,
                                     uint8_t* depth);

  PackIndex* index_;
  BaseSource* bases_;
  std::span<const TensorRange> tensors_;
  TensorChunkOptions topts_;
  uint32_t keyframe_every_;
  BaseAdmission* admission_;
  const ByteSource* file_ = nullptr;
  std::optional<BaseChoice> base_;
  std::vector<ObjectId> pins_;
  // LoadBaseBytes' result for the chunk being planned.
  uint64_t base_for_offset_ = UINT64_MAX;
  ObjectId base_pack_ = 0;  // base_->pack, or a pack BaseChoice::other names
  std::optional<uint64_t> base_off_;
  uint8_t base_depth_ = 0;
  std::vector<uint8_t> base_bytes_;
  // A dedup hit's or the chain's keyframe's bytes, kept from chunk to chunk
  // (a fresh chunk-sized buffer costs a page fault per 4 KiB).
  std::vector<uint8_t> other_bytes_;
  LossyCoder* lossy_ = nullptr;
  // This worker's buffers for the lossy pieces it codes, in both passes;
  // they go with the planner when the seal ends.
  lossy::PieceScratch lossy_scratch_;
  uint32_t lossy_keyframe_every_ = 0;
  std::optional<CrcPass> crc_;
  std::optional<InputDigest> input_;
  std::vector<uint8_t> crc_buf_;  // the chunk the CRC pass reconstructs
};

}  // namespace ckptfs
