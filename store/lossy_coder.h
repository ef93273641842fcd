// Lossy mode for one file being sealed: decides which tensors are coded
// lossily (floating-point weights and optimizer moments within the policy's
// scope, codec/lossy/roles.h, of formats whose loaders do not verify data
// checksums), with what error target and what
// sensitivity, and turns each chunk into a kLossy payload whose
// reconstruction replaces the chunk's bytes. For zip formats (torch.save,
// npz) it first runs the reconstruction once over the file to learn each
// rewritten member's CRC-32, so that the headers, which come before the
// data, can carry the new CRCs.
#pragma once

#include <cstdint>
#include <functional>
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
#include "codec/lossy/roles.h"
#include "store/env.h"
#include "store/lossy_policy.h"
#include "store/pack_meta.h"

namespace ckptfs {

// Tensors smaller than this stay exact: a piece's header and tables would
// cost more than quantizing saves, and the scalars (Adam's step) never move.
inline constexpr uint64_t kMinLossyElements = 64;

// Adam's second moments from another file of the same save (optimizer.pt
// beside model.safetensors), for weights whose own file lacks them.
struct SiblingMoments {
  std::string name;  // for logs
  std::shared_ptr<const ByteSource> source;
  FileLayout layout;
};
// Candidates, most plausible first, that already passed the store's checks
// (same owner, same directory, same save window: Store::FindSiblingMoments).
// Asked only when the file has weights and no optimizer state of its own;
// the coder uses the first whose second moments match the file's
// parameters one for one (MatchSiblingMoments).
using SiblingFinder = std::function<std::vector<SiblingMoments>()>;

// Whether `sibling`'s second moments belong to the parameters of `model`:
// as many second moments (amsgrad's max_exp_avg_sq aside) as the model has
// parameters, each of the same element type and count and the same shape
// where both parsers know a shape of more than one dimension. When the
// optimizer's param_groups name its parameters (FileLayout::param_names),
// they are paired by those names with the model's labels; otherwise in
// order, and where the sibling names the parameter in the moment's label
// ("fc.weight.exp_avg_sq"), the names must agree. On a match, returns for
// each parameter (index into model.tensors) its second moment's index into
// sibling.tensors; otherwise the reason, for the log.
Result<std::vector<std::pair<size_t, size_t>>> MatchSiblingMoments(const FileLayout& model,
                                                                   const FileLayout& sibling,
                                                                   lossy::LossyScope scope);

struct LossyChunk {
  std::vector<uint8_t> payload;  // after the base reference
  bool used_base = false;        // some piece is predicted from the base bytes
};

class LossyCoder {
 public:
  // `ranges`: TensorRangesOf(layout), as the pack writer has them.
  LossyCoder(Env* env, int src_fd, const FileLayout& layout, std::span<const TensorRange> ranges,
             const LossyPolicy& policy, const TensorChunkOptions& topts, const SiblingFinder& find_sibling = {});

  // Whether any tensor of the file is coded lossily.
  bool active() const { return !tensors_.empty(); }
  bool HasWork(uint64_t offset, uint64_t len) const;
  // Whether zip CRCs must be learnt first (Reconstruct over every chunk
  // CrcChunks names, in order, then Encode).
  bool NeedsCrcPass() const { return !crc_fields_.empty(); }
  bool CrcChunk(uint64_t offset, uint64_t len) const;
  // CRC pass: rewrites `raw` with its reconstruction and feeds the CRCs.
  Status Reconstruct(uint64_t offset, std::span<uint8_t> raw, std::span<const uint8_t> base);
  // Rewrites `raw` with the reconstruction and patched CRCs; returns the
  // kLossy payload (after the base reference) when the chunk holds lossy
  // tensors, nothing otherwise. Safe to call from several threads, once the
  // CRC pass is over.
  Result<std::optional<LossyChunk>> Encode(uint64_t offset, std::span<uint8_t> raw, std::span<const uint8_t> base);
  const LossyInfo& info() const { return info_; }
  // Weights whose sensitivity comes from a sibling file's second moments.
  uint32_t sibling_pairs() const { return sibling_pairs_; }
  // The sibling used, or why each candidate was not (for the log).
  const std::string& sibling_note() const { return sibling_note_; }

 private:
  struct Tensor {
    uint64_t offset = 0, length = 0;
    DType dtype = DType::kF32;
    lossy::TensorRole role = lossy::TensorRole::kOther;
    std::optional<uint64_t> v_offset;  // the partner second moment, same element type
    bool v_in_sibling = false;         // ... in sibling_, not in this file
    uint32_t order = 0;
  };
  void PairWithSibling(const FileLayout& layout, lossy::LossyScope scope, const SiblingFinder& find_sibling);
  Result<std::vector<lossy::ChunkSegment>> Segments(uint64_t offset, uint64_t len) const;
  Result<std::vector<float>> Sensitivity(const Tensor& t, uint64_t begin, uint64_t end) const;
  Status CodeChunk(uint64_t offset, std::span<uint8_t> raw, std::span<const uint8_t> base,
                   std::vector<lossy::ChunkSegment>* segs, std::vector<uint8_t>* out);
  void Record(const lossy::ChunkSegment& s);

  Env* env_;
  int src_fd_;
  double fidelity_;
  TensorChunkOptions topts_;
  std::span<const TensorRange> ranges_;  // the lossless codec's view of the file
  std::vector<Tensor> tensors_;          // lossy ones, sorted by offset
  std::vector<ZipCrcField> crc_fields_;
  std::optional<SiblingMoments> sibling_;
  uint32_t sibling_pairs_ = 0;
  std::string sibling_note_;
  std::optional<formats::ZipCrcTracker> tracker_;  // CRC pass
  // Encode may run on several sealing workers at once (after the CRC pass,
  // which runs in order on one): mu_ guards the CRCs' first read and info_.
  std::mutex mu_;
  bool crcs_ready_ = false;
  std::vector<uint32_t> crcs_;  // the CRC pass's result, for Encode
  LossyInfo info_;
};

}  // namespace ckptfs
