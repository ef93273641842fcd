// Usage: what each file of a store holds and costs, read-only. Like fsck,
// safe to run on a store that is not mounted.
#include <fcntl.h>

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
