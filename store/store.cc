#include "store/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "base/metrics.h"
#include "base/sync_point.h"
#include "cache/chunk_buffers.h"
#include "cache/chunk_cache.h"
#include "codec/formats/layout.h"
#include "codec/lossy/file_coder.h"
#include "codec/tensor_chunk.h"
#include "store/cluster/membership.h"
#include "store/cluster/rados_pack_objects.h"
#include "store/cluster/seal_pin.h"
#include "store/delta_planner.h"
#include "store/dir_pack_objects.h"
#include "store/env_source.h"
#include "store/lossy_xattrs.h"
#include "store/private_store.h"
#include "store/same_input.h"
#include "store/store_internal.h"

namespace ckptfs {
namespace {

using internal::StagingFileName;

constexpr const char* kLayoutDirs[] = {"ns", "packs", "staging", "tmp"};
constexpr size_t kMaxSuperblockBytes = 64 * 1024;
// Open base packs kept for reads through references and deltas.
constexpr size_t kMaxOpenBasePacks = 32;
// Reads through base references nest at most this deep: deeper means a
// corrupt store with a reference cycle, never a real chain.
constexpr int kMaxBaseNesting = 64;

bool IsErr(const Status& s, int code) { return !s.ok() && s.code() == code; }

// Opens the backing directory, creating it (but not its parents) when
// allowed, with messages that tell the user what to do.
Result<UniqueFd> OpenBackingDir(Env* env, const std::string& backing, bool create) {
  Result<UniqueFd> fd = env->OpenAt(AT_FDCWD, backing, O_RDONLY | O_DIRECTORY);
  if (fd.ok()) return fd;
  const int err = fd.status().code();
  const std::string missing = "backing directory " + backing + " does not exist; create it or pass an empty directory";
  if (err == ENOENT && create) {
    Status mk = env->MkdirAt(AT_FDCWD, backing, kPrivateDirMode);
    if (IsErr(mk, ENOENT)) return Status::Error(ENOENT, missing + " (its parent directory is missing too)");
    if (!mk.ok() && mk.code() != EEXIST) return mk.WithContext("cannot create backing directory " + backing);
    spdlog::info("created backing directory {}", backing);
    fd = env->OpenAt(AT_FDCWD, backing, O_RDONLY | O_DIRECTORY);
    if (fd.ok()) return fd;
  }
  switch (fd.status().code()) {
    case ENOENT:
      return Status::Error(ENOENT, missing);
    case ENOTDIR:
      return Status::Error(ENOTDIR, "backing path " + backing + " is not a directory");
    case EACCES:
    case EPERM:
      return fd.status().WithContext("backing directory " + backing + " is not accessible");
    default:
      return fd.status().WithContext("cannot open backing directory " + backing);
  }
}

// Whether `backing` holds nothing but what an interrupted initialisation
// can leave behind (we never adopt a directory with someone else's files).
Result<bool> IsEmptyForInit(Env* env, int root_fd) {
  ASSIGN_OR_RETURN(std::vector<DirEntry> entries, env->ListDir(root_fd));
  for (const DirEntry& e : entries) {
    // lost+found: the backing store may be the root of a dedicated volume.
    if (e.name != internal::kSuperblockTmpName && e.name != internal::kLockName && e.name != "lost+found") {
      return false;
    }
  }
  return true;
}

// LOCK holds the pid of the process that holds it, for humans and tests.
Status WritePid(Env* env, int lock_fd) {
  const std::string pid = std::to_string(::getpid()) + "\n";
  RETURN_IF_ERROR(env->Ftruncate(lock_fd, 0));
  return env->PWriteAll(lock_fd, std::span(reinterpret_cast<const uint8_t*>(pid.data()), pid.size()), 0);
}

// What a new store records: packs=rados:POOL gets a RADOS namespace of its
// own, so that stores sharing a pool never see (nor collect) each other's packs.
internal::Superblock NewSuperblock(const StoreOptions& opts) {
  internal::Superblock sb;
  sb.chunk_size = opts.chunk_size;
  if (!opts.cluster.packs.empty() && opts.cluster.packs != "dir") {
    sb.packs = opts.cluster.packs;
    sb.rados_namespace = "ckptfs-" + ObjectIdHex(NewObjectId());
  }
  return sb;
}

// Where packs live is decided when a store is created: a later packs=
// must name the same place (or be left out).
Status CheckPackLocation(const internal::Superblock& sb, const std::string& asked, const std::string& backing) {
  if (asked.empty() || asked == sb.packs) return Status::Ok();
  const std::string recorded = sb.packs == "dir" ? "its directory (packs=dir)" : sb.packs;
  return Status::InvalidArgument("store " + backing + " keeps its packs in " + recorded +
                                 ", recorded when it was created; it cannot be opened with packs=" + asked +
                                 " (leave packs= out, or pass packs=" + sb.packs + ")");
}

}  // namespace

// After a fork the daemon, not the parent that took the lock, holds it.
Status Store::RecordOwnerPid() {
  if (membership_) return membership_->StartRenewing();
  if (!lock_.valid()) return Status::Ok();
  return WritePid(env_, lock_.get());
}

namespace internal {
namespace {

Status ReadPackLocation(const nlohmann::json& j, const std::string& where, Superblock* sb) {
  if (!j.contains("packs")) return Status::Ok();
  if (!j["packs"].is_string()) return Status::Corruption(where + ": \"packs\" is not a string");
  sb->packs = j["packs"].get<std::string>();
  if (sb->packs == "dir") return Status::Ok();
  if (!sb->packs.starts_with("rados:") || sb->packs.size() == 6) {
    return Status::Corruption(where + ": \"packs\" is " + sb->packs + ", neither dir nor rados:POOL");
  }
  if (!j.contains("rados_namespace") || !j["rados_namespace"].is_string()) {
    return Status::Corruption(where + ": packs in " + sb->packs + " but no \"rados_namespace\"");
  }
  sb->rados_namespace = j["rados_namespace"].get<std::string>();
  return Status::Ok();
}

}  // namespace

Result<Superblock> ReadSuperblock(Env* env, int root_fd, const std::string& store_path) {
  ASSIGN_OR_RETURN(UniqueFd fd, env->OpenAt(root_fd, kSuperblockName, O_RDONLY | O_NOFOLLOW));
  ASSIGN_OR_RETURN(std::string text, ReadFdToString(env, fd.get(), kMaxSuperblockBytes));
  const std::string where = "store " + store_path + ": superblock " + kSuperblockName;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption(where + " is not valid JSON");
  if (!j.contains("format") || !j["format"].is_string() || j["format"].get<std::string>() != "ckptfs") {
    return Status::Corruption(where + " does not name format \"ckptfs\"");
  }
  if (!j.contains("version") || !j["version"].is_number_integer()) {
    return Status::Corruption(where + " has no integer \"version\"");
  }
  Superblock sb;
  sb.version = j["version"].get<int>();
  if (sb.version > kStoreFormatVersion) {
    return Status::Error(ENOTSUP, "store " + store_path + " has format version " + std::to_string(sb.version) +
                                      ", newer than this ckptfs supports (" + std::to_string(kStoreFormatVersion) +
                                      "); upgrade ckptfs");
  }
  if (sb.version < 1) return Status::Corruption(where + " has invalid version " + std::to_string(sb.version));
  if (j.contains("chunk_size") && j["chunk_size"].is_number_unsigned()) sb.chunk_size = j["chunk_size"].get<uint32_t>();
  sb.shared = j.contains("shared") && j["shared"].is_boolean() && j["shared"].get<bool>();
  RETURN_IF_ERROR(ReadPackLocation(j, where, &sb));
  if ((sb.shared || sb.packs != "dir") && sb.version < 2) {
    return Status::Corruption(where + ": a shared store, or one with packs outside its directory, is version 2");
  }
  return sb;
}

Status WriteSuperblock(Env* env, int root_fd, const std::string& backing, const Superblock& sb) {
  // An older ckptfs must refuse what it would get wrong: a shared store,
  // or packs outside the directory. Other stores stay version 1.
  const bool needs_v2 = sb.shared || sb.packs != "dir";
  nlohmann::json j = {{"format", "ckptfs"},
                      {"version", needs_v2 ? kStoreFormatVersion : kSingleNodeStoreVersion},
                      {"chunk_size", sb.chunk_size}};
  if (sb.shared) j["shared"] = true;
  // A store with packs in its directory says nothing: its superblock is
  // what it always was.
  if (sb.packs != "dir") {
    j["packs"] = sb.packs;
    j["rados_namespace"] = sb.rados_namespace;
  }
  const std::string text = j.dump() + "\n";
  // tmp + fsync + rename + dir fsync: a crash leaves either no superblock
  // (an empty store, initialised again) or a complete one.
  Status written = WriteFileAtomically(env, root_fd, internal::kSuperblockName, text, kPrivateFileMode,
                                       Durability::kDataAndName);
  if (written.code() == EACCES || written.code() == EROFS || written.code() == EPERM) {
    return written.WithContext("backing directory " + backing + " is not writable");
  }
  return written.WithContext("cannot write superblock");
}

// One daemon per store: flock on LOCK (released by the kernel when the
// process dies, so a crash never leaves a stale lock), pid inside for humans
// and for tests that need the daemon's pid.
Result<UniqueFd> TakeLock(Env* env, int root_fd, const std::string& backing) {
  ASSIGN_OR_RETURN(UniqueFd fd,
                   env->OpenAt(root_fd, internal::kLockName, O_RDWR | O_CREAT | O_NOFOLLOW, kPrivateFileMode));
  if (Status locked = env->Flock(fd.get(), LOCK_EX | LOCK_NB); !locked.ok()) {
    if (locked.code() != EWOULDBLOCK) return locked.WithContext("cannot lock store " + backing);
    std::string pid = "unknown";
    if (Result<std::string> text = ReadFdToString(env, fd.get(), 32); text.ok()) {
      std::string t = *text;
      while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
      if (!t.empty()) pid = t;
    }
    return Status::Error(EBUSY, "store " + backing + " is already served by another ckptfs daemon (pid " + pid + ")");
  }
  RETURN_IF_ERROR(WritePid(env, fd.get()));
  return fd;
}

}  // namespace internal

Result<std::unique_ptr<Store>> Store::Open(Env* env, const std::string& backing, const StoreOptions& opts) {
  if (backing.empty()) return Status::InvalidArgument("no backing directory given");
  if (opts.chunk_size == 0) return Status::InvalidArgument("chunk size must be positive");
  ASSIGN_OR_RETURN(UniqueFd root, OpenBackingDir(env, backing, opts.create_if_missing));
  std::unique_ptr<Store> store(new Store(env, backing, opts));
  store->root_ = std::move(root);
  const int root_fd = store->root_.get();
  // A store we write must be one nobody else could have written (the
  // read-only tools only read, and may run as another user).
  if (opts.take_lock) RETURN_IF_ERROR(CheckStoreRootIsTrusted(env, root_fd, backing));

  Result<internal::Superblock> sb = internal::ReadSuperblock(env, root_fd, backing);
  if (!sb.ok() && sb.status().code() != ENOENT) return sb.status();
  if (!sb.ok()) {
    ASSIGN_OR_RETURN(bool empty, IsEmptyForInit(env, root_fd));
    if (!empty) {
      return Status::Error(ENOTEMPTY, "backing directory " + backing +
                                          " is not empty and has no CKPTFS superblock; refusing to use it "
                                          "(pass an empty directory or an existing ckptfs store)");
    }
    if (!opts.create_if_missing) {
      return Status::Error(ENOENT, "backing directory " + backing + " is not a ckptfs store (no CKPTFS superblock)");
    }
    sb = NewSuperblock(opts);
    RETURN_IF_ERROR(internal::WriteSuperblock(env, root_fd, backing, *sb));
    spdlog::info("initialised ckptfs store in {}", backing);
  }
  RETURN_IF_ERROR(CheckPackLocation(*sb, opts.cluster.packs, backing));
  const bool shared = sb->shared;
  if (shared) store->opts_.cluster.enabled = true;

  if (opts.take_lock && !store->cluster()) {
    ASSIGN_OR_RETURN(store->lock_, internal::TakeLock(env, root_fd, backing));
  }
  RETURN_IF_ERROR(store->InitLayout());
  RETURN_IF_ERROR(store->OpenPackObjects(sb->packs, sb->rados_namespace));
  if (store->cluster()) RETURN_IF_ERROR(store->OpenCluster(shared));
  if (opts.take_lock) {
    ASSIGN_OR_RETURN(store->made_private_, MakeStorePrivate(env, root_fd, backing));
  }
  return store;
}

// The layout directories are (re)created on every writable open, after the
// superblock: a crash during initialisation is finished by the next open.
Status Store::InitLayout() {
  bool created = false;
  for (const char* name : kLayoutDirs) {
    if (!opts_.create_if_missing) break;
    const bool ns = std::string_view(name) == "ns";
    Status s = env_->MkdirAt(root_.get(), name, ns ? kNamespaceRootMode : kPrivateDirMode);
    // The daemon's umask (077) would make the mount root 0700: other users
    // could not use the mount at all.
    if (s.ok() && ns) s = env_->FchmodAt(root_.get(), name, kNamespaceRootMode, AT_SYMLINK_NOFOLLOW);
    if (s.ok()) created = true;
    if (!s.ok() && s.code() != EEXIST) return s.WithContext("initialising store " + path_);
  }
  if (created) RETURN_IF_ERROR(env_->Fsync(root_.get()));
  UniqueFd* fds[] = {&ns_, &packs_, &staging_, &tmp_};
  for (size_t i = 0; i < std::size(kLayoutDirs); ++i) {
    Result<UniqueFd> fd = env_->OpenAt(root_.get(), kLayoutDirs[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (!fd.ok()) {
      return fd.status().WithContext("store " + path_ + " is missing or cannot open " + kLayoutDirs[i] + "/");
    }
    *fds[i] = std::move(fd).value();
  }
  return Status::Ok();
}


void Store::ClosePackConnection() {
  if (opts_.cluster.packs == "dir") return;
  {
    std::lock_guard lk(readers_mu_);
    readers_.clear();
  }
  pack_objects_.reset();
}

Status Store::OpenPackConnection() {
  if (opts_.cluster.packs == "dir") return Status::Ok();
  return OpenPackObjects(opts_.cluster.packs, rados_namespace_);
}

Status Store::OpenPackObjects(const std::string& packs, const std::string& rados_namespace) {
  opts_.cluster.packs = packs;  // what the store recorded, also when the mount left it out
  rados_namespace_ = rados_namespace;
  if (packs == "dir") {
    pack_objects_ = std::make_unique<DirPackObjects>(env_, packs_.get(), opts_.direct_pack_reads);
    return Status::Ok();
  }
  const std::string pool = packs.substr(std::string_view("rados:").size());
  const RadosConnector& connect = opts_.connect_rados ? opts_.connect_rados : RadosConnector(ConnectLibrados);
  Result<std::unique_ptr<RadosClient>> client = connect(opts_.cluster.ceph_conf, pool, rados_namespace);
  if (!client.ok()) return client.status().WithContext("store " + path_ + " keeps its packs in " + packs);
  pack_objects_ = std::make_unique<RadosPackObjects>(env_, std::move(client).value(), packs);
  spdlog::debug("store {}: packs in RADOS pool {} (namespace {})", path_, pool, rados_namespace);
  return Status::Ok();
}

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

Status Store::DeleteDeadPacks(const std::vector<ObjectId>& dead) {
  // Cluster mode: another node's stub or seal may need what this node's
  // index thinks dead; only cluster GC, which sees them all, deletes.
  if (dead.empty() || opts_.cluster.enabled) return Status::Ok();
  if (deletion_blocked()) {
    // The index says nothing needs them, but it does not know what the
    // objects recovery could not read refer to (ARCHITECTURE.md, Recovery).
    for (ObjectId id : dead) {
      spdlog::warn(
          "keeping pack {} although no file needs it: recovery found unreadable objects "
          "(see `ckptfs fsck`); `ckptfs gc` deletes it once they are repaired",
          pack_objects_->Where(id));
    }
    return Status::Ok();
  }
  {
    std::lock_guard lk(readers_mu_);
    readers_.remove_if([&](const auto& r) { return std::find(dead.begin(), dead.end(), r.first) != dead.end(); });
  }
  if (base_cache_ != nullptr) {
    for (ObjectId id : dead) base_cache_->ErasePack(id);
  }
  if (opts_.background_gc) {
    std::lock_guard lk(gc_mu_);
    if (!gc_thread_.joinable()) gc_thread_ = std::thread([this] { GcLoop(); });
    gc_queue_.insert(gc_queue_.end(), dead.begin(), dead.end());
    gc_cv_.notify_one();
    return Status::Ok();
  }
  RETURN_IF_ERROR(SyncBeforeDeleting());
  Status first = Status::Ok();
  for (ObjectId id : dead) {
    Status s = DeletePack(id);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Status Store::SyncBeforeDeleting() {
  return env_->SyncFs(root_.get()).WithContext("making the namespace durable before deleting unreferenced objects");
}

void Store::GcLoop() {
  std::unique_lock lk(gc_mu_);
  for (;;) {
    gc_cv_.wait(lk, [&] { return gc_stop_ || !gc_queue_.empty(); });
    if (gc_queue_.empty()) return;  // stopping, and everything is done
    std::vector<ObjectId> batch;
    batch.swap(gc_queue_);
    lk.unlock();
    if (Status s = SyncBeforeDeleting(); !s.ok()) {
      spdlog::warn("gc: keeping {} pack(s) for recovery to delete: {}", batch.size(), s.message());
      batch.clear();
    }
    for (ObjectId id : batch) {
      if (Status s = DeletePack(id); !s.ok()) {
        spdlog::warn("gc: cannot delete pack {} (recovery will): {}", ObjectIdHex(id), s.message());
      }
    }
    lk.lock();
  }
}

Store::~Store() {
  {
    std::lock_guard lk(gc_mu_);
    gc_stop_ = true;
    gc_cv_.notify_one();
  }
  if (gc_thread_.joinable()) gc_thread_.join();
}

Status Store::ReleasePack(ObjectId id) {
  if (id == 0) return Status::Ok();
  // Without the index (a store opened without recovery) nothing says which
  // packs use this one as a base: keep it; recovery's sweep decides.
  if (!index_loaded_) return Status::Ok();
  return DeleteDeadPacks(index_.DropRoot(id));
}

void Store::DiscardNewPack(ObjectId id) {
  if (id == 0 || opts_.cluster.enabled) return;  // cluster GC deletes it (DeleteDeadPacks says why)
  std::vector<ObjectId> dead = index_loaded_ ? index_.DropRoot(id) : std::vector<ObjectId>{};
  std::erase(dead, id);
  if (cluster()) return;  // another node may have picked it as a base already: cluster GC decides
  if (Status s = DeletePack(id); !s.ok()) {
    spdlog::warn("cannot remove abandoned pack {} (recovery will): {}", ObjectIdHex(id), s.message());
  }
  (void)DeleteDeadPacks(dead);
}

Status Store::RetirePack(ObjectId id) {
  if (id == 0) return Status::Ok();
  if (!index_loaded_ || !index_.Contains(id)) return ReleasePack(id);
  index_.Retire(id);
  PinRetired(id);
  return Status::Ok();
}

Status Store::ReleaseRetired(ObjectId id) {
  if (id == 0 || !index_loaded_) return Status::Ok();
  {
    std::lock_guard lk(retired_pins_mu_);
    if (auto it = retired_pins_.find(id); it != retired_pins_.end() && --it->second.count == 0) retired_pins_.erase(it);
  }
  return DeleteDeadPacks(index_.Unretire(id));
}

// Cluster mode: no stub names a retired pack while its file is rewritten,
// and cluster GC would mark it doomed, costing the next version its delta.
// A pin keeps it live until the next seal (whose own pin then takes over).
void Store::PinRetired(ObjectId id) {
  if (!pins_.valid()) return;
  std::lock_guard lk(retired_pins_mu_);
  RetiredPin& held = retired_pins_[id];
  if (held.count++ > 0) return;
  Result<std::unique_ptr<SealPin>> pin = SealPin::Create(env_, pins_.get());
  const ObjectId ids[] = {id};
  Status added = pin.ok() ? (*pin)->Add(ids) : pin.status();
  if (!added.ok()) {
    spdlog::warn("cannot pin retired pack {} (its successor may be stored without it): {}", ObjectIdHex(id),
                 added.message());
  }
  if (pin.ok()) held.pin = std::move(pin).value();
}

Result<std::shared_ptr<PackReader>> Store::CachedPack(ObjectId id) {
  {
    std::lock_guard lk(readers_mu_);
    for (auto it = readers_.begin(); it != readers_.end(); ++it) {
      if (it->first != id) continue;
      readers_.splice(readers_.begin(), readers_, it);
      return readers_.front().second;
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<PackReader> reader, OpenPack(id));
  std::lock_guard lk(readers_mu_);
  readers_.emplace_front(id, reader);
  if (readers_.size() > kMaxOpenBasePacks) readers_.pop_back();
  return reader;
}

std::optional<std::pair<ObjectId, uint64_t>> Store::BaseOfChunk(ObjectId pack, uint64_t offset, uint64_t len) {
  Result<std::shared_ptr<PackReader>> reader = CachedPack(pack);
  if (!reader.ok()) return std::nullopt;
  const PackReader& r = **reader;
  const uint64_t lead = BaseWindowLead(offset);
  const uint64_t start = offset + lead, end = offset + len;  // the window's bytes in the pack (wraps for a lead)
  if (lead >= len || end > r.header().logical_size) return std::nullopt;
  // After a file's tensors moved, windows straddle two chunks (or start
  // before the first): they map to one window of a base only when every
  // chunk they touch has the same base pack and the same shift against it.
  const uint64_t cs = r.header().chunk_size;
  std::optional<std::pair<ObjectId, uint64_t>> shift;  // base pack, base offset - chunk offset
  for (uint64_t i = start / cs; i * cs < end; ++i) {
    Result<std::pair<ObjectId, uint64_t>> base = r.ChunkBase(i);
    if (!base.ok()) return std::nullopt;
    const std::pair<ObjectId, uint64_t> s{base->first, base->second - i * cs};
    if (shift && *shift != s) return std::nullopt;
    shift = s;
  }
  return std::make_pair(shift->first, shift->second + offset);
}

Result<ChunkBytes> Store::LoadChunk(const PackReader& pack, ObjectId id, uint64_t index, ChunkCache* cache) {
  auto load = [&]() -> Result<ChunkBytes> {
    pack.Prefetch(index + 1);
    if (index >= pack.chunks().size()) return pack.ReadChunkInto(index, {}, this);  // its out-of-range error
    std::shared_ptr<ChunkBuffer> bytes = ChunkBuffers::Default().Acquire(pack.chunks()[index].raw_len);
    RETURN_IF_ERROR(pack.ReadChunkInto(index, *bytes, this));
    GlobalMetrics().chunk_decodes.Add();
    GlobalMetrics().chunk_decoded_bytes.Add(bytes->size());
    return ChunkBytes(std::move(bytes));
  };
  return cache != nullptr ? cache->GetOrLoad(ChunkKey{id, index}, load) : load();
}

namespace {

// Bounds the recursion of bases reading their own bases on this thread.
class BaseNesting {
 public:
  BaseNesting() { ++depth(); }
  ~BaseNesting() { --depth(); }
  static Status Check(ObjectId pack) {
    if (depth() < kMaxBaseNesting) return Status::Ok();
    return Status::Corruption("base references nest deeper than " + std::to_string(kMaxBaseNesting) +
                              " packs at pack " + ObjectIdHex(pack) + " (a reference cycle?)");
  }

 private:
  static int& depth() {
    thread_local int d = 0;
    return d;
  }
};

}  // namespace

Result<std::shared_ptr<PackReader>> Store::BaseRangeReader(ObjectId pack, uint64_t offset, uint64_t len) {
  Result<std::shared_ptr<PackReader>> reader = CachedPack(pack);
  if (!reader.ok()) return reader.status().WithContext("base pack " + ObjectIdHex(pack));
  const PackHeader& h = (*reader)->header();
  if (offset > h.logical_size || h.logical_size - offset < len) {
    return Status::Corruption("range " + std::to_string(offset) + "+" + std::to_string(len) +
                              " is outside base pack " + ObjectIdHex(pack));
  }
  return reader;
}

// A delta's base usually lines up with one chunk of its base pack: the
// decoder then reads that cached chunk in place, no copy and no buffer.
Status Store::UsePackRange(ObjectId pack, uint64_t offset, uint64_t len,
                           const std::function<Status(std::span<const uint8_t>)>& use) {
  RETURN_IF_ERROR(BaseNesting::Check(pack));
  BaseNesting nested;
  ASSIGN_OR_RETURN(std::shared_ptr<PackReader> reader, BaseRangeReader(pack, offset, len));
  const uint64_t cs = reader->header().chunk_size;
  const uint64_t index = offset / cs, within = offset - index * cs;
  if (len == 0 || within + len > reader->chunks()[index].raw_len) return BaseSource::UsePackRange(pack, offset, len, use);
  ASSIGN_OR_RETURN(ChunkBytes chunk, LoadChunk(*reader, pack, index, base_cache_));
  if (base_cache_ != nullptr) base_cache_->NoteRead(ChunkKey{pack, index}, within, within + len);
  return use(std::span<const uint8_t>(chunk->data() + within, len));
}

Status Store::ReadPackRange(ObjectId pack, uint64_t offset, std::span<uint8_t> out) {
  RETURN_IF_ERROR(BaseNesting::Check(pack));
  BaseNesting nested;
  ASSIGN_OR_RETURN(std::shared_ptr<PackReader> reader, BaseRangeReader(pack, offset, out.size()));
  return CopyPackBytes(*reader, pack, offset, out, base_cache_, /*note_read=*/true);
}

Status Store::CopyPackBytes(const PackReader& pack, ObjectId id, uint64_t offset, std::span<uint8_t> out,
                            ChunkCache* cache, bool note_read) {
  const uint64_t cs = pack.header().chunk_size;
  if (offset > pack.header().logical_size || out.size() > pack.header().logical_size - offset) {
    return Status::InvalidArgument("range " + std::to_string(offset) + "+" + std::to_string(out.size()) +
                                   " is outside pack " + ObjectIdHex(id));
  }
  for (uint64_t pos = offset; pos < offset + out.size();) {
    const uint64_t index = pos / cs, within = pos - index * cs;
    ASSIGN_OR_RETURN(ChunkBytes chunk, LoadChunk(pack, id, index, cache));
    const uint64_t n = std::min<uint64_t>(offset + out.size() - pos, chunk->size() - std::min(chunk->size(), within));
    if (n == 0)
      return Status::Corruption("pack " + ObjectIdHex(id) + ": chunk " + std::to_string(index) +
                                " is shorter than the chunk size");
    std::memcpy(out.data() + (pos - offset), chunk->data() + within, n);
    if (cache != nullptr && note_read) cache->NoteRead(ChunkKey{id, index}, within, within + n);
    pos += n;
  }
  return Status::Ok();
}

Status Store::ReadPackRangeOnce(ObjectId pack, uint64_t offset, std::span<uint8_t> out) {
  ASSIGN_OR_RETURN(std::shared_ptr<PackReader> reader, BaseRangeReader(pack, offset, out.size()));
  const uint64_t cs = reader->header().chunk_size;
  const uint64_t index = offset / cs;
  const bool whole_chunk = offset % cs == 0 && !out.empty() && reader->chunks()[index].raw_len == out.size();
  if (!whole_chunk || (base_cache_ != nullptr && base_cache_->Contains(ChunkKey{pack, index}))) {
    return ReadPackRange(pack, offset, out);
  }
  RETURN_IF_ERROR(BaseNesting::Check(pack));
  BaseNesting nested;
  // The next chunks' bases are read while this one decodes (the seal's
  // workers code chunks in about file order).
  for (uint64_t ahead = 1; ahead <= ChunkReadAhead::kMaxHeld; ++ahead) reader->ReadAhead(index + ahead);
  RETURN_IF_ERROR(reader->ReadChunkInto(index, out, this));
  GlobalMetrics().chunk_decodes.Add();
  GlobalMetrics().chunk_decoded_bytes.Add(out.size());
  return Status::Ok();
}

Result<std::shared_ptr<PackReader>> Store::OpenPack(ObjectId id) {
  // A pack that a stub or another pack names is never missing in a healthy
  // store, so its absence is damage: EIO for readers (invariant 3), not a
  // file "not found" that exists in the namespace.
  auto missing = [&](const Status& s) {
    const std::string where = pack_objects_->Where(id);
    return s.code() == ENOENT ? Status::Error(EIO, "pack " + where + " is missing") : s.WithContext(where);
  };
  Result<std::unique_ptr<PackBytes>> source = pack_objects_->Open(id);
  if (!source.ok()) return missing(source.status());
  return PackReader::Open(std::move(source).value(), ObjectIdHex(id));
}

Status Store::DeletePack(ObjectId id) {
  if (id == 0) return Status::Ok();
  return pack_objects_->Delete(id);
}

Result<uint64_t> Store::PackFileSize(ObjectId id) { return pack_objects_->Size(id); }

Result<std::vector<Store::PackStat>> Store::ListPacks() {
  ASSIGN_OR_RETURN(PackListing listing, pack_objects_->List(ListDetail::kSizes));
  if (!listing.unlisted.empty()) {
    return listing.unlisted.front().status.WithContext("listing " + listing.unlisted.front().where);
  }
  std::vector<PackStat> out;
  for (const PackObjectEntry& e : listing.packs) {
    out.push_back({.id = e.id, .bytes = e.bytes, .mtime_ns = e.mtime_ns, .complete = e.complete});
  }
  return out;
}

Result<uint64_t> Store::AllPackBytes() {
  ASSIGN_OR_RETURN(PackListing listing, pack_objects_->List(ListDetail::kSizes));
  uint64_t total = 0;
  for (const PackObjectEntry& e : listing.packs) total += e.bytes;
  return total;
}

Result<UniqueFd> Store::CreateStaging(ObjectId* id) {
  const ObjectId new_id = NewObjectId();
  ASSIGN_OR_RETURN(UniqueFd fd,
                   env_->OpenAt(staging_.get(), StagingFileName(new_id), O_CREAT | O_EXCL | O_RDWR, kPrivateFileMode));
  *id = new_id;
  return fd;
}

Result<UniqueFd> Store::OpenStaging(ObjectId id) {
  return env_->OpenAt(staging_.get(), StagingFileName(id), O_RDWR | O_NOFOLLOW);
}

Status Store::DeleteStaging(ObjectId id) {
  if (id == 0) return Status::Ok();
  Status s = env_->UnlinkAt(staging_.get(), StagingFileName(id));
  return IsErr(s, ENOENT) ? Status::Ok() : s;
}

Status Store::SyncStagingDir() { return env_->Fsync(staging_.get()); }

// Chunks come through the decoded-chunk cache when there is one (the daemon
// reads files through the same one), so rewriting a file just read decodes
// nothing twice.
Status Store::DecodePackInto(ObjectId id, uint64_t keep_bytes, int dst_fd) {
  ASSIGN_OR_RETURN(std::shared_ptr<PackReader> pack, OpenPack(id));
  const uint64_t cs = pack->header().chunk_size;
  for (uint64_t i = 0; i < pack->chunks().size() && i * cs < keep_bytes; ++i) {
    if (pack->chunks()[i].codec == ChunkCodec::kZero) continue;  // stays a hole
    ASSIGN_OR_RETURN(ChunkBytes chunk, LoadChunk(*pack, id, i, base_cache_));
    const uint64_t n = std::min<uint64_t>(chunk->size(), keep_bytes - i * cs);
    RETURN_IF_ERROR(env_->PWriteAll(dst_fd, std::span(chunk->data(), n), i * cs));
  }
  return Status::Ok();
}

Result<Store::Staged> Store::StageStub(int stub_fd, const StubRecord& sealed, uint64_t keep_bytes) {
  if (sealed.state != StubState::kSealed) return Status::InvalidArgument("StageStub: stub is not sealed");
  const uint64_t keep = std::min(keep_bytes, sealed.size);
  ObjectId id = 0;
  ASSIGN_OR_RETURN(UniqueFd fd, CreateStaging(&id));
  Status st = Status::Ok();
  if (keep > 0) {
    st = DecodePackInto(sealed.object, keep, fd.get());
    if (st.ok()) st = env_->Ftruncate(fd.get(), keep);
    if (st.ok()) st = env_->Fdatasync(fd.get());
  }
  // Even an empty staging file must not vanish from under a durable stub.
  if (st.ok() && sealed.object != 0) st = SyncStagingDir();
  StubRecord next{.gen = 0, .state = StubState::kStaged, .size = keep, .object = id, .node = node_id_};
  Result<StubRecord> written = st.ok() ? WriteStub(env_, stub_fd, sealed, next) : Result<StubRecord>(st);
  if (!written.ok()) {
    (void)DeleteStaging(id);
    return written.status();
  }
  // Other nodes must read the record (it hides the file) before anything else.
  if (cluster()) {
    if (Status s = env_->Fdatasync(stub_fd); !s.ok())
      spdlog::warn("staged stub not yet visible to other nodes: {}", LogSafe(s.message()));
  }
  Staged staged{.rec = *written, .fd = std::move(fd)};
  // Drop the old pack only once no durable record can point at it.
  if (sealed.object != 0 && env_->Fsync(stub_fd).ok()) {
    staged.stub_synced = true;
    staged.retired = sealed.object;
    (void)RetirePack(sealed.object);
  }
  return staged;
}

Result<StubRecord> Store::SealStub(int stub_fd, const StubRecord& staged, int staging_fd,
                                   const std::function<bool()>& still_current, const SealWait& wait,
                                   const std::atomic<bool>* cancel) {
  if (staged.state != StubState::kStaged) return Status::InvalidArgument("SealStub: stub is not staged");
  ASSIGN_OR_RETURN(struct stat sst, env_->Fstat(staging_fd));
  const uint64_t size = static_cast<uint64_t>(sst.st_size);
  // An empty file needs no pack: object 0 already means "no bytes".
  ObjectId pack = 0;
  // Cluster mode: holds the new pack and its bases until the stub names it
  // durably (or the seal is abandoned), on every path out of here.
  std::unique_ptr<SealPin> pin;
  // Until the stub names the pack (AddRoot), or it is discarded: then a
  // seal of the same input finds it (store/same_input.h).
  std::unique_ptr<SameInputSeals::Hold> input_hold;
  if (size > 0) {
    const std::unique_ptr<SiblingSource> siblings = SiblingsOf(stub_fd, sst.st_mtim, wait);
    ASSIGN_OR_RETURN(pack,
                     PublishPack(staging_fd, size, cancel, PolicyFor(stub_fd), siblings.get(), &pin, &input_hold));
  }

  if (still_current && !still_current()) {
    DiscardNewPack(pack);
    return Status::Error(EAGAIN, "file changed while sealing");
  }

  StubRecord sealed{.state = StubState::kSealed, .size = size, .object = pack};
  Result<StubRecord> written = WriteStub(env_, stub_fd, staged, sealed);
  if (!written.ok()) {
    // A failed write leaves the slot invalid (checksummed), so the stub
    // still names the staging file, unless the bytes landed after all.
    Result<StubRecord> now = ReadStub(env_, stub_fd);
    if (now.ok() && now->object != pack) {
      DiscardNewPack(pack);
    } else if (index_loaded_) {
      index_.AddRoot(pack);
    }
    return written.status().WithContext("sealing stub");
  }
  if (index_loaded_) index_.AddRoot(pack);
  // mtime first, then one fsync covers record and times. The stub write
  // itself bumped mtime; the user's mtime is the staging file's.
  const struct timespec times[2] = {{0, UTIME_OMIT}, sst.st_mtim};
  RETURN_IF_ERROR(env_->Futimens(stub_fd, times).WithContext("sealing stub"));
  // From here the pack may be referenced on disk: never delete it on error.
  RETURN_IF_ERROR(env_->Fsync(stub_fd).WithContext("sealing stub"));

  if (Status s = DeleteStaging(staged.object); !s.ok()) {
    spdlog::warn("sealed, but cannot remove staging file {} (recovery will): {}", StagingFileName(staged.object),
                 s.message());
  }
  return *written;
}

double Store::FidelityFor(int stub_fd) { return PolicyFor(stub_fd).fidelity; }

Result<std::string> Store::NamespacePathOf(int stub_fd) {
  ASSIGN_OR_RETURN(const std::string root, env_->ReadlinkAt(AT_FDCWD, ProcFdPath(ns_.get())));
  ASSIGN_OR_RETURN(const std::string where, env_->ReadlinkAt(AT_FDCWD, ProcFdPath(stub_fd)));
  if (!where.starts_with(root + "/")) return Status::Error(ENOENT, where + " is not under " + root);
  const std::string path = where.substr(root.size() + 1);
  ASSIGN_OR_RETURN(struct stat self, env_->Fstat(stub_fd));
  Result<struct stat> there = env_->FstatAt(ns_.get(), path, AT_SYMLINK_NOFOLLOW);
  if (!there.ok() || there->st_dev != self.st_dev || there->st_ino != self.st_ino) {
    return Status::Error(ENOENT, where + " was unlinked or moved while it was looked up");
  }
  return path;
}

Status Store::SyncDirectoryOf(int stub_fd) {
  // A rename racing with the lookup makes NamespacePathOf fail once: look
  // again, the stub is then in its new directory.
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    Result<std::string> path = NamespacePathOf(stub_fd);
    if (path.ok()) {
      const size_t slash = path->rfind('/');
      const std::string dir = slash == std::string::npos ? "." : path->substr(0, slash);
      ASSIGN_OR_RETURN(UniqueFd fd, env_->OpenAt(ns_.get(), dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
      return env_->Fsync(fd.get());
    }
    ASSIGN_OR_RETURN(struct stat st, env_->Fstat(stub_fd));
    if (st.st_nlink == 0) return Status::Ok();
    last = path.status();
  }
  return Status::Error(EIO, "cannot find the directory to fsync: " + last.message());
}

LossyPolicy Store::PolicyFor(int stub_fd) {
  // A rename racing with the lookup (a checkpoint written as NAME.tmp and
  // renamed to NAME as soon as it is closed) makes NamespacePathOf fail
  // once: look again, rather than seal a file of a lossy directory exactly.
  Result<std::string> path = NamespacePathOf(stub_fd);
  for (int attempt = 1; attempt < 3 && !path.ok(); ++attempt) path = NamespacePathOf(stub_fd);
  if (!path.ok()) {
    spdlog::debug("no lossy policy for {}: {}", LogSafe(FdPathForLog(stub_fd)), LogSafe(path.status().message()));
    return {};
  }
  return PolicyAbove(*path);
}

LossyPolicy Store::PolicyOfDirectory(int dir_fd) {
  Result<struct stat> self = env_->Fstat(dir_fd);
  Result<struct stat> ns = env_->Fstat(ns_.get());
  if (self.ok() && ns.ok() && self->st_dev == ns->st_dev && self->st_ino == ns->st_ino) return PolicyAbove("/");
  Result<std::string> path = NamespacePathOf(dir_fd);
  if (!path.ok()) {
    spdlog::debug("no lossy policy for {}: {}", LogSafe(FdPathForLog(dir_fd)), LogSafe(path.status().message()));
    return {};
  }
  // As for a file in it: the search starts at the directory itself.
  return PolicyAbove(*path + "/");
}

// A policy that cannot be used is logged at each seal and each read of the
// effective policy below it: limited per the directory owner's uid.
bool Store::PolicyLogAllowed(const std::string& dir) {
  Result<struct stat> st = env_->FstatAt(AT_FDCWD, dir, AT_SYMLINK_NOFOLLOW);
  return LogAllowed(log_kind::kPolicy, st.ok() ? st->st_uid : kLogAnyUid);
}

LossyPolicy Store::PolicyAbove(const std::string& path) {
  // From the entry's directory up to ns/ itself, through ns_.
  std::string dir = path;
  std::vector<uint8_t> buf(64);
  while (!dir.empty()) {
    const size_t slash = dir.rfind('/');
    dir.resize(slash == std::string::npos ? 0 : slash);
    const std::string at = dir.empty() ? "" : "/" + dir;
    const std::string shown = path_ + "/ns" + at;
    const std::string where = ProcFdPath(ns_.get()) + at;
    Result<size_t> n = env_->GetXattr(where, kPolicyXattr, buf);
    if (!n.ok()) {
      if (n.status().code() == ENODATA || n.status().code() == ENOTSUP) continue;
      if (PolicyLogAllowed(where))
        spdlog::warn("cannot read {} of {}: {}; sealing losslessly", kPolicyXattr, LogSafe(shown),
                     LogSafe(n.status().message()));
      return {};
    }
    Result<LossyPolicy> p = ParseLossyPolicy(std::string_view(reinterpret_cast<const char*>(buf.data()), *n));
    if (!p.ok()) {
      if (PolicyLogAllowed(where))
        spdlog::warn("{} of {}: {}; sealing losslessly", kPolicyXattr, LogSafe(shown), LogSafe(p.status().message()));
      return {};
    }
    return *p;
  }
  return LossyPolicy{opts_.lossy, opts_.lossy_scope, opts_.lossy_steps};
}

Status Store::ReleaseStubObjects(const StubRecord& rec) {
  if (rec.object == 0) return Status::Ok();
  if (rec.state == StubState::kSealed) return ReleasePack(rec.object);
  RETURN_IF_ERROR(SyncBeforeDeleting());
  return DeleteStaging(rec.object);
}

}  // namespace ckptfs
