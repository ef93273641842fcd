// Store::SiblingsOf: the store's side of sibling pairing
// (codec/lossy/siblings.h). Where a checkpoint is split into files of one
// save (model.safetensors and optimizer.pt, as Hugging Face's Trainer
// writes), only a file that can be the model's optimizer file is offered:
// same directory, same owner, last written within the save window
// (kSaveWindowSeconds); the coder then requires its moments to match the
// model's parameters by order, shape and name.
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "codec/lossy/siblings.h"
#include "store/env_source.h"
#include "store/store.h"
#include "store/store_internal.h"

namespace ckptfs {
namespace {

// A sealed file's logical bytes, read through the store.
class PackSource : public BoundedSource {
 public:
  PackSource(Store* store, ObjectId pack, uint64_t size)
      : BoundedSource(size, "sibling file"), store_(store), pack_(pack) {}

 private:
  Status ReadWithin(uint64_t off, std::span<uint8_t> out) const override {
    return store_->ReadPackRange(pack_, off, out);
  }
  Store* store_;
  ObjectId pack_;
};

// A staged file's bytes, read through Env; owns the staging fd.
class StagingSource : public ByteSource {
 public:
  StagingSource(Env* env, UniqueFd fd, uint64_t size) : fd_(std::move(fd)), src_(env, fd_.get(), size) {}
  uint64_t size() const override { return src_.size(); }
  Status ReadAt(uint64_t off, std::span<uint8_t> out) const override { return src_.ReadAt(off, out); }

 private:
  UniqueFd fd_;
  EnvSource src_;
};

// How long after a DCP shard's last write its seal waits for the save's
// .metadata (written once every rank's shards are), and how often it looks.
constexpr std::chrono::seconds kDcpMetadataWait{60};
constexpr std::chrono::milliseconds kDcpMetadataPoll{100};

int64_t SecondsApart(const timespec& a, const timespec& b) {
  const int64_t d = static_cast<int64_t>(a.tv_sec) - static_cast<int64_t>(b.tv_sec);
  return d < 0 ? -d : d;
}

// The other files of the directory of the stub `stub_fd`, found when the
// coder first asks.
class SameSaveFiles : public SiblingSource {
 public:
  SameSaveFiles(Store* store, int staging_dir, int stub_fd, const timespec& written, const SealWait& wait)
      : store_(store),
        env_(store->env()),
        staging_dir_(staging_dir),
        stub_fd_(stub_fd),
        written_(written),
        wait_(wait) {}

  std::vector<std::string> Candidates() override;
  Result<std::shared_ptr<const ByteSource>> Open(const std::string& name) override;
  Result<std::shared_ptr<const ByteSource>> OpenInParent(const std::string& name) override;
  std::string OwnName() override;
  std::string DirName() override;
  bool WaitForMore() override;
  bool Postponed() const override { return postponed_; }
  std::chrono::steady_clock::time_point WaitingSince() const override { return wait_.since; }

 private:
  struct Candidate {
    int64_t apart = 0;  // seconds between its last write and the model file's
    std::string name;
    StubRecord rec;
  };
  // The directory that holds the stub, checked to hold it still.
  Result<UniqueFd> OpenStubDir(const struct stat& self);
  // A candidate's bytes as they are now.
  Result<std::shared_ptr<const ByteSource>> SourceOf(const StubRecord& rec);
  // `name` in `dir` when it can be the same save's optimizer file.
  std::optional<Candidate> Consider(int dir, const std::string& name, const struct stat& self);

  Store* store_;
  Env* env_;
  int staging_dir_;
  int stub_fd_;
  timespec written_;
  const SealWait wait_;
  bool postponed_ = false;
  std::map<std::string, StubRecord> found_;  // what Candidates named
};

Result<UniqueFd> SameSaveFiles::OpenStubDir(const struct stat& self) {
  ASSIGN_OR_RETURN(std::string path, store_->NamespacePathOf(stub_fd_));
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  ASSIGN_OR_RETURN(UniqueFd fd, env_->OpenAt(store_->ns_fd(), dir, O_RDONLY | O_DIRECTORY));
  // The file may have moved since NamespacePathOf looked.
  ASSIGN_OR_RETURN(struct stat there, env_->FstatAt(fd.get(), path.substr(slash + 1), AT_SYMLINK_NOFOLLOW));
  if (there.st_dev != self.st_dev || there.st_ino != self.st_ino) {
    return Status::Error(ENOENT, path + " moved while its directory was looked up");
  }
  return fd;
}

std::optional<SameSaveFiles::Candidate> SameSaveFiles::Consider(int dir, const std::string& name,
                                                                const struct stat& self) {
  Result<struct stat> st = env_->FstatAt(dir, name, AT_SYMLINK_NOFOLLOW);
  // Another user's file says nothing about this one's sensitivity.
  if (!st.ok() || !S_ISREG(st->st_mode) || st->st_ino == self.st_ino || st->st_uid != self.st_uid) return {};
  Result<UniqueFd> fd = env_->OpenAt(dir, name, O_RDONLY | O_NOFOLLOW);
  if (!fd.ok()) return {};
  Result<StubRecord> rec = ReadStub(env_, fd->get());
  if (!rec.ok() || rec->object == 0) return {};
  // A sealed file's stub carries its last write time; a staged one's is
  // the staging file's.
  timespec last = st->st_mtim;
  if (rec->state != StubState::kSealed) {
    Result<struct stat> sst = env_->FstatAt(staging_dir_, internal::StagingFileName(rec->object), 0);
    if (!sst.ok()) return {};
    last = sst->st_mtim;
  }
  const int64_t apart = SecondsApart(last, written_);
  if (apart > kSaveWindowSeconds) return {};
  return Candidate{apart, name, *rec};
}

std::vector<std::string> SameSaveFiles::Candidates() {
  std::vector<std::string> out;
  Result<struct stat> self = env_->Fstat(stub_fd_);
  if (!self.ok()) return out;
  Result<UniqueFd> dir = OpenStubDir(*self);
  if (!dir.ok()) return out;
  Result<std::vector<DirEntry>> entries = env_->ListDir(dir->get());
  if (!entries.ok()) return out;
  std::vector<Candidate> candidates;
  for (const DirEntry& e : *entries) {
    if (std::optional<Candidate> c = Consider(dir->get(), e.name, *self)) candidates.push_back(std::move(*c));
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.apart != b.apart ? a.apart < b.apart : a.name < b.name;
  });
  for (Candidate& c : candidates) {
    out.push_back(c.name);
    found_.insert_or_assign(std::move(c.name), c.rec);  // asked again: the file may have been sealed since
  }
  return out;
}

Result<std::shared_ptr<const ByteSource>> SameSaveFiles::Open(const std::string& name) {
  auto it = found_.find(name);
  if (it == found_.end()) return Status::Error(ENOENT, name + " is not a candidate sibling");
  return SourceOf(it->second);
}

Result<std::shared_ptr<const ByteSource>> SameSaveFiles::OpenInParent(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos) return Status::InvalidArgument("bad sibling name " + name);
  // A file at the mount's root has no parent inside the namespace.
  ASSIGN_OR_RETURN(std::string path, store_->NamespacePathOf(stub_fd_));
  if (path.find('/') == std::string::npos) return Status::Error(ENOENT, "no parent directory inside the mount");
  ASSIGN_OR_RETURN(struct stat self, env_->Fstat(stub_fd_));
  ASSIGN_OR_RETURN(UniqueFd dir, OpenStubDir(self));
  std::optional<Candidate> c = Consider(dir.get(), "../" + name, self);
  if (!c) return Status::Error(ENOENT, "../" + name + " is not a file of the same save");
  return SourceOf(c->rec);
}

Result<std::shared_ptr<const ByteSource>> SameSaveFiles::SourceOf(const StubRecord& rec) {
  std::shared_ptr<const ByteSource> src;
  if (rec.state == StubState::kSealed) {
    src = std::make_shared<PackSource>(store_, rec.object, rec.size);
  } else {
    ASSIGN_OR_RETURN(UniqueFd fd, store_->OpenStaging(rec.object));
    ASSIGN_OR_RETURN(struct stat st, env_->Fstat(fd.get()));
    src = std::make_shared<StagingSource>(env_, std::move(fd), static_cast<uint64_t>(st.st_size));
  }
  return src;
}

std::string SameSaveFiles::OwnName() {
  Result<std::string> path = store_->NamespacePathOf(stub_fd_);
  if (!path.ok()) return {};
  const size_t slash = path->rfind('/');
  return slash == std::string::npos ? *path : path->substr(slash + 1);
}

std::string SameSaveFiles::DirName() {
  Result<std::string> path = store_->NamespacePathOf(stub_fd_);
  if (!path.ok()) return {};
  const size_t slash = path->rfind('/');
  if (slash == std::string::npos) return {};
  const size_t start = path->rfind('/', slash - 1);
  return path->substr(start == std::string::npos ? 0 : start + 1, slash - (start == std::string::npos ? 0 : start + 1));
}

// Measured from the file's last write, so a seal long after the save
// (recovery at mount) does not wait at all.
bool SameSaveFiles::WaitForMore() {
  const uint64_t written = static_cast<uint64_t>(written_.tv_sec) * 1000000000ull + static_cast<uint64_t>(written_.tv_nsec);
  const uint64_t wait = std::chrono::duration_cast<std::chrono::nanoseconds>(kDcpMetadataWait).count();
  const uint64_t poll = std::chrono::duration_cast<std::chrono::nanoseconds>(kDcpMetadataPoll).count();
  if (env_->WallTimeNs() + poll > written + wait) return false;
  if (wait_.may_postpone) {
    postponed_ = true;
    return false;
  }
  std::this_thread::sleep_for(kDcpMetadataPoll);
  return true;
}

}  // namespace

std::unique_ptr<SiblingSource> Store::SiblingsOf(int stub_fd, const timespec& written, const SealWait& wait) {
  return std::make_unique<SameSaveFiles>(this, staging_.get(), stub_fd, written, wait);
}

}  // namespace ckptfs
