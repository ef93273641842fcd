// Recovery: finishes or rolls back whatever a crash interrupted. Every step
// is idempotent, so a crash during recovery is handled by the next one.
#include <dirent.h>
#include <fcntl.h>

#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "base/log.h"
#include "store/live_packs.h"
#include "store/store.h"
#include "store/store_internal.h"

namespace ckptfs {
namespace internal {
namespace {

std::string Join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "/" + name;
}

// d_type is DT_UNKNOWN on some filesystems; lstat then decides.
Result<unsigned char> EntryType(Env* env, int dirfd, const DirEntry& e) {
  if (e.type != DT_UNKNOWN) return e.type;
  ASSIGN_OR_RETURN(struct stat st, env->FstatAt(dirfd, e.name, AT_SYMLINK_NOFOLLOW));
  if (S_ISDIR(st.st_mode)) return static_cast<unsigned char>(DT_DIR);
  if (S_ISREG(st.st_mode)) return static_cast<unsigned char>(DT_REG);
  return static_cast<unsigned char>(DT_UNKNOWN);
}

}  // namespace

namespace {

Status WalkEntries(Env* env, int dirfd, const std::string& prefix, const std::vector<DirEntry>& entries,
                   const TreeVisitor& fn, std::unordered_set<ino_t>* seen) {
  for (const DirEntry& e : entries) {
    const std::string path = Join(prefix, e.name);
    Result<unsigned char> type = EntryType(env, dirfd, e);
    if (!type.ok()) {
      if (type.status().code() == ENOENT) continue;  // removed under us
      // Neither a file nor a directory we can tell: it may hold stubs.
      RETURN_IF_ERROR(fn(path + "/", -1, type.status().WithContext("stat")));
      continue;
    }
    if (*type == DT_DIR) {
      // A subtree that cannot be opened or listed is reported to the
      // visitor and skipped, so the rest of the namespace is still visited.
      Result<UniqueFd> sub = env->OpenAt(dirfd, e.name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
      if (!sub.ok()) {
        RETURN_IF_ERROR(fn(path + "/", -1, sub.status()));
        continue;
      }
      Result<std::vector<DirEntry>> sub_entries = env->ListDir(sub->get());
      if (!sub_entries.ok()) {
        RETURN_IF_ERROR(fn(path + "/", -1, sub_entries.status()));
        continue;
      }
      RETURN_IF_ERROR(WalkEntries(env, sub->get(), path, *sub_entries, fn, seen));
      continue;
    }
    // Symlinks, devices, fifos and sockets carry no content; a second link
    // to a stub already visited needs no second visit.
    if (*type != DT_REG) continue;
    if (!seen->insert(e.ino).second) continue;
    // O_NOATIME: the stub's atime is the user's; scanning is not an access.
    // It needs ownership or CAP_FOWNER (EPERM otherwise), and O_RDWR needs
    // write permission on the stub: step down until one open works.
    Result<UniqueFd> fd = env->OpenAt(dirfd, e.name, O_RDWR | O_NOFOLLOW | O_NOATIME);
    if (!fd.ok() && fd.status().code() == EPERM) fd = env->OpenAt(dirfd, e.name, O_RDWR | O_NOFOLLOW);
    if (!fd.ok() && (fd.status().code() == EACCES || fd.status().code() == EROFS)) {
      fd = env->OpenAt(dirfd, e.name, O_RDONLY | O_NOFOLLOW);
    }
    if (fd.ok()) {
      RETURN_IF_ERROR(fn(path, fd->get(), Status::Ok()));
    } else {
      RETURN_IF_ERROR(fn(path, -1, fd.status()));
    }
  }
  return Status::Ok();
}

}  // namespace

Status WalkTree(Env* env, int dirfd, const std::string& prefix, const TreeVisitor& fn,
                std::unordered_set<ino_t>* seen) {
  Result<std::vector<DirEntry>> entries = env->ListDir(dirfd);
  if (!entries.ok()) return entries.status().WithContext("listing ns/" + prefix);
  return WalkEntries(env, dirfd, prefix, *entries, fn, seen);
}

}  // namespace internal

Status Store::WalkStubs(const std::function<Status(const std::string& path, int stub_fd)>& fn) {
  std::unordered_set<ino_t> seen;
  return internal::WalkTree(
      env_, ns_.get(), "",
      [&](const std::string& path, int fd, const Status& open_status) -> Status {
        if (!open_status.ok()) return open_status.WithContext("opening stub ns/" + path);
        return fn(path, fd);
      },
      &seen);
}

namespace {

// An object whose references cannot be established: with any, nothing is
// swept, since any unreferenced-looking pack or staging file might be what
// it names.
void NoteUnreadable(RecoveryReport* rep, const std::string& where, const std::string& why) {
  const std::string line = "cannot read " + where + ": " + why;
  spdlog::error("recovery: {}", LogSafe(line, kLogSafeLineMaxBytes));
  rep->unreadable.push_back(where + ": " + why);
  rep->actions.push_back(line);
}

void NoteDone(RecoveryReport* rep, const std::string& line) {
  spdlog::info("recovery: {}", LogSafe(line, kLogSafeLineMaxBytes));
  rep->actions.push_back(line);
}

void NoteProblem(RecoveryReport* rep, const std::string& line) {
  spdlog::error("recovery: {}", LogSafe(line, kLogSafeLineMaxBytes));
  rep->actions.push_back(line);
}

// 1. Packs that never got published. Always safe to delete: nothing names
// a pack before it is renamed out of tmp/ (stubs and meta blocks name
// packs/XX/ID.pack only; in RADOS, before its object is complete), and the staging file it was coded from stays
// until a stub names the published pack.
Status RemoveUnpublishedPacks(Env* env, int tmp_fd, RecoveryReport* rep) {
  ASSIGN_OR_RETURN(std::vector<DirEntry> tmp_entries, env->ListDir(tmp_fd));
  for (const DirEntry& e : tmp_entries) {
    RETURN_IF_ERROR(env->UnlinkAt(tmp_fd, e.name).WithContext("recovery: clearing tmp/"));
    ++rep->tmp_files_removed;
    NoteDone(rep, "removed unpublished tmp/" + e.name);
  }
  return Status::Ok();
}

// 2. The walk of the namespace: collects what each stub references, and
// seals what was staged.
class NamespaceRecovery {
 public:
  NamespaceRecovery(Store* store, RecoveryReport* rep) : store_(store), env_(store->env()), rep_(rep) {}

  Status Walk(int ns_fd) {
    std::unordered_set<ino_t> seen;
    auto visit = [this](const std::string& path, int fd, const Status& open_status) {
      VisitStub(path, fd, open_status);
      return Status::Ok();
    };
    return internal::WalkTree(env_, ns_fd, "", visit, &seen).WithContext("recovery");
  }
  // Each pack stubs name, and one stub naming it.
  const std::unordered_map<ObjectId, std::string>& packs_ref() const { return packs_ref_; }
  const std::unordered_set<ObjectId>& staging_ref() const { return staging_ref_; }

 private:
  void VisitStub(const std::string& path, int fd, const Status& open_status);
  void ResealStaged(const std::string& where, int fd, const StubSlots& slots);
  void NoteDamagedSlot(const std::string& where, const StubSlots& slots) {
    if (!slots.damaged.empty()) NoteUnreadable(rep_, where + " (stub)", "damaged slot: " + slots.damaged);
  }

  Store* store_;
  Env* env_;
  RecoveryReport* rep_;
  std::unordered_map<ObjectId, std::string> packs_ref_;  // -> a stub naming it
  std::unordered_set<ObjectId> staging_ref_;
};

void NamespaceRecovery::VisitStub(const std::string& path, int fd, const Status& open_status) {
  const std::string where = "ns/" + path;
  if (path.ends_with('/')) {
    NoteUnreadable(rep_, where + " (directory)", open_status.message());
    return;
  }
  ++rep_->stubs_scanned;
  if (!open_status.ok()) {
    ++rep_->broken_stubs;
    NoteUnreadable(rep_, where + " (stub)", "cannot open: " + open_status.message());
    return;
  }
  Result<StubSlots> slots = ReadStubSlots(env_, fd);
  if (!slots.ok()) {
    ++rep_->broken_stubs;
    NoteUnreadable(rep_, where + " (stub)", slots.status().message());
    return;
  }
  const StubRecord& rec = slots->current;
  if (rec.state == StubState::kSealed) {
    if (rec.object != 0) packs_ref_.emplace(rec.object, where);
    // The damaged slot may have held the newer record: what it named is
    // unknown, so it blocks the sweep although the file still opens.
    NoteDamagedSlot(where, *slots);
    return;
  }
  if (rec.node != store_->node_id()) {
    // Staged on another node, in that node's own staging directory: its
    // daemon seals it, now or when it mounts again.
    NoteDone(rep_, "left " + where + ", staged on another node, to that node");
    return;
  }
  ResealStaged(where, fd, *slots);
}

void NamespaceRecovery::ResealStaged(const std::string& where, int fd, const StubSlots& slots) {
  const StubRecord& rec = slots.current;
  const std::string staging = "staging/" + internal::StagingFileName(rec.object);
  Result<UniqueFd> sfd = store_->OpenStaging(rec.object);
  if (!sfd.ok()) {
    if (sfd.status().code() == ENOENT) {
      ++rep_->broken_stubs;
      NoteProblem(rep_, where + " is staged but " + staging + " is missing; its content is lost");
    } else {
      staging_ref_.insert(rec.object);
      NoteProblem(rep_, "cannot open " + staging + " for " + where + ": " + sfd.status().message());
    }
    NoteDamagedSlot(where, slots);
    return;
  }
  // Sealing deletes the stub's staging file once the stub names the new
  // pack durably. That deletion needs no sweep's proof: a staging file
  // belongs to the one stub that created it (O_EXCL, random id). The
  // seal's stub write also replaces a damaged slot, which is the slot a
  // torn write of a crash leaves.
  Result<StubRecord> sealed = store_->SealStub(fd, rec, sfd->get());
  if (sealed.ok()) {
    if (sealed->object != 0) packs_ref_.emplace(sealed->object, where);  // 0: an empty file, no pack
    ++rep_->staged_resealed;
    NoteDone(rep_, "sealed " + where + " from " + staging + " into pack " + ObjectIdHex(sealed->object));
    return;
  }
  // A failed seal may still have switched the stub: keep whatever it names now.
  NoteProblem(rep_, "cannot seal " + where + " (left staged): " + sealed.status().message());
  staging_ref_.insert(rec.object);
  if (Result<StubSlots> now = ReadStubSlots(env_, fd); !now.ok()) {
    NoteUnreadable(rep_, where + " (stub)", now.status().message());
  } else {
    if (now->current.state == StubState::kSealed && now->current.object != 0) {
      packs_ref_.emplace(now->current.object, where);
    }
    NoteDamagedSlot(where, *now);
  }
}

}  // namespace

Result<RecoveryReport> Store::Recover(const PackProgress& progress) {
  RecoveryReport rep;
  RETURN_IF_ERROR(RemoveUnpublishedPacks(env_, tmp_.get(), &rep));
  NamespaceRecovery walk(this, &rep);
  RETURN_IF_ERROR(walk.Walk(ns_.get()));

  // 3. Garbage: objects nothing refers to, deleted only when every stub,
  // pack and base could be read (CollectPacks adds what it cannot read).
  RETURN_IF_ERROR(CollectPacks(walk.packs_ref(), &rep, progress));
  deletion_blocked_ = !rep.swept();
  if (!rep.swept()) {
    spdlog::warn(
        "recovery: {} object(s) could not be read, so recovery deleted no pack and no staging file, and packs "
        "of deleted files are kept until they are repaired; run `ckptfs fsck {}`, repair or restore what it "
        "names, then remount or run `ckptfs gc`",
        rep.unreadable.size(), path_);
    return rep;
  }
  RETURN_IF_ERROR(RemoveOrphanStaging(walk.staging_ref(), &rep));
  return rep;
}

Status Store::RemoveOrphanStaging(const std::unordered_set<ObjectId>& referenced, RecoveryReport* rep) {
  ASSIGN_OR_RETURN(std::vector<DirEntry> stage_files, env_->ListDir(staging_.get()));
  bool synced = false;
  for (const DirEntry& f : stage_files) {
    std::optional<ObjectId> id = internal::ParseObjectFileName(f.name, internal::kStagingSuffix);
    if (!id) {
      spdlog::warn("recovery: leaving unexpected file staging/{}", LogSafe(f.name));
      continue;
    }
    if (referenced.count(*id)) continue;
    if (!synced) RETURN_IF_ERROR(SyncBeforeDeleting());
    synced = true;
    RETURN_IF_ERROR(env_->UnlinkAt(staging_.get(), f.name).WithContext("recovery: removing orphan staging file"));
    ++rep->orphan_staging_removed;
    NoteDone(rep, "removed orphan staging file staging/" + f.name);
  }
  return Status::Ok();
}

namespace {

struct FoundPack {
  std::string where;
  std::optional<PackMeta> meta;  // nullopt: references unknown
  uint64_t logical_size = 0;
  uint32_t chunk_size = 0;
  uint64_t stored_size = 0;
};
using FoundPacks = std::unordered_map<ObjectId, FoundPack>;

// An object whose publish never finished (packs in RADOS): nothing names
// it. A single-node store removes it, as it empties tmp/; in a shared store
// it may be another node's seal still writing, so cluster GC decides, after
// its grace period.
Status RemoveUnfinishedPack(Store* store, const PackObjectEntry& e, RecoveryReport* rep) {
  if (store->options().cluster.enabled) {
    spdlog::info("recovery: leaving {} to cluster gc (not published yet, or left by a crash)", LogSafe(e.where));
    return Status::Ok();
  }
  RETURN_IF_ERROR(store->pack_objects().Delete(e.id).WithContext("recovery: removing unpublished " + e.where));
  ++rep->tmp_files_removed;
  NoteDone(rep, "removed unpublished " + e.where);
  return Status::Ok();
}

// Every pack, with its references where its meta block can be read.
Result<FoundPacks> FindPacks(Store* store, RecoveryReport* rep, const Store::PackProgress& progress) {
  FoundPacks found;
  ASSIGN_OR_RETURN(const PackListing listing, store->pack_objects().List(ListDetail::kNames));
  for (const PackUnlisted& u : listing.unlisted) {
    NoteUnreadable(rep, u.where + (u.directory ? " (directory)" : " (pack)"), u.status.message());
  }
  for (const std::string& where : listing.unexpected)
    spdlog::warn("recovery: leaving unexpected file {}", LogSafe(where));
  uint64_t read = 0;
  for (const PackObjectEntry& p : listing.packs) {
    if (progress) progress(read++, listing.packs.size());
    if (!p.complete) {
      RETURN_IF_ERROR(RemoveUnfinishedPack(store, p, rep));
      continue;
    }
    FoundPack& e = found[p.id];
    e.where = p.where;
    Result<std::shared_ptr<PackReader>> r = store->OpenPack(p.id);
    if (!r.ok()) {
      NoteUnreadable(rep, p.where + " (pack header or chunk table)", r.status().message());
    } else if (!(*r)->meta_status().ok()) {
      NoteUnreadable(rep, p.where + " (meta block)", (*r)->meta_status().message());
    } else {
      e.meta = (*r)->meta();
      e.logical_size = (*r)->header().logical_size;
      e.chunk_size = (*r)->header().chunk_size;
      e.stored_size = (*r)->stored_size();
    }
  }
  if (progress) progress(read, listing.packs.size());
  return found;
}

// Mark: what stubs name, and the bases of those packs, transitively. A
// pack that is named but absent means its references are lost too.
std::unordered_set<ObjectId> MarkFoundLive(const std::unordered_map<ObjectId, std::string>& roots,
                                           const FoundPacks& found, const PackObjects& packs, RecoveryReport* rep) {
  auto lookup = [&](ObjectId id) {
    internal::PackBases pack;
    auto it = found.find(id);
    if (it == found.end()) return pack;
    pack.exists = true;
    if (it->second.meta) pack.bases = it->second.meta->bases;
    pack.where = it->second.where;
    return pack;
  };
  auto missing = [&](ObjectId id, const std::string& needer) {
    NoteUnreadable(rep, packs.Where(id), "missing, but " + needer + " needs it");
  };
  return internal::MarkLive({roots.begin(), roots.end()}, lookup, missing);
}

}  // namespace

Status Store::CollectPacks(const std::unordered_map<ObjectId, std::string>& roots, RecoveryReport* rep,
                           const PackProgress& progress) {
  ASSIGN_OR_RETURN(const FoundPacks found, FindPacks(this, rep, progress));
  const std::unordered_set<ObjectId> live = MarkFoundLive(roots, found, *pack_objects_, rep);

  // Sweep what nothing needs, unless something could not be read; index the
  // packs whose meta blocks were read.
  // In cluster mode another node's seal may be using any pack: only
  // cluster GC, with its pins and grace period, deletes them (store/cluster_gc.h).
  const bool sweep = rep->unreadable.empty() && !cluster();
  bool synced = false;
  for (const auto& [id, e] : found) {
    if (!sweep || live.count(id)) {
      if (e.meta) index_.Add(id, *e.meta, e.logical_size, e.chunk_size, e.stored_size);
      continue;
    }
    if (!synced) RETURN_IF_ERROR(SyncBeforeDeleting());
    synced = true;
    RETURN_IF_ERROR(DeletePack(id).WithContext("recovery: removing orphan pack"));
    ++rep->orphan_packs_removed;
    NoteDone(rep, "removed orphan pack " + e.where);
  }
  index_.RecountUsers();
  for (const auto& [id, path] : roots) index_.AddRoot(id);
  index_loaded_ = true;
  return Status::Ok();
}

}  // namespace ckptfs
