// Recovery: finishes or rolls back whatever a crash interrupted. Every step
// is idempotent, so a crash during recovery is handled by the next one.
#include <dirent.h>
#include <fcntl.h>

#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "base/log.h"
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
  spdlog::error("recovery: {}", line);
  rep->unreadable.push_back(where + ": " + why);
  rep->actions.push_back(line);
}

}  // namespace

Result<RecoveryReport> Store::Recover() {
  RecoveryReport rep;
  auto did = [&](const std::string& line) {
    spdlog::info("recovery: {}", line);
    rep.actions.push_back(line);
  };
  auto problem = [&](const std::string& line) {
    spdlog::error("recovery: {}", line);
    rep.actions.push_back(line);
  };
  auto unreadable = [&](const std::string& where, const std::string& why) { NoteUnreadable(&rep, where, why); };

  // 1. Packs that never got published. Always safe to delete: nothing names
  // a pack before it is renamed out of tmp/ (stubs and meta blocks name
  // packs/XX/ID.pack only), and the staging file it was coded from stays
  // until a stub names the published pack.
  ASSIGN_OR_RETURN(std::vector<DirEntry> tmp_entries, env_->ListDir(tmp_.get()));
  for (const DirEntry& e : tmp_entries) {
    RETURN_IF_ERROR(env_->UnlinkAt(tmp_.get(), e.name).WithContext("recovery: clearing tmp/"));
    ++rep.tmp_files_removed;
    did("removed unpublished tmp/" + e.name);
  }

  // 2. Walk the namespace: collect what is referenced, seal what was staged.
  std::unordered_map<ObjectId, std::string> packs_ref;  // -> a stub naming it
  std::unordered_set<ObjectId> staging_ref;
  auto visit = [&](const std::string& path, int fd, const Status& open_status) -> Status {
    const std::string where = "ns/" + path;
    if (path.ends_with('/')) {
      unreadable(where + " (directory)", open_status.message());
      return Status::Ok();
    }
    ++rep.stubs_scanned;
    if (!open_status.ok()) {
      ++rep.broken_stubs;
      unreadable(where + " (stub)", "cannot open: " + open_status.message());
      return Status::Ok();
    }
    Result<StubSlots> slots = ReadStubSlots(env_, fd);
    if (!slots.ok()) {
      ++rep.broken_stubs;
      unreadable(where + " (stub)", slots.status().message());
      return Status::Ok();
    }
    const StubRecord& rec = slots->current;
    if (rec.state == StubState::kSealed) {
      if (rec.object != 0) packs_ref.emplace(rec.object, where);
      // The damaged slot may have held the newer record: what it named is
      // unknown, so it blocks the sweep although the file still opens.
      if (!slots->damaged.empty()) unreadable(where + " (stub)", "damaged slot: " + slots->damaged);
      return Status::Ok();
    }
    const std::string staging = "staging/" + internal::StagingFileName(rec.object);
    Result<UniqueFd> sfd = OpenStaging(rec.object);
    if (!sfd.ok()) {
      if (sfd.status().code() == ENOENT) {
        ++rep.broken_stubs;
        problem(where + " is staged but " + staging + " is missing; its content is lost");
      } else {
        staging_ref.insert(rec.object);
        problem("cannot open " + staging + " for " + where + ": " + sfd.status().message());
      }
      if (!slots->damaged.empty()) unreadable(where + " (stub)", "damaged slot: " + slots->damaged);
      return Status::Ok();
    }
    // Sealing deletes the stub's staging file once the stub names the new
    // pack durably. That deletion needs no sweep's proof: a staging file
    // belongs to the one stub that created it (O_EXCL, random id). The
    // seal's stub write also replaces a damaged slot, which is the slot a
    // torn write of a crash leaves.
    Result<StubRecord> sealed = SealStub(fd, rec, sfd->get());
    if (sealed.ok()) {
      if (sealed->object != 0) packs_ref.emplace(sealed->object, where);  // 0: an empty file, no pack
      ++rep.staged_resealed;
      did("sealed " + where + " from " + staging + " into pack " + ObjectIdHex(sealed->object));
      return Status::Ok();
    }
    // A failed seal may still have switched the stub: keep whatever it names now.
    problem("cannot seal " + where + " (left staged): " + sealed.status().message());
    staging_ref.insert(rec.object);
    if (Result<StubSlots> now = ReadStubSlots(env_, fd); !now.ok()) {
      unreadable(where + " (stub)", now.status().message());
    } else {
      if (now->current.state == StubState::kSealed && now->current.object != 0) {
        packs_ref.emplace(now->current.object, where);
      }
      if (!now->damaged.empty()) unreadable(where + " (stub)", "damaged slot: " + now->damaged);
    }
    return Status::Ok();
  };
  std::unordered_set<ino_t> seen;
  RETURN_IF_ERROR(internal::WalkTree(env_, ns_.get(), "", visit, &seen).WithContext("recovery"));

  // 3. Garbage: objects nothing refers to, deleted only when every stub,
  // pack and base could be read (CollectPacks adds what it cannot read).
  RETURN_IF_ERROR(CollectPacks(packs_ref, &rep));
  deletion_blocked_ = !rep.swept();
  if (!rep.swept()) {
    spdlog::warn(
        "recovery: {} object(s) could not be read, so recovery deleted no pack and no staging file, and packs "
        "of deleted files are kept until they are repaired; run `ckptfs fsck {}`, repair or restore what it "
        "names, then remount or run `ckptfs gc`",
        rep.unreadable.size(), path_);
    return rep;
  }
  ASSIGN_OR_RETURN(std::vector<DirEntry> stage_files, env_->ListDir(staging_.get()));
  bool synced = false;
  for (const DirEntry& f : stage_files) {
    std::optional<ObjectId> id = internal::ParseObjectFileName(f.name, internal::kStagingSuffix);
    if (!id) {
      spdlog::warn("recovery: leaving unexpected file staging/{}", f.name);
      continue;
    }
    if (staging_ref.count(*id)) continue;
    if (!synced) RETURN_IF_ERROR(SyncBeforeDeleting());
    synced = true;
    RETURN_IF_ERROR(env_->UnlinkAt(staging_.get(), f.name).WithContext("recovery: removing orphan staging file"));
    ++rep.orphan_staging_removed;
    did("removed orphan staging file staging/" + f.name);
  }
  return rep;
}

}  // namespace ckptfs

namespace ckptfs {

Status Store::CollectPacks(const std::unordered_map<ObjectId, std::string>& roots, RecoveryReport* rep) {
  auto unreadable = [&](const std::string& where, const std::string& why) { NoteUnreadable(rep, where, why); };
  struct Found {
    std::string dir, file;
    std::optional<PackMeta> meta;  // nullopt: references unknown
    uint64_t logical_size = 0;
    uint32_t chunk_size = 0;
  };
  std::unordered_map<ObjectId, Found> found;
  ASSIGN_OR_RETURN(std::vector<DirEntry> pack_dirs, env_->ListDir(packs_.get()));
  for (const DirEntry& d : pack_dirs) {
    Result<UniqueFd> dir = env_->OpenAt(packs_.get(), d.name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    Result<std::vector<DirEntry>> files =
        dir.ok() ? env_->ListDir(dir->get()) : Result<std::vector<DirEntry>>(dir.status());
    if (!files.ok()) {
      unreadable("packs/" + d.name + "/ (directory)", files.status().message());
      continue;
    }
    for (const DirEntry& f : *files) {
      std::optional<ObjectId> id = internal::ParseObjectFileName(f.name, internal::kPackSuffix);
      const std::string where = "packs/" + d.name + "/" + f.name;
      if (!id) {
        spdlog::warn("recovery: leaving unexpected file {}", where);
        continue;
      }
      Found& e = found[*id];
      e.dir = d.name;
      e.file = f.name;
      Result<std::shared_ptr<PackReader>> r = OpenPack(*id);
      if (!r.ok()) {
        unreadable(where + " (pack header or chunk table)", r.status().message());
      } else if (!(*r)->meta_status().ok()) {
        unreadable(where + " (meta block)", (*r)->meta_status().message());
      } else {
        e.meta = (*r)->meta();
        e.logical_size = (*r)->header().logical_size;
        e.chunk_size = (*r)->header().chunk_size;
      }
    }
  }

  // Mark: what stubs name, and the bases of those packs, transitively. A
  // pack that is named but absent means its references are lost too.
  std::unordered_set<ObjectId> live;
  std::vector<std::pair<ObjectId, std::string>> todo(roots.begin(), roots.end());  // pack, who needs it
  while (!todo.empty()) {
    const auto [id, needer] = todo.back();
    todo.pop_back();
    if (!live.insert(id).second) continue;
    auto it = found.find(id);
    if (it == found.end()) {
      unreadable("packs/" + internal::PackDirName(id) + "/" + internal::PackFileName(id),
                 "missing, but " + needer + " needs it");
      continue;
    }
    if (!it->second.meta) continue;
    for (ObjectId b : it->second.meta->bases) todo.emplace_back(b, "packs/" + it->second.dir + "/" + it->second.file);
  }

  // Sweep what nothing needs, unless something could not be read; index the
  // packs whose meta blocks were read.
  const bool sweep = rep->unreadable.empty();
  bool synced = false;
  for (const auto& [id, e] : found) {
    if (!sweep || live.count(id)) {
      if (e.meta) index_.Add(id, *e.meta, e.logical_size, e.chunk_size);
      continue;
    }
    if (!synced) RETURN_IF_ERROR(SyncBeforeDeleting());
    synced = true;
    Result<UniqueFd> dir = env_->OpenAt(packs_.get(), e.dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (!dir.ok()) return dir.status().WithContext("recovery: removing orphan pack");
    RETURN_IF_ERROR(env_->UnlinkAt(dir->get(), e.file).WithContext("recovery: removing orphan pack"));
    ++rep->orphan_packs_removed;
    const std::string line = "removed orphan pack packs/" + e.dir + "/" + e.file;
    spdlog::info("recovery: {}", line);
    rep->actions.push_back(line);
  }
  index_.RecountUsers();
  for (const auto& [id, path] : roots) index_.AddRoot(id);
  index_loaded_ = true;
  return Status::Ok();
}

}  // namespace ckptfs
