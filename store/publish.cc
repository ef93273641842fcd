// Store::PublishPack: a staged file coded into a new pack, as its seal
// planner says, against the bases its delta planners choose, made durable
// and indexed.
#include "store/store.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>

#include "base/log.h"
#include "base/metrics.h"
#include "base/sync_point.h"
#include "store/cluster/seal_pin.h"
#include "store/delta_planner.h"
#include "store/env_source.h"
#include "store/private_store.h"
#include "store/same_input.h"
#include "store/store_internal.h"

namespace ckptfs {

Result<std::unique_ptr<SealPin>> Store::StartSealPin(ObjectId new_pack) {
  if (!pins_.valid()) return std::unique_ptr<SealPin>();
  ASSIGN_OR_RETURN(std::unique_ptr<SealPin> pin, SealPin::Create(env_, pins_.get()));
  const ObjectId ids[] = {new_pack};
  RETURN_IF_ERROR(pin->Add(ids));
  return pin;
}

bool Store::UsableAsBase(ObjectId id) {
  // Opened afresh for each look: an NFS client revalidates a directory it
  // opens, so a marker another node just made is not hidden by a cached
  // negative lookup.
  const std::string dir = std::string(kGcDirName) + "/" + kGcDoomedDirName;
  Result<UniqueFd> doomed_dir = env_->OpenAt(root_.get(), dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
  if (!doomed_dir.ok() && doomed_dir.status().code() != ENOENT) return false;
  if (doomed_dir.ok()) {
    Result<struct stat> doomed = env_->FstatAt(doomed_dir->get(), ObjectIdHex(id), AT_SYMLINK_NOFOLLOW);
    if (doomed.ok() || doomed.status().code() != ENOENT) return false;
  }
  // Checked after the marker: GC deletes a pack before its marker, so a
  // pack found here was not deleted before the marker was looked for.
  return PackFileSize(id).ok();
}

std::unique_ptr<BaseAdmission> Store::AdmissionFor(SealPin* pin) {
  if (pin == nullptr) return nullptr;
  auto bases_of = [this](ObjectId id) -> Result<std::vector<ObjectId>> {
    // Meta blocks never change: the index's copy saves reading the whole
    // lineage of a file's predecessor at every seal.
    if (std::optional<std::vector<ObjectId>> bases = index_.BasesOf(id)) return *std::move(bases);
    ASSIGN_OR_RETURN(std::shared_ptr<PackReader> r, CachedPack(id));
    RETURN_IF_ERROR(r->meta_status());
    return r->meta().bases;
  };
  PinnedBases::Probe probe{.bases_of = bases_of, .usable = [this](ObjectId id) { return UsableAsBase(id); }};
  return std::make_unique<PinnedBases>(pin, std::move(probe));
}

namespace {

// Ends the pins a publish's planners hold when the publish is over, on
// every path out of it: the packs they pin may go only once the new pack,
// if any, is in the index as their user. `drop` gets the packs nothing
// needs any more.
class PlannerPins {
 public:
  using DropDead = std::function<void(const std::vector<ObjectId>&)>;
  PlannerPins(const std::vector<std::unique_ptr<DeltaPlanner>>& planners, DropDead drop)
      : planners_(planners), drop_(std::move(drop)) {}
  PlannerPins(const PlannerPins&) = delete;
  PlannerPins& operator=(const PlannerPins&) = delete;
  ~PlannerPins() {
    for (const auto& p : planners_) drop_(p->ReleasePins());
  }

 private:
  const std::vector<std::unique_ptr<DeltaPlanner>>& planners_;
  DropDead drop_;
};

// Ends one pin of `pack` (none: 0) in the index on every path out of a
// publish, as PlannerPins does for the planners' pins.
class IndexPin {
 public:
  IndexPin(PackIndex* index, ObjectId pack, PlannerPins::DropDead drop)
      : index_(index), pack_(pack), drop_(std::move(drop)) {}
  IndexPin(const IndexPin&) = delete;
  IndexPin& operator=(const IndexPin&) = delete;
  ~IndexPin() {
    if (pack_ != 0) drop_(index_->Unpin(pack_));
  }

 private:
  PackIndex* index_;
  ObjectId pack_;
  PlannerPins::DropDead drop_;
};

// A published pack, for the daemon's metrics (base/metrics.h).
void CountSeal(uint64_t logical, uint64_t stored, std::chrono::steady_clock::duration took) {
  Metrics& m = GlobalMetrics();
  m.sealed_files.Add();
  m.sealed_bytes.Add(logical);
  m.sealed_pack_bytes.Add(stored);
  m.seal_nanoseconds.Add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count()));
}

// Fills `out` (its chunk_size preset to the store's) through the
// planner; kSealPostponed when the seal should wait for more of its save.
Status PlanSealCoding(const StoreOptions& opts, const ByteSource& file, const LossyPolicy& policy,
                      SiblingSource* siblings, const std::string& ctx, SealCoding* out) {
  if (!opts.encoder.tensor_codec) return Status::Ok();
  const SealPlanner& planner = opts.planner ? *opts.planner : GenericSealPlanner();
  RETURN_IF_ERROR(planner.Plan(file, policy, siblings,
                               TensorChunkOptions{opts.encoder.zstd_level, opts.encoder.planes}, ctx, out));
  // A smaller chunk must not take a file past a pack's chunk count.
  if (pack_layout::ChunkCount(file.size(), out->chunk_size) > kMaxPackChunks) out->chunk_size = opts.chunk_size;
  return Status::Ok();
}

// One delta planner per sealing worker.
std::vector<std::unique_ptr<DeltaPlanner>> DeltaPlanners(unsigned workers, PackIndex* index, BaseSource* bases,
                                                         std::span<const TensorRange> tensors,
                                                         const StoreOptions& opts, BaseAdmission* admission,
                                                         const ByteSource* file) {
  std::vector<std::unique_ptr<DeltaPlanner>> planners;
  for (unsigned w = 0; w < workers; ++w) {
    planners.push_back(std::make_unique<DeltaPlanner>(index, bases, tensors, opts.encoder,
                                                      opts.delta ? opts.keyframe_every : 0, admission, file));
  }
  return planners;
}

void LogSealTime(const std::string& ctx, uint64_t size, uint64_t stored, std::chrono::steady_clock::duration took,
                 unsigned workers) {
  const double secs = std::chrono::duration<double>(took).count();
  spdlog::debug("{}: {} bytes stored in {} ({:.3f}x), {:.3f} s with {} worker(s), {:.0f} MB/s", ctx, size, stored,
                stored ? double(size) / double(stored) : 0.0, secs, workers, secs > 0 ? double(size) / 1e6 / secs : 0.0);
}

}  // namespace

Result<ObjectId> Store::PublishPack(int src_fd, uint64_t size, const std::atomic<bool>* cancel,
                                    const LossyPolicy& policy, SiblingSource* siblings,
                                    std::unique_ptr<SealPin>* keep_pin,
                                    std::unique_ptr<SameInputSeals::Hold>* keep_input) {
  RefreshIndexFromOtherNodes();
  const ObjectId id = NewObjectId();
  const std::string ctx = "publishing pack " + ObjectIdHex(id);
  const auto started = std::chrono::steady_clock::now();
  // Cluster mode: pinned before it exists, so GC never finds it unpinned
  // before a stub names it.
  Result<std::unique_ptr<SealPin>> pin = StartSealPin(id);
  if (!pin.ok()) return pin.status().WithContext(ctx);
  const std::unique_ptr<BaseAdmission> admission = AdmissionFor(pin->get());
  const std::string tmpname = ObjectIdHex(id) + internal::kTmpPackSuffix;
  Result<UniqueFd> tmp = env_->OpenAt(tmp_.get(), tmpname, O_CREAT | O_EXCL | O_RDWR, kPrivateFileMode);
  if (!tmp.ok()) return tmp.status().WithContext(ctx);

  auto fail = [&](const Status& s) {
    if (Status u = env_->UnlinkAt(tmp_.get(), tmpname); !u.ok() && u.code() != ENOENT) {
      spdlog::warn("cannot remove {} after failed publish (recovery will): {}", tmpname, u.message());
    }
    return s.WithContext(ctx);
  };

  const EnvSource file(env_, src_fd, size);  // outlives `coding.lossy`, which reads second moments from it
  SealCoding coding{{}, opts_.chunk_size, {}};
  if (Status s = PlanSealCoding(opts_, file, policy, siblings, ctx, &coding); !s.ok()) return fail(s);
  std::vector<TensorRange>& tensors = coding.tensors;
  std::optional<LossyCoder>& lossy = coding.lossy;
  uint32_t chunk_size = coding.chunk_size;
  // Identical input under the same policy: the pack sealed from it, pinned
  // until the new pack is in the index as its user (same_input.h).
  Digest128 input_digest;
  std::optional<SameInputPack> same;
  std::unique_ptr<SameInputSeals::Hold> input_hold;
  if (lossy) {
    Result<std::optional<SameInputPack>> found =
        SameInputFor(file, policy, admission.get(), cancel, &input_digest, &input_hold);
    if (!found.ok()) return fail(found.status());
    same = *found;
  }
  const IndexPin same_pin(&index_, same ? same->pack : 0,
                          [this](const std::vector<ObjectId>& dead) { (void)DeleteDeadPacks(dead); });
  if (same) {
    chunk_size = same->chunk_size;  // chunk i refers to its chunk i
    spdlog::info("{}: same input under {} as pack {}: stored as references to it", ctx, FormatLossyPolicy(policy),
                 ObjectIdHex(same->pack));
  }
  // Planners pin the packs they store chunks against until the new pack is
  // in the index as their user, so they cannot be deleted meanwhile. One per
  // sealing worker, and no more workers than chunks: each planner looks up
  // the file's predecessor in the index.
  const uint64_t chunks = size / chunk_size + (size % chunk_size != 0 ? 1 : 0);
  const unsigned workers = static_cast<unsigned>(std::clamp<uint64_t>(chunks, 1, std::max(1u, opts_.seal_workers)));
  // Recovery seals staged files before the index is loaded: a lossy file
  // then gets a planner without predecessors, and is coded as a keyframe.
  std::vector<std::unique_ptr<DeltaPlanner>> planners =
      ((opts_.delta && index_loaded_) || lossy) && !same
          ? DeltaPlanners(workers, &index_, this, tensors, opts_, admission.get(), &file)
          : std::vector<std::unique_ptr<DeltaPlanner>>{};
  DeltaPlanner* planner = planners.empty() ? nullptr : planners[0].get();
  const PlannerPins pins(planners, [this](const std::vector<ObjectId>& dead) { (void)DeleteDeadPacks(dead); });
  std::vector<ChunkPlanner*> planner_ptrs;
  for (auto& p : planners) planner_ptrs.push_back(p.get());
  std::optional<SameInputPlanner> copier;
  if (same) {
    copier.emplace(&index_, this, *same, input_digest);
    planner_ptrs.assign(workers, &*copier);
  }
  // The zip CRC pass runs on every worker, a member ahead of the pack's
  // pass, which then decodes the pieces' blobs it kept (or codes the rest
  // again with its choices).
  LeadingPass crc_pass(size, chunk_size);
  BaseHandoff crc_bases;  // the predecessor's bytes the CRC pass read, for the pack's pass
  const DeltaPlanner::CrcPass crc{&crc_pass, &crc_bases, env_, src_fd};
  for (auto& p : planners) {
    if (lossy) p->SetLossy(&*lossy, opts_.delta ? opts_.lossy_keyframe_every : 0, &crc);
  }
  if (planner != nullptr && lossy) planner->SetInput(input_digest);
  Result<PackStats> stats = WritePack(env_, src_fd, size, tmp->get(), chunk_size, opts_.encoder, cancel, tensors,
                                      PackWorkers{workers, planner_ptrs});
  if (!stats.ok()) return fail(stats.status());
  WaitWhileExists(env_, opts_.seal_hold, cancel);
  // Bases pinned, pack coded, not yet published: where tests run GC against a seal in flight.
  CKPTFS_SYNC_POINT("Store::PublishPack:BeforePublish");
  if (cancel != nullptr && cancel->load()) return fail(Status::Error(ECANCELED, "pack write cancelled"));
  if (Status s = pack_objects_->Publish(id, tmp_.get(), tmpname, tmp->get()); !s.ok()) return fail(s);
  if (index_loaded_) index_.Add(id, stats->meta, size, chunk_size, stats->stored_size);
  if (planner && (stats->ref_chunks > 0 || stats->delta_chunks > 0)) {
    spdlog::debug("{}: {} chunks, {} shared, {} deltas against {}", ctx, stats->chunk_count, stats->ref_chunks,
                  stats->delta_chunks, ObjectIdHex(planner->base_pack()));
  }
  const auto took = std::chrono::steady_clock::now() - started;
  CountSeal(size, stats->stored_size, took);
  LogSealTime(ctx, size, stats->stored_size, took, workers);
  if (keep_pin != nullptr) *keep_pin = std::move(pin).value();
  if (keep_input != nullptr) *keep_input = std::move(input_hold);
  return id;
}

Result<std::optional<SameInputPack>> Store::SameInputFor(const ByteSource& file, const LossyPolicy& policy,
                                                         BaseAdmission* admission, const std::atomic<bool>* cancel,
                                                         Digest128* digest,
                                                         std::unique_ptr<SameInputSeals::Hold>* hold) {
  ASSIGN_OR_RETURN(*digest, LossyInputDigest(file, FormatLossyPolicy(policy)));
  ASSIGN_OR_RETURN(*hold, same_input_seals_.Acquire(*digest, cancel));
  // Recovery seals staged files before the index is loaded: nothing to find.
  if (!index_loaded_) return std::optional<SameInputPack>{};
  std::optional<SameInputPack> same = index_.FindSameInput(*digest, file.size());
  if (same && admission != nullptr && !admission->Admit(same->pack)) {
    (void)DeleteDeadPacks(index_.Unpin(same->pack));
    same.reset();
  }
  return same;
}

}  // namespace ckptfs
