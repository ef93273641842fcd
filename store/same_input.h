// Identical input, identical reconstruction. A lossy seal codes a file in
// closed loop against its predecessor's reconstruction, so two saves of the
// same state (Lightning's last.ckpt beside epoch=N.ckpt) sealed against
// different predecessors would read back different. Instead a pack sealed
// under a lossy policy records a digest of what it was coded from (the
// policy and the file's raw bytes, PackMeta::input); a later file with the
// same digest and size is stored as a pack of refs to that pack's chunks,
// so it reads back byte for byte the same and costs a chunk table.
//
// Whole files only: a zip checkpoint's CRC fields lie in other chunks than
// the data they cover, so reusing the reconstruction of some chunks and
// coding the others anew would not be consistent.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "base/hash.h"
#include "base/status.h"
#include "codec/formats/layout.h"
#include "store/pack.h"
#include "store/pack_index.h"

namespace ckptfs {

// XXH3-128 of `policy` (FormatLossyPolicy) and every byte of `file`, read
// in bounded pieces.
Result<Digest128> LossyInputDigest(const ByteSource& file, std::string_view policy);

// Seals in progress by input digest. Two saves of one state are often
// sealed at once (a read of the second seals it ahead of the queue): the
// second waits until the first one's pack is named by its stub, or given
// up, and then finds it in the index.
class SameInputSeals {
 public:
  class Hold {
   public:
    Hold(SameInputSeals* seals, const Digest128& digest) : seals_(seals), digest_(digest) {}
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    SameInputSeals* seals_;
    Digest128 digest_;
  };
  // Waits while another seal holds `digest` (ECANCELED once `cancel` is
  // set), then holds it until the Hold goes.
  Result<std::unique_ptr<Hold>> Acquire(const Digest128& digest, const std::atomic<bool>* cancel);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Digest128> busy_;
};

// Plans every chunk of the file being sealed as a ref to the chunk at the
// same offset of `same.pack`, whose bytes (its reconstruction) replace the
// file's: the new pack reads back exactly as that one. Chunks that
// reconstruct as all zeros are stored on their own (they cost nothing).
// The pack must be pinned (PackIndex::FindSameInput) until the new pack is
// in the index. Thread-safe: the workers of one seal may share one.
class SameInputPlanner : public ChunkPlanner {
 public:
  SameInputPlanner(const PackIndex* index, BaseSource* bases, const SameInputPack& same, const Digest128& digest)
      : index_(index), bases_(bases), same_(same), digest_(digest) {}

  std::optional<ChunkPlan> PlanRef(uint64_t, std::span<const uint8_t>, uint64_t,
                                   std::span<const TensorRange>) override {
    return std::nullopt;
  }
  std::optional<ChunkPlan> PlanDelta(uint64_t, std::span<const uint8_t>, std::span<const TensorRange>,
                                     const std::function<size_t()>&) override {
    return std::nullopt;
  }
  Result<std::optional<ChunkPlan>> TransformLossy(uint64_t offset, std::span<uint8_t> raw,
                                                  std::span<const TensorRange> ranges) override;
  bool Rewrites() const override { return true; }
  // The source's lossy section (what its coding measured) and this pack's
  // input section, naming the source.
  void FinishMeta(PackMeta* meta) override;

 private:
  const PackIndex* index_;
  BaseSource* bases_;
  SameInputPack same_;
  Digest128 digest_;
};

}  // namespace ckptfs
