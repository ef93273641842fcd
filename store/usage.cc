// Usage: what each file of a store holds and costs, read-only. Like fsck,
// safe to run on a store that is not mounted.
#include <fcntl.h>

#include <algorithm>
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

// Chunks and bytes of each codec in `pack`, in ChunkCodec order.
std::vector<CodecUsage> CodecsOf(const PackReader& pack) {
  std::vector<CodecUsage> out;
  for (const ChunkEntry& c : pack.chunks()) {
    auto it = std::find_if(out.begin(), out.end(), [&](const CodecUsage& u) { return u.codec == c.codec; });
    if (it == out.end()) it = out.insert(out.end(), CodecUsage{.codec = c.codec});
    it->chunks++;
    it->raw += c.raw_len;
    it->stored += c.stored_len;
  }
  std::sort(out.begin(), out.end(), [](const CodecUsage& a, const CodecUsage& b) { return a.codec < b.codec; });
  return out;
}

}  // namespace

Result<FileUsage> Store::UsageOfStub(int fd, std::string path) {
  ASSIGN_OR_RETURN(StubRecord rec, ReadStub(env_, fd));
  ASSIGN_OR_RETURN(struct stat stub_st, env_->Fstat(fd));
  FileUsage u;
  u.path = std::move(path);
  u.stored = static_cast<uint64_t>(stub_st.st_size);
  if (rec.state == StubState::kStaged) {
    u.staged = true;
    if (Result<struct stat> st = env_->FstatAt(staging_.get(), internal::StagingFileName(rec.object), 0); st.ok()) {
      u.logical = static_cast<uint64_t>(st->st_size);
      u.stored += static_cast<uint64_t>(st->st_blocks) * 512;
    } else {
      u.logical = rec.size;
    }
    return u;
  }
  u.logical = rec.size;
  u.pack = rec.object;
  if (rec.object == 0) return u;
  if (Result<uint64_t> n = PackFileSize(rec.object); n.ok()) u.stored += *n;
  if (Result<std::shared_ptr<PackReader>> p = OpenPack(rec.object); p.ok()) {
    u.depth = (*p)->meta().max_depth();
    if (!(*p)->meta().bases.empty()) u.base = (*p)->meta().bases.front();
    u.lossy = (*p)->meta().lossy;
    u.codecs = CodecsOf(**p);
  }
  return u;
}

Result<FileUsage> Store::UsageOf(const std::string& stub_path) {
  ASSIGN_OR_RETURN(UniqueFd fd, env_->OpenAt(AT_FDCWD, stub_path, O_RDONLY | O_CLOEXEC));
  return UsageOfStub(fd.get(), "");
}

Result<std::vector<FileUsage>> Store::Usage(const std::string& subpath) {
  ASSIGN_OR_RETURN(std::string sub, CleanSubpath(subpath));
  std::vector<FileUsage> out;
  auto visit = [&](const std::string& path, int fd, const Status& open_status) -> Status {
    Result<FileUsage> u = open_status.ok() ? UsageOfStub(fd, path) : Result<FileUsage>(open_status);
    if (!u.ok()) {
      spdlog::warn("usage: skipping ns/{}: {}", LogSafe(path), LogSafe(u.status().message()));
      return Status::Ok();
    }
    out.push_back(std::move(*u));
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
