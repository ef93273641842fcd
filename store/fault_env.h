// FaultEnv: an Env wrapper for tests that makes system calls fail on cue.
//  - FailNth(op, n, err): the n-th call of `op` from now fails with err
//    (sticky: that call and every later one of that kind).
//  - SetShortWrites: PWrite writes only half of what it is asked (>= 1
//    byte), which PWriteAll must absorb.
//  - CrashAfterMutations(k): lets k more mutating calls through, then every
//    call of any kind fails with EIO, as if the process had been killed right
//    after the k-th mutation. Mutations are what change the backing store:
//    pwrite, fsync, fdatasync, ftruncate, futimens, rename, unlink, mkdir,
//    symlink, link, mknod, chmod, chown, utimens, xattr writes and opens with
//    O_CREAT or O_TRUNC. Loop k over 0..mutations() of a clean run to crash
//    before and after each step of a commit.
// Counters (calls(op), mutations()) let a test size its loops from a clean
// run. Thread-safe.
#pragma once

#include <fcntl.h>

#include <array>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "store/env.h"

namespace ckptfs {

class FaultEnv : public Env {
 public:
  enum Op {
    kOpen,
    kPRead,
    kPWrite,
    kFsync,
    kFdatasync,
    kFtruncate,
    kFstat,
    kFstatAt,
    kFutimens,
    kRename,
    kUnlink,
    kMkdir,
    kSymlink,
    kReadlink,
    kLink,
    kMknod,
    kFchmod,
    kFchown,
    kUtimens,
    kListDir,
    kFstatvfs,
    kSetXattr,
    kGetXattr,
    kListXattr,
    kRemoveXattr,
    kNumOps,
  };

  static const char* OpName(Op op) {
    static constexpr const char* kNames[kNumOps] = {
        "open",    "pread",   "pwrite",   "fsync",    "fdatasync", "ftruncate", "fstat",      "fstatat", "futimens",
        "rename",  "unlink",  "mkdir",    "symlink",  "readlink",  "link",      "mknod",      "fchmod",  "fchown",
        "utimens", "listdir", "fstatvfs", "setxattr", "getxattr",  "listxattr", "removexattr"};
    return op >= 0 && op < kNumOps ? kNames[op] : "?";
  }

  explicit FaultEnv(Env* base = Env::Default()) : base_(base) {}

  // --- fault control ---
  void FailNth(Op op, uint64_t n, int err, bool sticky = false) {
    std::lock_guard<std::mutex> l(mu_);
    faults_.push_back(Fault{op, calls_[op] + n, err, sticky});
  }
  void SetShortWrites(bool on) {
    std::lock_guard<std::mutex> l(mu_);
    short_writes_ = on;
  }
  void CrashAfterMutations(uint64_t k) {
    std::lock_guard<std::mutex> l(mu_);
    crash_armed_ = true;
    crash_at_ = mutations_ + k;
    if (k == 0) crashed_ = true;
  }
  // Back to a healthy Env (counters are kept).
  void ClearFaults() {
    std::lock_guard<std::mutex> l(mu_);
    faults_.clear();
    short_writes_ = false;
    crash_armed_ = false;
    crashed_ = false;
  }
  void ResetCounters() {
    std::lock_guard<std::mutex> l(mu_);
    calls_.fill(0);
    mutations_ = 0;
    injected_ = 0;
    faults_.clear();
  }

  // --- counters ---
  uint64_t calls(Op op) const {
    std::lock_guard<std::mutex> l(mu_);
    return calls_[op];
  }
  uint64_t mutations() const {
    std::lock_guard<std::mutex> l(mu_);
    return mutations_;
  }
  uint64_t injected() const {  // faults delivered so far (crash failures included)
    std::lock_guard<std::mutex> l(mu_);
    return injected_;
  }
  bool crashed() const {
    std::lock_guard<std::mutex> l(mu_);
    return crashed_;
  }

  // --- Env ---
  Result<UniqueFd> OpenAt(int dirfd, const std::string& path, int flags, mode_t mode = 0) override {
    RETURN_IF_ERROR(Enter(kOpen, (flags & (O_CREAT | O_TRUNC)) != 0));
    return Done(base_->OpenAt(dirfd, path, flags, mode), (flags & (O_CREAT | O_TRUNC)) != 0);
  }
  Result<size_t> PRead(int fd, std::span<uint8_t> buf, uint64_t off) override {
    RETURN_IF_ERROR(Enter(kPRead, false));
    return base_->PRead(fd, buf, off);
  }
  Result<size_t> PWrite(int fd, std::span<const uint8_t> buf, uint64_t off) override {
    RETURN_IF_ERROR(Enter(kPWrite, true));
    bool half;
    {
      std::lock_guard<std::mutex> l(mu_);
      half = short_writes_;
    }
    if (half && buf.size() > 1) buf = buf.first(buf.size() / 2);
    return Done(base_->PWrite(fd, buf, off), true);
  }
  Status Fsync(int fd) override {
    return Mutate(kFsync, [&] { return base_->Fsync(fd); });
  }
  Status Fdatasync(int fd) override {
    return Mutate(kFdatasync, [&] { return base_->Fdatasync(fd); });
  }
  Status Ftruncate(int fd, uint64_t size) override {
    return Mutate(kFtruncate, [&] { return base_->Ftruncate(fd, size); });
  }
  Result<struct stat> Fstat(int fd) override {
    RETURN_IF_ERROR(Enter(kFstat, false));
    return base_->Fstat(fd);
  }
  Result<struct stat> FstatAt(int dirfd, const std::string& path, int flags) override {
    RETURN_IF_ERROR(Enter(kFstatAt, false));
    return base_->FstatAt(dirfd, path, flags);
  }
  Status Futimens(int fd, const struct timespec times[2]) override {
    return Mutate(kFutimens, [&] { return base_->Futimens(fd, times); });
  }
  Status RenameAt(int olddir, const std::string& oldname, int newdir, const std::string& newname,
                  unsigned flags = 0) override {
    return Mutate(kRename, [&] { return base_->RenameAt(olddir, oldname, newdir, newname, flags); });
  }
  Status UnlinkAt(int dirfd, const std::string& path, int flags = 0) override {
    return Mutate(kUnlink, [&] { return base_->UnlinkAt(dirfd, path, flags); });
  }
  Status MkdirAt(int dirfd, const std::string& path, mode_t mode) override {
    return Mutate(kMkdir, [&] { return base_->MkdirAt(dirfd, path, mode); });
  }
  Status SymlinkAt(const std::string& target, int dirfd, const std::string& path) override {
    return Mutate(kSymlink, [&] { return base_->SymlinkAt(target, dirfd, path); });
  }
  Result<std::string> ReadlinkAt(int dirfd, const std::string& path) override {
    RETURN_IF_ERROR(Enter(kReadlink, false));
    return base_->ReadlinkAt(dirfd, path);
  }
  Status LinkAt(int olddir, const std::string& oldpath, int newdir, const std::string& newpath, int flags) override {
    return Mutate(kLink, [&] { return base_->LinkAt(olddir, oldpath, newdir, newpath, flags); });
  }
  Status MknodAt(int dirfd, const std::string& path, mode_t mode, dev_t dev) override {
    return Mutate(kMknod, [&] { return base_->MknodAt(dirfd, path, mode, dev); });
  }
  Status FchmodAt(int dirfd, const std::string& path, mode_t mode, int flags) override {
    return Mutate(kFchmod, [&] { return base_->FchmodAt(dirfd, path, mode, flags); });
  }
  Status FchownAt(int dirfd, const std::string& path, uid_t uid, gid_t gid, int flags) override {
    return Mutate(kFchown, [&] { return base_->FchownAt(dirfd, path, uid, gid, flags); });
  }
  Status UtimensAt(int dirfd, const std::string& path, const struct timespec times[2], int flags) override {
    return Mutate(kUtimens, [&] { return base_->UtimensAt(dirfd, path, times, flags); });
  }
  Result<std::vector<DirEntry>> ListDir(int dirfd) override {
    RETURN_IF_ERROR(Enter(kListDir, false));
    return base_->ListDir(dirfd);
  }
  Result<struct statvfs> Fstatvfs(int fd) override {
    RETURN_IF_ERROR(Enter(kFstatvfs, false));
    return base_->Fstatvfs(fd);
  }
  Status SetXattr(const std::string& path, const std::string& name, std::span<const uint8_t> value,
                  int flags) override {
    return Mutate(kSetXattr, [&] { return base_->SetXattr(path, name, value, flags); });
  }
  Result<size_t> GetXattr(const std::string& path, const std::string& name, std::span<uint8_t> out) override {
    RETURN_IF_ERROR(Enter(kGetXattr, false));
    return base_->GetXattr(path, name, out);
  }
  Result<size_t> ListXattr(const std::string& path, std::span<char> out) override {
    RETURN_IF_ERROR(Enter(kListXattr, false));
    return base_->ListXattr(path, out);
  }
  Status RemoveXattr(const std::string& path, const std::string& name) override {
    return Mutate(kRemoveXattr, [&] { return base_->RemoveXattr(path, name); });
  }

 private:
  struct Fault {
    Op op;
    uint64_t nth;  // absolute value of calls_[op] that fails
    int err;
    bool sticky;
  };

  // Counts the call and decides whether it is refused. A refused call does
  // not happen, so it is not a mutation.
  Status Enter(Op op, bool mutating) {
    std::lock_guard<std::mutex> l(mu_);
    if (crashed_) {
      ++injected_;
      return Status::Error(
          EIO, std::string("injected crash: ") + OpName(op) + " after mutation " + std::to_string(crash_at_));
    }
    const uint64_t n = ++calls_[op];
    for (const Fault& f : faults_) {
      if (f.op == op && (n == f.nth || (f.sticky && n > f.nth))) {
        ++injected_;
        return Status::FromErrno(f.err, std::string("injected fault: ") + OpName(op) + " call " + std::to_string(n));
      }
    }
    if (mutating) ++mutations_;
    return Status::Ok();
  }

  // A mutation that went through may be the last one before the "crash".
  void AfterMutation() {
    std::lock_guard<std::mutex> l(mu_);
    if (crash_armed_ && mutations_ >= crash_at_) crashed_ = true;
  }

  template <typename T>
  T Done(T result, bool mutating) {
    if (mutating) AfterMutation();
    return result;
  }

  template <typename F>
  Status Mutate(Op op, F&& f) {
    RETURN_IF_ERROR(Enter(op, true));
    Status s = f();
    AfterMutation();
    return s;
  }

  Env* base_;
  mutable std::mutex mu_;
  std::array<uint64_t, kNumOps> calls_{};
  uint64_t mutations_ = 0;
  uint64_t injected_ = 0;
  std::vector<Fault> faults_;
  bool short_writes_ = false;
  bool crash_armed_ = false;
  bool crashed_ = false;
  uint64_t crash_at_ = 0;
};

}  // namespace ckptfs
