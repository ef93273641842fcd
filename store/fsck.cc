// Fsck and Usage: read-only inspection of a store. Safe to run on a store
// that is not mounted; on a live store, a concurrent seal can show up as a
// transient warning (tmp file) or error (pack switched mid-check).
#include <fcntl.h>

#include <map>
#include <unordered_map>
#include <unordered_set>

#include "base/log.h"
#include "store/store.h"
#include "store/store_internal.h"

namespace ckptfs {
namespace {

// Splits "a/b/c" and rejects anything that could leave ns/.
Result<std::string> CleanSubpath(const std::string& subpath) {
  std::string out;
  size_t i = 0;
  while (i <= subpath.size()) {
    size_t j = subpath.find('/', i);
    if (j == std::string::npos) j = subpath.size();
    std::string part = subpath.substr(i, j - i);
    if (part == "..") return Status::InvalidArgument("path " + subpath + " must stay inside the store");
    if (!part.empty() && part != ".") out += (out.empty() ? "" : "/") + part;
    i = j + 1;
  }
  return out;
}

}  // namespace

Result<FsckReport> Store::Fsck() {
  FsckReport rep;
  if (Result<internal::Superblock> sb = internal::ReadSuperblock(env_, root_.get(), path_); !sb.ok()) {
    rep.errors.push_back("CKPTFS: " + sb.status().message());
  }

  std::unordered_map<ObjectId, std::string> pack_owner;
  std::unordered_set<ObjectId> staging_ref;
  std::vector<ObjectId> base_todo;  // bases of files' packs: needed though no stub names them
  auto visit = [&](const std::string& path, int fd, const Status& open_status) -> Status {
    ++rep.files_checked;
    const std::string where = "ns/" + path;
    if (!open_status.ok()) {
      rep.errors.push_back(where + ": cannot open stub: " + open_status.message());
      return Status::Ok();
    }
    Result<StubRecord> rec = ReadStub(env_, fd);
    if (!rec.ok()) {
      rep.errors.push_back(where + ": unreadable stub: " + rec.status().message());
      return Status::Ok();
    }
    if (rec->state == StubState::kStaged) {
      staging_ref.insert(rec->object);
      const std::string staging = "staging/" + internal::StagingFileName(rec->object);
      if (Result<struct stat> st = env_->FstatAt(staging_.get(), internal::StagingFileName(rec->object), 0); !st.ok()) {
        rep.errors.push_back(where + ": staged, but " + staging + " is missing: " + st.status().message());
      } else {
        rep.warnings.push_back(where + ": not sealed yet (content in " + staging + ")");
      }
      return Status::Ok();
    }
    if (rec->object == 0) return Status::Ok();  // empty file
    auto [it, inserted] = pack_owner.emplace(rec->object, path);
    if (!inserted) {
      rep.errors.push_back(where + ": pack " + ObjectIdHex(rec->object) + " is also referenced by ns/" + it->second);
      return Status::Ok();
    }
    Result<std::shared_ptr<PackReader>> pack = OpenPack(rec->object);
    if (!pack.ok()) {
      rep.errors.push_back(where + ": " + pack.status().message());
      return Status::Ok();
    }
    ++rep.packs_checked;
    for (ObjectId b : (*pack)->meta().bases) base_todo.push_back(b);
    if (Status s = (*pack)->VerifyAll(this); !s.ok()) {
      rep.errors.push_back(where + ": " + s.message());
      return Status::Ok();
    }
    rep.chunks_checked += (*pack)->chunks().size();
    rep.bytes_checked += (*pack)->header().logical_size;
    if ((*pack)->header().logical_size != rec->size) {
      rep.errors.push_back(where + ": stub says " + std::to_string(rec->size) + " bytes but pack " +
                           ObjectIdHex(rec->object) + " holds " + std::to_string((*pack)->header().logical_size));
    }
    return Status::Ok();
  };
  std::unordered_set<ino_t> seen;
  if (Status s = internal::WalkTree(env_, ns_.get(), "", visit, &seen); !s.ok()) {
    rep.errors.push_back("ns/: walk stopped early: " + s.message());
  }

  // Packs kept only as bases of others (their own file was deleted).
  std::unordered_set<ObjectId> needed;
  while (!base_todo.empty()) {
    const ObjectId id = base_todo.back();
    base_todo.pop_back();
    if (!needed.insert(id).second) continue;
    Result<std::shared_ptr<PackReader>> pack = OpenPack(id);
    if (!pack.ok()) continue;  // the files that need it already failed verification
    for (ObjectId b : (*pack)->meta().bases) base_todo.push_back(b);
  }

  // Orphans are not corruption: recovery removes them at the next mount.
  if (Result<std::vector<DirEntry>> dirs = env_->ListDir(packs_.get()); dirs.ok()) {
    for (const DirEntry& d : *dirs) {
      Result<UniqueFd> dir = env_->OpenAt(packs_.get(), d.name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
      Result<std::vector<DirEntry>> files =
          dir.ok() ? env_->ListDir(dir->get()) : Result<std::vector<DirEntry>>(dir.status());
      if (!files.ok()) {
        rep.warnings.push_back("packs/" + d.name + ": " + files.status().message());
        continue;
      }
      for (const DirEntry& f : *files) {
        std::optional<ObjectId> id = internal::ParseObjectFileName(f.name, internal::kPackSuffix);
        const std::string where = "packs/" + d.name + "/" + f.name;
        if (!id || internal::PackDirName(*id) != d.name) {
          rep.warnings.push_back(where + ": unexpected file");
        } else if (!pack_owner.count(*id) && !needed.count(*id)) {
          rep.warnings.push_back(where + ": orphan pack (no stub refers to it; recovery removes it)");
        }
      }
    }
  } else {
    rep.errors.push_back("packs/: " + dirs.status().message());
  }
  if (Result<std::vector<DirEntry>> files = env_->ListDir(staging_.get()); files.ok()) {
    for (const DirEntry& f : *files) {
      std::optional<ObjectId> id = internal::ParseObjectFileName(f.name, internal::kStagingSuffix);
      if (!id) {
        rep.warnings.push_back("staging/" + f.name + ": unexpected file");
      } else if (!staging_ref.count(*id)) {
        rep.warnings.push_back("staging/" + f.name + ": orphan staging file (recovery removes it)");
      }
    }
  } else {
    rep.errors.push_back("staging/: " + files.status().message());
  }
  if (Result<std::vector<DirEntry>> files = env_->ListDir(tmp_.get()); files.ok()) {
    for (const DirEntry& f : *files) {
      rep.warnings.push_back("tmp/" + f.name + ": left by an interrupted seal (recovery removes it)");
    }
  } else {
    rep.errors.push_back("tmp/: " + files.status().message());
  }
  return rep;
}

Result<std::vector<FileUsage>> Store::Usage(const std::string& subpath) {
  ASSIGN_OR_RETURN(std::string sub, CleanSubpath(subpath));
  std::vector<FileUsage> out;
  auto visit = [&](const std::string& path, int fd, const Status& open_status) -> Status {
    if (!open_status.ok()) {
      spdlog::warn("usage: skipping ns/{}: {}", path, open_status.message());
      return Status::Ok();
    }
    Result<StubRecord> rec = ReadStub(env_, fd);
    Result<struct stat> stub_st = env_->Fstat(fd);
    if (!rec.ok() || !stub_st.ok()) {
      spdlog::warn("usage: skipping ns/{}: {}", path, (!rec.ok() ? rec.status() : stub_st.status()).message());
      return Status::Ok();
    }
    FileUsage u;
    u.path = path;
    u.stored = static_cast<uint64_t>(stub_st->st_size);
    if (rec->state == StubState::kStaged) {
      u.staged = true;
      if (Result<struct stat> st = env_->FstatAt(staging_.get(), internal::StagingFileName(rec->object), 0); st.ok()) {
        u.logical = static_cast<uint64_t>(st->st_size);
        u.stored += static_cast<uint64_t>(st->st_blocks) * 512;
      } else {
        u.logical = rec->size;
      }
    } else {
      u.logical = rec->size;
      u.pack = rec->object;
      if (rec->object != 0) {
        if (Result<uint64_t> n = PackFileSize(rec->object); n.ok()) u.stored += *n;
        if (Result<std::shared_ptr<PackReader>> p = OpenPack(rec->object); p.ok()) {
          u.depth = (*p)->meta().max_depth();
          if (!(*p)->meta().bases.empty()) u.base = (*p)->meta().bases.front();
          u.lossy = (*p)->meta().lossy;
        }
      }
    }
    out.push_back(std::move(u));
    return Status::Ok();
  };

  std::unordered_set<ino_t> seen;
  if (sub.empty()) {
    RETURN_IF_ERROR(internal::WalkTree(env_, ns_.get(), "", visit, &seen));
    return out;
  }
  ASSIGN_OR_RETURN(struct stat st, env_->FstatAt(ns_.get(), sub, AT_SYMLINK_NOFOLLOW));
  if (S_ISDIR(st.st_mode)) {
    ASSIGN_OR_RETURN(UniqueFd dir, env_->OpenAt(ns_.get(), sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
    RETURN_IF_ERROR(internal::WalkTree(env_, dir.get(), sub, visit, &seen));
  } else if (S_ISREG(st.st_mode)) {
    ASSIGN_OR_RETURN(UniqueFd fd, env_->OpenAt(ns_.get(), sub, O_RDONLY | O_NOFOLLOW));
    RETURN_IF_ERROR(visit(sub, fd.get(), Status::Ok()));
  } else {
    return Status::InvalidArgument(sub + " is neither a regular file nor a directory");
  }
  return out;
}

}  // namespace ckptfs
