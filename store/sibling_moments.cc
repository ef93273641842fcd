// Store::FindSiblingMoments: where a checkpoint is split into files of one
// save (model.safetensors and optimizer.pt, as Hugging Face's Trainer
// writes), lossy mode weighs the model file's errors by the optimizer
// file's second moments.
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

// Looking further than this many of the newest files costs more than it helps.
constexpr size_t kMaxSiblings = 8;

bool HoldsSecondMoments(const FileLayout& layout) {
  const std::vector<lossy::RoleAssignment> roles = lossy::AssignRoles(layout);
  return std::any_of(roles.begin(), roles.end(),
                     [](const lossy::RoleAssignment& r) { return r.role == lossy::TensorRole::kAdamV; });
}

}  // namespace

std::optional<SiblingMoments> Store::FindSiblingMoments(int stub_fd) {
  const std::string self = FdPathForLog(stub_fd);
  const size_t slash = self.rfind('/');
  if (slash == std::string::npos) return std::nullopt;
  Result<UniqueFd> dir = env_->OpenAt(AT_FDCWD, self.substr(0, slash), O_RDONLY | O_DIRECTORY);
  if (!dir.ok()) return std::nullopt;
  Result<std::vector<DirEntry>> entries = env_->ListDir(dir->get());
  if (!entries.ok()) return std::nullopt;
  std::vector<std::pair<timespec, std::string>> files;
  for (const DirEntry& e : *entries) {
    if (e.name == self.substr(slash + 1)) continue;
    Result<struct stat> st = env_->FstatAt(dir->get(), e.name, AT_SYMLINK_NOFOLLOW);
    if (st.ok() && S_ISREG(st->st_mode)) files.emplace_back(st->st_mtim, e.name);
  }
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) {
    return a.first.tv_sec != b.first.tv_sec ? a.first.tv_sec > b.first.tv_sec : a.first.tv_nsec > b.first.tv_nsec;
  });
  for (size_t i = 0; i < files.size() && i < kMaxSiblings; ++i) {
    Result<UniqueFd> fd = env_->OpenAt(dir->get(), files[i].second, O_RDONLY | O_NOFOLLOW);
    if (!fd.ok()) continue;
    Result<StubRecord> rec = ReadStub(env_, fd->get());
    if (!rec.ok() || rec->object == 0) continue;
    std::shared_ptr<const ByteSource> src;
    if (rec->state == StubState::kSealed) {
      src = std::make_shared<PackSource>(this, rec->object, rec->size);
    } else if (Result<UniqueFd> sfd = OpenStaging(rec->object); sfd.ok()) {
      src = std::make_shared<StagingSource>(std::move(sfd).value());
    } else {
      continue;
    }
    FileLayout layout = DetectLayout(*src);  // a file still being written parses as unknown
    if (HoldsSecondMoments(layout)) return SiblingMoments{std::move(src), std::move(layout)};
  }
  return std::nullopt;
}

}  // namespace ckptfs
