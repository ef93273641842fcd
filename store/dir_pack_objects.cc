#include "store/dir_pack_objects.h"

#include <fcntl.h>

#include "store/private_store.h"
#include "store/store_internal.h"

namespace ckptfs {

using internal::PackDirName;
using internal::PackFileName;

std::string DirPackObjects::Where(ObjectId id) const { return "packs/" + PackDirName(id) + "/" + PackFileName(id); }

Result<UniqueFd> DirPackObjects::PackDir(ObjectId id, bool create) {
  const std::string name = PackDirName(id);
  Result<UniqueFd> fd = env_->OpenAt(packs_fd_, name, O_RDONLY | O_DIRECTORY);
  if (fd.ok() || !create || fd.status().code() != ENOENT) return fd;
  Status mk = env_->MkdirAt(packs_fd_, name, kPrivateDirMode);
  if (mk.ok()) {
    // The new directory entry must be durable before a pack inside it is.
    RETURN_IF_ERROR(env_->Fsync(packs_fd_));
  } else if (mk.code() != EEXIST) {  // EEXIST: a concurrent publish made it
    return mk;
  }
  return env_->OpenAt(packs_fd_, name, O_RDONLY | O_DIRECTORY);
}

Status DirPackObjects::Publish(ObjectId id, int tmp_dir_fd, const std::string& tmp_name, int tmp_fd) {
  (void)tmp_fd;  // the writer made its bytes durable; the rename publishes them
  ASSIGN_OR_RETURN(UniqueFd dir, PackDir(id, /*create=*/true));
  RETURN_IF_ERROR(env_->RenameAt(tmp_dir_fd, tmp_name, dir.get(), PackFileName(id)));
  if (Status s = env_->Fsync(dir.get()); !s.ok()) {
    // Not durable, and no stub refers to it yet: drop it.
    (void)env_->UnlinkAt(dir.get(), PackFileName(id));
    return s;
  }
  return Status::Ok();
}

Result<std::unique_ptr<PackBytes>> DirPackObjects::Open(ObjectId id) {
  ASSIGN_OR_RETURN(UniqueFd dir, PackDir(id, false));
  ASSIGN_OR_RETURN(UniqueFd fd, env_->OpenAt(dir.get(), PackFileName(id), O_RDONLY | O_NOFOLLOW));
  return std::unique_ptr<PackBytes>(std::make_unique<FdPackBytes>(env_, std::move(fd), direct_reads_));
}

Status DirPackObjects::Delete(ObjectId id) {
  Result<UniqueFd> dir = PackDir(id, false);
  if (!dir.ok()) return dir.status().code() == ENOENT ? Status::Ok() : dir.status();
  Status s = env_->UnlinkAt(dir->get(), PackFileName(id));
  return !s.ok() && s.code() == ENOENT ? Status::Ok() : s;
}

Result<uint64_t> DirPackObjects::Size(ObjectId id) {
  ASSIGN_OR_RETURN(UniqueFd dir, PackDir(id, false));
  ASSIGN_OR_RETURN(struct stat st, env_->FstatAt(dir.get(), PackFileName(id), 0));
  return static_cast<uint64_t>(st.st_size);
}

void DirPackObjects::ListSubdir(const DirEntry& d, ListDetail detail, PackListing* out) {
  const std::string at = "packs/" + d.name + "/";
  Result<UniqueFd> dir = env_->OpenAt(packs_fd_, d.name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
  Result<std::vector<DirEntry>> files =
      dir.ok() ? env_->ListDir(dir->get()) : Result<std::vector<DirEntry>>(dir.status());
  if (!files.ok()) {
    out->unlisted.push_back({at, files.status(), true});
    return;
  }
  for (const DirEntry& f : *files) {
    std::optional<ObjectId> id = internal::ParseObjectFileName(f.name, internal::kPackSuffix);
    if (!id) {
      out->unexpected.push_back(at + f.name);
      continue;
    }
    PackObjectEntry e{.id = *id, .where = at + f.name, .misplaced = PackDirName(*id) != d.name};
    if (detail == ListDetail::kSizes) {
      Result<struct stat> st = env_->FstatAt(dir->get(), f.name, AT_SYMLINK_NOFOLLOW);
      if (!st.ok()) {
        if (st.status().code() != ENOENT) out->unlisted.push_back({e.where, st.status(), false});  // ENOENT: deleted meanwhile
        continue;
      }
      e.bytes = static_cast<uint64_t>(st->st_size);
      e.mtime_ns = static_cast<uint64_t>(st->st_mtim.tv_sec) * 1000000000ull + st->st_mtim.tv_nsec;
    }
    out->packs.push_back(std::move(e));
  }
}

Result<PackListing> DirPackObjects::List(ListDetail detail) {
  PackListing out;
  ASSIGN_OR_RETURN(std::vector<DirEntry> dirs, env_->ListDir(packs_fd_));
  for (const DirEntry& d : dirs) ListSubdir(d, detail, &out);
  return out;
}

}  // namespace ckptfs
