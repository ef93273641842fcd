#include "store/same_input.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "base/sync_point.h"
#include "codec/chunk_codec.h"
#include "codec/delta_chunk.h"
#include "store/delta_planner.h"

namespace ckptfs {
namespace {

constexpr size_t kDigestReadSize = size_t{1} << 20;
// Versions the digest: a change to what it covers must not match old packs.
constexpr std::string_view kDigestDomain = "ckptfs lossy input 1";

}  // namespace

Result<Digest128> LossyInputDigest(const ByteSource& file, std::string_view policy) {
  Digest128Stream h;
  const uint8_t end_of_text = 0;
  for (std::string_view s : {kDigestDomain, policy}) {
    h.Update(std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
    h.Update(std::span(&end_of_text, 1));
  }
  std::vector<uint8_t> buf(static_cast<size_t>(std::min<uint64_t>(kDigestReadSize, file.size())));
  for (uint64_t off = 0; off < file.size(); off += buf.size()) {
    const std::span<uint8_t> piece(buf.data(), static_cast<size_t>(std::min<uint64_t>(buf.size(), file.size() - off)));
    RETURN_IF_ERROR(file.ReadAt(off, piece).WithContext("reading the file for its input digest"));
    h.Update(piece);
  }
  return h.Finish();
}

SameInputSeals::Hold::~Hold() {
  {
    std::lock_guard lk(seals_->mu_);
    auto it = std::find(seals_->busy_.begin(), seals_->busy_.end(), digest_);
    if (it != seals_->busy_.end()) seals_->busy_.erase(it);
  }
  seals_->cv_.notify_all();
}

Result<std::unique_ptr<SameInputSeals::Hold>> SameInputSeals::Acquire(const Digest128& digest,
                                                                      const std::atomic<bool>* cancel) {
  std::unique_lock lk(mu_);
  while (std::find(busy_.begin(), busy_.end(), digest) != busy_.end()) {
    if (cancel != nullptr && cancel->load()) return Status::Error(ECANCELED, "pack write cancelled");
    // Under mu_: a test may make it a predecessor, never wait or call back here.
    CKPTFS_SYNC_POINT("SameInputSeals::Acquire:Waiting");
    // A cancel sets no condition: look again now and then.
    cv_.wait_for(lk, std::chrono::milliseconds(100));
  }
  busy_.push_back(digest);
  return std::make_unique<Hold>(this, digest);
}

Result<std::optional<ChunkPlan>> SameInputPlanner::TransformLossy(uint64_t offset, std::span<uint8_t> raw,
                                                                  std::span<const TensorRange> ranges) {
  (void)ranges;
  RETURN_IF_ERROR(bases_->ReadPackRangeOnce(same_.pack, offset, raw)
                      .WithContext("reading pack " + ObjectIdHex(same_.pack) + ", sealed from the same input"));
  if (IsAllZero(raw)) return std::optional<ChunkPlan>{};
  return std::optional<ChunkPlan>(DeltaPlanner::RefPlan(ChunkCodec::kRef, same_.pack, offset,
                                                        index_->RangeDepth(same_.pack, offset, raw.size())));
}

void SameInputPlanner::FinishMeta(PackMeta* meta) {
  meta->lossy = same_.lossy;
  meta->input = InputDigest{digest_, same_.pack};
}

}  // namespace ckptfs
