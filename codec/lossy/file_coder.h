// Lossy mode for one file being sealed: decides which tensors are coded
// lossily (floating-point weights and optimizer moments within the policy's
// scope, codec/lossy/roles.h, of formats whose loaders do not verify data
// checksums), with what error target and what sensitivity (the Fisher
// weighting: Adam's second moments, the file's own or a sibling file's,
// codec/lossy/siblings.h), and turns each chunk into a kLossy payload whose
// reconstruction replaces the chunk's bytes. For zip formats (torch.save,
// npz) it first runs the reconstruction once over the file to learn each
// rewritten member's CRC-32, so that the headers, which come before the
// data, can carry the new CRCs. That pass runs a member ahead of the
// pack's pass (CrcPassEnd) and keeps the pieces' blobs, up to a budget, so
// that the pack's pass decodes them instead of coding again.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "codec/formats/layout.h"
#include "codec/formats/zip_crc.h"
#include "codec/lossy/lossy_chunk.h"
#include "codec/lossy/lossy_info.h"
#include "codec/lossy/policy.h"
#include "codec/lossy/roles.h"
#include "codec/lossy/siblings.h"
#include "codec/tensor_chunk.h"

namespace ckptfs {

// Tensors smaller than this stay exact: a piece's header and tables would
// cost more than quantizing saves, and the scalars (Adam's step) never move.
inline constexpr uint64_t kMinLossyElements = 64;

// Blob bytes the CRC pass keeps for the pack's pass, per file being sealed.
// Pieces past it keep only what the search chose, and the pack's pass codes
// them again (same bytes, more CPU). Blobs live from the CRC pass to the
// pack's pass, about a member apart; lossy blobs are about a tenth of the
// elements' size at lossy=0.05, so this covers members of a few hundred
// MB; memory stays bounded for any size.
inline constexpr uint64_t kCodedPieceBudget = 48ull << 20;

struct LossyChunk {
  std::vector<uint8_t> payload;  // after the base reference
  bool used_base = false;        // some piece, or the lossless run, is coded against the base bytes
};

class LossyCoder {
 public:
  // `file`: the file's bytes, which outlive the coder (its own second
  // moments are read from it). `ranges`: TensorRangesOf(layout), as the
  // pack writer has them. `siblings`, when given, is asked for the
  // optimizer file of a file of weights alone, while the coder is made; the
  // first candidate whose second moments match this file's parameters one
  // for one (MatchSiblingMoments) weighs them.
  LossyCoder(const ByteSource& file, const FileLayout& layout, std::span<const TensorRange> ranges,
             const LossyPolicy& policy, const TensorChunkOptions& topts, SiblingSource* siblings = nullptr);

  // Whether any tensor of the file is coded lossily.
  bool active() const { return !tensors_.empty(); }
  bool HasWork(uint64_t offset, uint64_t len) const;
  // Whether zip CRCs must be learnt first (Reconstruct over every chunk
  // CrcChunk names, in any order and on any number of threads, then Encode).
  bool NeedsCrcPass() const { return !crc_fields_.empty(); }
  bool CrcChunk(uint64_t offset, uint64_t len) const;
  // How far into the file the CRC pass must have run before Encode of the
  // chunk at `offset`: past the chunk itself and past the data of every
  // member whose CRC field it holds. The pack's pass can then follow the
  // CRC pass a member behind, not a file behind, so the blobs kept between
  // the two stay within the budget for members of up to a few hundred MB.
  uint64_t CrcPassEnd(uint64_t offset, uint64_t len) const;
  // CRC pass: rewrites `raw` with its reconstruction and feeds the CRCs.
  // Keeps each piece's blob while the budget lasts (Encode then decodes
  // it), else what the search chose (Encode then codes the piece again
  // without searching). Safe to call from several threads.
  // `scratch`: the calling worker's buffers (null: fresh ones).
  Status Reconstruct(uint64_t offset, std::span<uint8_t> raw, std::span<const uint8_t> base,
                     lossy::PieceScratch* scratch = nullptr);
  // Rewrites `raw` with the reconstruction and patched CRCs; returns the
  // kLossy payload (after the base reference) when the chunk holds lossy
  // tensors, nothing otherwise. Safe to call from several threads, once the
  // CRC pass has run through CrcPassEnd.
  Result<std::optional<LossyChunk>> Encode(uint64_t offset, std::span<uint8_t> raw, std::span<const uint8_t> base,
                                           lossy::PieceScratch* scratch = nullptr);
  const LossyInfo& info() const { return info_; }
  // Weights whose sensitivity comes from a sibling file's second moments.
  uint32_t sibling_pairs() const { return sibling_pairs_; }
  // The sibling used, or why each candidate was not (for the log).
  const std::string& sibling_note() const { return sibling_note_; }
  // Blob bytes the CRC pass may keep (kCodedPieceBudget; tests set 0 to
  // check that both ways give the same pack). Before the CRC pass only.
  void set_coded_piece_budget(uint64_t bytes) { coded_budget_ = bytes; }

 private:
  struct Tensor {
    uint64_t offset = 0, length = 0;
    DType dtype = DType::kF32;
    lossy::TensorRole role = lossy::TensorRole::kOther;
    std::optional<uint64_t> v_offset;  // the partner second moment, same element type
    bool v_in_sibling = false;         // ... in sibling_, not in this file
    uint32_t order = 0;
    std::optional<uint64_t> m_offset;  // weights: the partner first moment in this file
  };
  // Which tensors are coded how, from `layout` (the shard's labelled one for DCP).
  void Classify(const FileLayout& layout, lossy::LossyScope scope, SiblingSource* siblings);
  void PairWithSibling(const FileLayout& layout, lossy::LossyScope scope, SiblingSource& siblings);
  using CodedPieces = std::map<uint64_t, lossy::CodedPiece>;  // by the piece's file offset
  // The chunk's segments; pieces in `coded` get no sensitivity or one-step
  // target (their blob is decoded, not coded).
  Result<std::vector<lossy::ChunkSegment>> Segments(uint64_t offset, uint64_t len, lossy::PieceScratch* scratch,
                                                    const CodedPieces* coded = nullptr) const;
  Result<std::vector<float>> Sensitivity(const Tensor& t, uint64_t begin, uint64_t end,
                                         lossy::PieceScratch* scratch) const;
  // The one-step measure's relative target for a weight piece; 0 when it cannot be judged.
  Result<double> OneStepTarget(const Tensor& t, uint64_t begin, uint64_t end, lossy::PieceScratch* scratch) const;
  // Whether a weight is bounded by the one-step measure.
  bool OneStep(const Tensor& t) const {
    return one_step_ && t.role == lossy::TensorRole::kWeight && t.m_offset && t.v_offset && !t.v_in_sibling;
  }
  // Sets the targets and rule info_ reports, once the tensors are classified.
  void DescribeTargets();
  Status CodeChunk(uint64_t offset, std::span<uint8_t> raw, std::span<const uint8_t> base,
                   std::vector<lossy::ChunkSegment>* segs, std::vector<uint8_t>* out, lossy::PieceScratch* scratch,
                   const CodedPieces* coded = nullptr, bool* lossless_against_base = nullptr);
  // After the CRC pass codes a chunk: keeps each piece's blob within the
  // budget, else its choice.
  void KeepCoded(uint64_t offset, std::vector<lossy::ChunkSegment>& segs);
  // The CRC pass's blobs for the pieces in [offset, offset + len), taken
  // out of coded_ (each is used once).
  CodedPieces TakeCoded(uint64_t offset, uint64_t len);
  void Record(const lossy::ChunkSegment& s);
  // Writes the CRCs of the members whose fields lie in the chunk.
  Status PatchCrcs(uint64_t offset, std::span<uint8_t> raw) const;
  // The CRC fields' offsets and their members (index into crc_fields_), by offset.
  std::span<const std::pair<uint64_t, size_t>> FieldsIn(uint64_t offset, uint64_t len) const;

  const ByteSource& file_;
  double fidelity_;
  // The one-step measure (codec/lossy/policy.h): the policy's C, the
  // optimizer's smallest learning rate and epsilon, and whether any weight
  // of the file can be judged by it.
  double step_budget_ = 0;
  double lr_ = 0, eps_ = 1e-8;
  bool one_step_ = false;
  TensorChunkOptions topts_;
  std::span<const TensorRange> ranges_;  // the lossless codec's view of the file
  std::vector<Tensor> tensors_;          // lossy ones, sorted by offset
  std::vector<ZipCrcField> crc_fields_;
  std::vector<std::pair<uint64_t, size_t>> field_at_;  // (field offset, member), sorted
  std::optional<SiblingMoments> sibling_;
  uint32_t sibling_pairs_ = 0;
  std::string sibling_note_;
  std::optional<formats::ZipCrcTracker> tracker_;  // CRC pass
  // The CRC pass and Encode run on several sealing workers at once: mu_
  // guards choices_, coded_ and info_.
  std::mutex mu_;
  std::map<uint64_t, lossy::PieceChoice> choices_;  // by the piece's file offset, from the CRC pass
  CodedPieces coded_;                               // ... those within the budget, coded
  uint64_t coded_bytes_ = 0;                        // blob bytes in coded_
  uint64_t coded_budget_ = kCodedPieceBudget;
  LossyInfo info_;
};

}  // namespace ckptfs
