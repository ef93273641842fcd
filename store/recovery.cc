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

Status WalkTree(Env* env, int dirfd, const std::string& prefix, const TreeVisitor& fn,
                std::unordered_set<ino_t>* seen) {
  Result<std::vector<DirEntry>> entries = env->ListDir(dirfd);
  if (!entries.ok()) return entries.status().WithContext("listing ns/" + prefix);
  for (const DirEntry& e : *entries) {
    const std::string path = Join(prefix, e.name);
    Result<unsigned char> type = EntryType(env, dirfd, e);
    if (!type.ok()) {
      if (type.status().code() == ENOENT) continue;  // removed under us
      return type.status();
    }
    if (*type == DT_DIR) {
      Result<UniqueFd> sub = env->OpenAt(dirfd, e.name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
      if (!sub.ok()) return sub.status();
      RETURN_IF_ERROR(WalkTree(env, sub->get(), path, fn, seen));
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

  // 1. Packs that never got published.
  ASSIGN_OR_RETURN(std::vector<DirEntry> tmp_entries, env_->ListDir(tmp_.get()));
  for (const DirEntry& e : tmp_entries) {
    RETURN_IF_ERROR(env_->UnlinkAt(tmp_.get(), e.name).WithContext("recovery: clearing tmp/"));
    ++rep.tmp_files_removed;
    did("removed unpublished tmp/" + e.name);
  }

  // 2. Walk the namespace: collect what is referenced, seal what was staged.
  std::unordered_set<ObjectId> packs_ref, staging_ref;
  bool unreadable = false;
  auto visit = [&](const std::string& path, int fd, const Status& open_status) -> Status {
    ++rep.stubs_scanned;
    if (!open_status.ok()) {
      ++rep.broken_stubs;
      unreadable = true;
      problem("cannot open stub ns/" + path + ": " + open_status.message());
      return Status::Ok();
    }
    Result<StubRecord> rec = ReadStub(env_, fd);
    if (!rec.ok()) {
      ++rep.broken_stubs;
      unreadable = true;
      problem("unreadable stub ns/" + path + ": " + rec.status().message());
      return Status::Ok();
    }
    if (rec->state == StubState::kSealed) {
      if (rec->object != 0) packs_ref.insert(rec->object);
      return Status::Ok();
    }
    const std::string staging = "staging/" + internal::StagingFileName(rec->object);
    Result<UniqueFd> sfd = OpenStaging(rec->object);
    if (!sfd.ok()) {
      if (sfd.status().code() == ENOENT) {
        ++rep.broken_stubs;
        problem("ns/" + path + " is staged but " + staging + " is missing; its content is lost");
      } else {
        staging_ref.insert(rec->object);
        problem("cannot open " + staging + " for ns/" + path + ": " + sfd.status().message());
      }
      return Status::Ok();
    }
    Result<StubRecord> sealed = SealStub(fd, *rec, sfd->get());
    if (sealed.ok()) {
      packs_ref.insert(sealed->object);
      ++rep.staged_resealed;
      did("sealed ns/" + path + " from " + staging + " into pack " + ObjectIdHex(sealed->object));
      return Status::Ok();
    }
    // A failed seal may still have switched the stub: keep whatever it names now.
    problem("cannot seal ns/" + path + " (left staged): " + sealed.status().message());
    staging_ref.insert(rec->object);
    if (Result<StubRecord> now = ReadStub(env_, fd); now.ok() && now->state == StubState::kSealed) {
      packs_ref.insert(now->object);
    }
    return Status::Ok();
  };
  std::unordered_set<ino_t> seen;
  RETURN_IF_ERROR(internal::WalkTree(env_, ns_.get(), "", visit, &seen).WithContext("recovery"));

  // 3. Garbage: objects nothing refers to. An unreadable stub might refer
  // to any of them, so then nothing is deleted and fsck gets to look.
  if (unreadable) {
    problem(std::to_string(rep.broken_stubs) +
            " stub(s) unreadable: not deleting unreferenced packs or staging files; run fsck");
    RETURN_IF_ERROR(CollectPacks(packs_ref, &rep, /*keep_all=*/true));
    return rep;
  }
  RETURN_IF_ERROR(CollectPacks(packs_ref, &rep, /*keep_all=*/false));
  ASSIGN_OR_RETURN(std::vector<DirEntry> stage_files, env_->ListDir(staging_.get()));
  for (const DirEntry& f : stage_files) {
    std::optional<ObjectId> id = internal::ParseObjectFileName(f.name, internal::kStagingSuffix);
    if (!id) {
      spdlog::warn("recovery: leaving unexpected file staging/{}", f.name);
      continue;
    }
    if (staging_ref.count(*id)) continue;
    RETURN_IF_ERROR(env_->UnlinkAt(staging_.get(), f.name).WithContext("recovery: removing orphan staging file"));
    ++rep.orphan_staging_removed;
    did("removed orphan staging file staging/" + f.name);
  }
  return rep;
}

}  // namespace ckptfs

namespace ckptfs {

Status Store::CollectPacks(const std::unordered_set<ObjectId>& roots, RecoveryReport* rep, bool keep_all) {
  struct Found {
    std::string dir, file;
    std::optional<PackMeta> meta;  // nullopt: unreadable
    uint64_t logical_size = 0;
    uint32_t chunk_size = 0;
  };
  std::unordered_map<ObjectId, Found> found;
  ASSIGN_OR_RETURN(std::vector<DirEntry> pack_dirs, env_->ListDir(packs_.get()));
  for (const DirEntry& d : pack_dirs) {
    Result<UniqueFd> dir = env_->OpenAt(packs_.get(), d.name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (!dir.ok()) {
      spdlog::warn("recovery: skipping packs/{}: {}", d.name, dir.status().message());
      continue;
    }
    ASSIGN_OR_RETURN(std::vector<DirEntry> files, env_->ListDir(dir->get()));
    for (const DirEntry& f : files) {
      std::optional<ObjectId> id = internal::ParseObjectFileName(f.name, internal::kPackSuffix);
      if (!id) {
        spdlog::warn("recovery: leaving unexpected file packs/{}/{}", d.name, f.name);
        continue;
      }
      Found& e = found[*id];
      e.dir = d.name;
      e.file = f.name;
      if (Result<std::shared_ptr<PackReader>> r = OpenPack(*id); r.ok()) {
        e.meta = (*r)->meta();
        e.logical_size = (*r)->header().logical_size;
        e.chunk_size = (*r)->header().chunk_size;
      } else {
        spdlog::warn("recovery: pack {} is unreadable (fsck reports it): {}", f.name, r.status().message());
      }
    }
  }

  // Mark: what stubs name, and the bases of those packs, transitively.
  std::unordered_set<ObjectId> live;
  std::vector<ObjectId> todo;
  for (const auto& [id, e] : found) {
    if (keep_all || roots.count(id)) todo.push_back(id);
  }
  while (!todo.empty()) {
    const ObjectId id = todo.back();
    todo.pop_back();
    if (!live.insert(id).second) continue;
    auto it = found.find(id);
    if (it == found.end() || !it->second.meta) continue;
    for (ObjectId b : it->second.meta->bases) todo.push_back(b);
  }

  // Sweep what nothing needs; index the rest.
  for (const auto& [id, e] : found) {
    if (live.count(id)) {
      if (e.meta) index_.Add(id, *e.meta, e.logical_size, e.chunk_size);
      continue;
    }
    Result<UniqueFd> dir = env_->OpenAt(packs_.get(), e.dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (!dir.ok()) return dir.status().WithContext("recovery: removing orphan pack");
    RETURN_IF_ERROR(env_->UnlinkAt(dir->get(), e.file).WithContext("recovery: removing orphan pack"));
    ++rep->orphan_packs_removed;
    const std::string line = "removed orphan pack packs/" + e.dir + "/" + e.file;
    spdlog::info("recovery: {}", line);
    rep->actions.push_back(line);
  }
  index_.RecountUsers();
  for (ObjectId id : roots) index_.AddRoot(id);
  index_loaded_ = true;
  return Status::Ok();
}

}  // namespace ckptfs
