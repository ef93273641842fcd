// Store::FindSiblingMoments: where a checkpoint is split into files of one
// save (model.safetensors and optimizer.pt, as Hugging Face's Trainer
// writes), lossy mode weighs the model file's errors by the optimizer
// file's second moments. Only a file that can be that optimizer file is
// offered: same directory, same owner, last written within the save window
// (kSaveWindowSeconds); LossyCoder then requires its moments to match the
// model's parameters by order, shape and name.
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>

#include "base/log.h"
#include "codec/lossy/roles.h"
#include "store/store.h"
#include "store/store_internal.h"

namespace ckptfs {
namespace {

// A sealed file's logical bytes, read through the store.
class PackSource : public ByteSource {
 public:
  PackSource(Store* store, ObjectId pack, uint64_t size) : store_(store), pack_(pack), size_(size) {}
  uint64_t size() const override { return size_; }
  Status ReadAt(uint64_t off, std::span<uint8_t> out) const override {
    if (off > size_ || size_ - off < out.size()) return Status::Error(EIO, "read past the end of a sibling file");
    return store_->ReadPackRange(pack_, off, out);
  }

 private:
  Store* store_;
  ObjectId pack_;
  uint64_t size_;
};

// A staged file's bytes; owns the staging fd.
class StagingSource : public ByteSource {
 public:
  explicit StagingSource(UniqueFd fd) : fd_(std::move(fd)), src_(fd_.get()) {}
  uint64_t size() const override { return src_.size(); }
  Status ReadAt(uint64_t off, std::span<uint8_t> out) const override { return src_.ReadAt(off, out); }

 private:
  UniqueFd fd_;
  FdSource src_;
};

// Looking further than this many candidates costs more than it helps.
constexpr size_t kMaxSiblings = 8;

bool HoldsSecondMoments(const FileLayout& layout) {
  const std::vector<lossy::RoleAssignment> roles = lossy::AssignRoles(layout);
  return std::any_of(roles.begin(), roles.end(),
                     [](const lossy::RoleAssignment& r) { return r.role == lossy::TensorRole::kAdamV; });
}

int64_t SecondsApart(const timespec& a, const timespec& b) {
  const int64_t d = static_cast<int64_t>(a.tv_sec) - static_cast<int64_t>(b.tv_sec);
  return d < 0 ? -d : d;
}

struct Candidate {
  int64_t apart = 0;  // seconds between its last write and the model file's
  std::string name;
  StubRecord rec;
};

}  // namespace

std::vector<SiblingMoments> Store::FindSiblingMoments(int stub_fd, const timespec& written) {
  std::vector<SiblingMoments> out;
  const std::string self = FdPathForLog(stub_fd);
  const size_t slash = self.rfind('/');
  Result<struct stat> self_st = env_->Fstat(stub_fd);
  if (slash == std::string::npos || !self_st.ok()) return out;
  Result<UniqueFd> dir = env_->OpenAt(AT_FDCWD, self.substr(0, slash), O_RDONLY | O_DIRECTORY);
  if (!dir.ok()) return out;
  Result<std::vector<DirEntry>> entries = env_->ListDir(dir->get());
  if (!entries.ok()) return out;
  std::vector<Candidate> candidates;
  for (const DirEntry& e : *entries) {
    Result<struct stat> st = env_->FstatAt(dir->get(), e.name, AT_SYMLINK_NOFOLLOW);
    // Another user's file says nothing about this one's sensitivity.
    if (!st.ok() || !S_ISREG(st->st_mode) || st->st_ino == self_st->st_ino || st->st_uid != self_st->st_uid) continue;
    Result<UniqueFd> fd = env_->OpenAt(dir->get(), e.name, O_RDONLY | O_NOFOLLOW);
    if (!fd.ok()) continue;
    Result<StubRecord> rec = ReadStub(env_, fd->get());
    if (!rec.ok() || rec->object == 0) continue;
    // A sealed file's stub carries its last write time; a staged one's is
    // the staging file's.
    timespec last = st->st_mtim;
    if (rec->state != StubState::kSealed) {
      Result<struct stat> sst = env_->FstatAt(staging_.get(), internal::StagingFileName(rec->object), 0);
      if (!sst.ok()) continue;
      last = sst->st_mtim;
    }
    const int64_t apart = SecondsApart(last, written);
    if (apart > kSaveWindowSeconds) continue;
    candidates.push_back({apart, e.name, *rec});
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.apart != b.apart ? a.apart < b.apart : a.name < b.name;
  });
  for (size_t i = 0; i < candidates.size() && i < kMaxSiblings; ++i) {
    const Candidate& c = candidates[i];
    std::shared_ptr<const ByteSource> src;
    if (c.rec.state == StubState::kSealed) {
      src = std::make_shared<PackSource>(this, c.rec.object, c.rec.size);
    } else if (Result<UniqueFd> sfd = OpenStaging(c.rec.object); sfd.ok()) {
      src = std::make_shared<StagingSource>(std::move(sfd).value());
    } else {
      continue;
    }
    FileLayout layout = DetectLayout(*src);  // a file still being written parses as unknown
    if (HoldsSecondMoments(layout)) out.push_back(SiblingMoments{c.name, std::move(src), std::move(layout)});
  }
  return out;
}

}  // namespace ckptfs
