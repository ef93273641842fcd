// FaultEnv: an Env wrapper for tests that makes system calls fail on cue.
//  - FailNth(op, n, err): the n-th call of `op` from now fails with err
//    (sticky: that call and every later one of that kind).
//  - SetShortWrites: PWrite writes only half of what it is asked (>= 1
//    byte), which PWriteAll must absorb.
//  - CrashAfterMutations(k): lets k more mutating calls through, then every
//    call of any kind fails with EIO, as if the process had been killed right
//    after the k-th mutation. Mutations are what change the backing store:
//    pwrite, fsync, fdatasync, syncfs, ftruncate, futimens, rename, unlink, mkdir,
//    symlink, link, mknod, chmod, chown, utimens, xattr writes and opens with
//    O_CREAT or O_TRUNC. Loop k over 0..mutations() of a clean run to crash
//    before and after each step of a commit.
//  - EnablePowerLoss(root) + PowerOff(): a crash that loses power, not
//    only the process. While enabled, the Env records what the disk holds
//    durably under `root`, as POSIX promises it (in the manner of RocksDB's
//    FaultInjectionTestFS, DropUnsyncedFileData and
//    DeleteFilesCreatedAfterLastDirSync, but for random writes and every
//    kind of directory change):
//      a file's content is what it held at its last fsync/fdatasync (a file
//      created since is empty); a directory's entries are what they were at
//      its last fsync: creates, renames, links and unlinks in it since then
//      are undone (a rename whose destination directory was fsync'd but not
//      its source leaves both names, as two links).
//    Whatever was under `root` when recording began counts as durable.
//    PowerOff() rebuilds the tree under `root` as a power cut at that moment
//    would leave it (new inodes, same names); recording then starts afresh.
//    Modelled: names, file content and mode bits. Not modelled: owners,
//    times and extended attributes (taken as they are, or left default for
//    inodes the cut brings back). While enabled, mutating calls are
//    serialised: the model is for single-threaded crash tests.
//  - SetWallTime(ns): WallTimeNs() returns ns from then on (0: the real
//    clock again), for tests that compare what is stamped into packs.
// Counters (calls(op), mutations()) let a test size its loops from a clean
// run. Thread-safe.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "base/env.h"

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
    kSyncFs,
    kFlock,
    kFadvise,
    kSyncFileRange,
    kNameToHandle,
    kOpenByHandle,
    kNumOps,
  };

  static const char* OpName(Op op) {
    static constexpr const char* kNames[kNumOps] = {
        "open",    "pread",   "pwrite",   "fsync",    "fdatasync", "ftruncate", "fstat",       "fstatat", "futimens",
        "rename",  "unlink",  "mkdir",    "symlink",  "readlink",  "link",      "mknod",       "fchmod",  "fchown",
        "utimens", "listdir", "fstatvfs", "setxattr", "getxattr",  "listxattr", "removexattr", "syncfs",
        "flock",   "fadvise", "sync_file_range", "name_to_handle_at", "open_by_handle_at"};
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
  void SetWallTime(uint64_t ns) { wall_time_ns_ = ns; }
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

  // --- power loss ---
  // Starts recording what a power cut would keep under the directory `root`
  // (its present state counts as durable).
  Status EnablePowerLoss(const std::string& root) {
    std::lock_guard<std::mutex> pl(pl_mu_);
    return PlStart(root);
  }
  // Cuts the power: rebuilds the tree under root as the cut leaves it. Call
  // with no fd into the tree still open (the machine is off; a Store on this
  // Env must be destroyed first). Recording then starts afresh. Fails, and
  // changes nothing, if the model lost track of something on the way.
  Status PowerOff() {
    std::lock_guard<std::mutex> pl(pl_mu_);
    if (!pl_) return Status::InvalidArgument("PowerOff: power loss is not being recorded (EnablePowerLoss)");
    const std::string root = pl_->root;
    RETURN_IF_ERROR(PlRebuild());
    pl_.reset();
    return PlStart(root);
  }

  // --- Env ---
  Result<UniqueFd> OpenAt(int dirfd, const std::string& path, int flags, mode_t mode = 0) override {
    const bool mutating = (flags & (O_CREAT | O_TRUNC)) != 0;
    PlLock pl(this, mutating);
    RETURN_IF_ERROR(Enter(kOpen, mutating));
    std::optional<PlAt> at;
    bool existed = false;
    if (pl_ && mutating) {
      at = PlResolve(dirfd, path);
      existed = base_->FstatAt(at->dir, at->leaf, AT_SYMLINK_NOFOLLOW).ok();
      if (flags & O_CREAT) PlBeforeEntryChange(*at);
      if (existed && (flags & O_TRUNC)) PlBeforeLoss(*at);
    }
    Result<UniqueFd> fd = base_->OpenAt(dirfd, path, flags, mode);
    if (at && fd.ok() && !existed) PlCreated(*at);
    return Done(std::move(fd), mutating);
  }
  Result<size_t> PRead(int fd, std::span<uint8_t> buf, uint64_t off) override {
    RETURN_IF_ERROR(Enter(kPRead, false));
    return base_->PRead(fd, buf, off);
  }
  Result<size_t> PWrite(int fd, std::span<const uint8_t> buf, uint64_t off) override {
    PlLock pl(this, true);
    RETURN_IF_ERROR(Enter(kPWrite, true));
    bool half;
    {
      std::lock_guard<std::mutex> l(mu_);
      half = short_writes_;
    }
    if (half && buf.size() > 1) buf = buf.first(buf.size() / 2);
    if (pl_) PlBeforeWrite(fd);
    return Done(base_->PWrite(fd, buf, off), true);
  }
  Status Fsync(int fd) override {
    return Mutate(kFsync, [&] { return PlSynced(fd, base_->Fsync(fd)); });
  }
  Status Fdatasync(int fd) override {
    return Mutate(kFdatasync, [&] { return PlSynced(fd, base_->Fdatasync(fd)); });
  }
  // syncfs: whatever the tree holds now is what a power cut keeps.
  Status SyncFs(int fd) override {
    return Mutate(kSyncFs, [&] {
      Status s = base_->SyncFs(fd);
      if (!pl_ || !s.ok()) return s;
      const std::string root = pl_->root;
      pl_.reset();
      return PlStart(root);
    });
  }
  Status Ftruncate(int fd, uint64_t size) override {
    return Mutate(kFtruncate, [&] {
      if (pl_) PlBeforeWrite(fd);
      return base_->Ftruncate(fd, size);
    });
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
    return Mutate(kRename, [&] {
      if (pl_) {
        PlAt from = PlResolve(olddir, oldname), to = PlResolve(newdir, newname);
        PlBeforeEntryChange(from);
        PlBeforeEntryChange(to);
        if (!(flags & RENAME_EXCHANGE)) PlBeforeLoss(to);  // what it replaces
      }
      return base_->RenameAt(olddir, oldname, newdir, newname, flags);
    });
  }
  Status UnlinkAt(int dirfd, const std::string& path, int flags = 0) override {
    return Mutate(kUnlink, [&] {
      if (pl_) {
        PlAt at = PlResolve(dirfd, path);
        PlBeforeEntryChange(at);
        PlBeforeLoss(at);
      }
      return base_->UnlinkAt(dirfd, path, flags);
    });
  }
  Status MkdirAt(int dirfd, const std::string& path, mode_t mode) override {
    return MutateEntry(kMkdir, dirfd, path, [&] { return base_->MkdirAt(dirfd, path, mode); });
  }
  Status SymlinkAt(const std::string& target, int dirfd, const std::string& path) override {
    return MutateEntry(kSymlink, dirfd, path, [&] { return base_->SymlinkAt(target, dirfd, path); });
  }
  Result<std::string> ReadlinkAt(int dirfd, const std::string& path) override {
    RETURN_IF_ERROR(Enter(kReadlink, false));
    return base_->ReadlinkAt(dirfd, path);
  }
  Status LinkAt(int olddir, const std::string& oldpath, int newdir, const std::string& newpath, int flags) override {
    return MutateEntry(kLink, newdir, newpath, [&] { return base_->LinkAt(olddir, oldpath, newdir, newpath, flags); });
  }
  Status MknodAt(int dirfd, const std::string& path, mode_t mode, dev_t dev) override {
    return MutateEntry(kMknod, dirfd, path, [&] { return base_->MknodAt(dirfd, path, mode, dev); });
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
  Status Flock(int fd, int operation) override {
    RETURN_IF_ERROR(Enter(kFlock, false));
    return base_->Flock(fd, operation);
  }
  Result<uint64_t> SeekData(int fd, uint64_t off) override { return base_->SeekData(fd, off); }
  Status Fadvise(int fd, uint64_t off, uint64_t len, int advice) override {
    RETURN_IF_ERROR(Enter(kFadvise, false));
    return base_->Fadvise(fd, off, len, advice);
  }
  // Neither a mutation nor a durability point: the power-loss model keeps
  // a file's content as of its last fsync/fdatasync whatever this wrote back.
  Status SyncFileRange(int fd, uint64_t off, uint64_t len, unsigned flags) override {
    RETURN_IF_ERROR(Enter(kSyncFileRange, false));
    return base_->SyncFileRange(fd, off, len, flags);
  }
  uint64_t WallTimeNs() override {
    const uint64_t pinned = wall_time_ns_.load();
    return pinned != 0 ? pinned : base_->WallTimeNs();
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
  Result<std::string> NameToHandleAt(int dirfd, const std::string& path, int flags) override {
    RETURN_IF_ERROR(Enter(kNameToHandle, false));
    return base_->NameToHandleAt(dirfd, path, flags);
  }
  Result<UniqueFd> OpenByHandleAt(int mount_fd, const std::string& handle, int flags) override {
    RETURN_IF_ERROR(Enter(kOpenByHandle, false));
    return base_->OpenByHandleAt(mount_fd, handle, flags);
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
    PlLock pl(this, true);
    RETURN_IF_ERROR(Enter(op, true));
    Status s = f();
    AfterMutation();
    return s;
  }

  // A call that adds the entry `path`: a new inode (mkdir, symlink, mknod),
  // or a new name of a known one (link).
  template <typename F>
  Status MutateEntry(Op op, int dirfd, const std::string& path, F&& f) {
    return Mutate(op, [&] {
      std::optional<PlAt> at;
      if (pl_) {
        at = PlResolve(dirfd, path);
        PlBeforeEntryChange(*at);
      }
      Status s = f();
      if (at && s.ok() && op != kLink) PlCreated(*at);
      return s;
    });
  }

  // ------------------------------------------------ the power-loss model
  // Nodes stand for inodes; an inode number reused after an unlink gets a
  // new node, so the durable tree can still name the old one.
  using PlKey = std::pair<dev_t, ino_t>;
  struct PlNode {
    mode_t mode = 0;
    // Whether the durable state is recorded below; until then the node's
    // present state is its durable one (nothing changed it yet).
    bool tracked = false;
    std::vector<uint8_t> data;                // regular file
    std::map<std::string, uint64_t> entries;  // directory: name -> node
    std::string target;                       // symlink
  };
  struct PlState {
    std::string root;
    uint64_t root_node = 0;
    uint64_t next = 1;
    std::map<PlKey, uint64_t> node_of;  // inodes now under root
    std::map<uint64_t, PlNode> nodes;
    Status error = Status::Ok();  // the first thing the model could not record
  };
  // Where an entry is: its parent directory (a modelled one, or not) and name.
  struct PlAt {
    UniqueFd owned;
    int dir = -1;
    std::string leaf;
    std::optional<uint64_t> dir_node;
  };

  // Serialises mutating calls while power loss is recorded.
  class PlLock {
   public:
    PlLock(FaultEnv* env, bool mutating) {
      if (mutating && env->pl_on_.load()) lk_ = std::unique_lock<std::mutex>(env->pl_mu_);
    }

   private:
    std::unique_lock<std::mutex> lk_;
  };

  void PlNote(const Status& s) {
    if (!s.ok() && pl_->error.ok()) pl_->error = s.WithContext("power-loss model");
  }
  static PlKey KeyOf(const struct stat& st) { return {st.st_dev, st.st_ino}; }
  // The node of an inode, a new untracked one if it was not seen before.
  uint64_t PlNodeOf(const struct stat& st) {
    auto [it, fresh] = pl_->node_of.try_emplace(KeyOf(st), 0);
    if (fresh) {
      it->second = pl_->next++;
      pl_->nodes[it->second].mode = st.st_mode;
    }
    return it->second;
  }
  std::optional<uint64_t> PlKnown(int fd) {
    Result<struct stat> st = base_->Fstat(fd);
    if (!st.ok()) return std::nullopt;
    auto it = pl_->node_of.find(KeyOf(*st));
    if (it == pl_->node_of.end()) return std::nullopt;
    return it->second;
  }
  // The whole content of the file behind fd (even a write-only or O_PATH one).
  Result<std::vector<uint8_t>> PlContent(int fd) {
    ASSIGN_OR_RETURN(UniqueFd r, base_->OpenAt(AT_FDCWD, ProcFdPath(fd), O_RDONLY));
    ASSIGN_OR_RETURN(struct stat st, base_->Fstat(r.get()));
    std::vector<uint8_t> data(static_cast<size_t>(st.st_size));
    RETURN_IF_ERROR(base_->PReadExact(r.get(), data, 0));
    return data;
  }
  Result<std::map<std::string, uint64_t>> PlListing(int dirfd) {
    ASSIGN_OR_RETURN(std::vector<DirEntry> list, base_->ListDir(dirfd));
    std::map<std::string, uint64_t> out;
    for (const DirEntry& e : list) {
      ASSIGN_OR_RETURN(struct stat st, base_->FstatAt(dirfd, e.name, AT_SYMLINK_NOFOLLOW));
      out[e.name] = PlNodeOf(st);
    }
    return out;
  }
  // Records the node's present state (fd: the inode, O_PATH is enough) as
  // its durable one, unless that is recorded already.
  void PlTrack(uint64_t id, int fd) {
    if (pl_->nodes[id].tracked) return;
    const mode_t mode = pl_->nodes[id].mode;
    if (S_ISREG(mode)) {
      Result<std::vector<uint8_t>> data = PlContent(fd);
      if (!data.ok()) return PlNote(data.status());
      pl_->nodes[id].data = std::move(data).value();
    } else if (S_ISDIR(mode)) {
      Result<std::map<std::string, uint64_t>> entries = PlListing(fd);
      if (!entries.ok()) return PlNote(entries.status());
      pl_->nodes[id].entries = std::move(entries).value();
    } else if (S_ISLNK(mode)) {
      Result<std::string> target = base_->ReadlinkAt(fd, "");
      if (!target.ok()) return PlNote(target.status());
      pl_->nodes[id].target = std::move(target).value();
    }
    pl_->nodes[id].tracked = true;
  }
  PlAt PlResolve(int dirfd, const std::string& path) {
    PlAt at;
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos) {
      at.dir = dirfd;
      at.leaf = path;
    } else {
      Result<UniqueFd> parent = base_->OpenAt(dirfd, slash == 0 ? "/" : path.substr(0, slash), O_PATH | O_DIRECTORY);
      if (!parent.ok()) return at;  // the call itself will fail
      at.owned = std::move(parent).value();
      at.dir = at.owned.get();
      at.leaf = path.substr(slash + 1);
    }
    at.dir_node = PlKnown(at.dir);
    return at;
  }
  // Before the entries of a modelled directory change: the durable ones are
  // what it holds now, unless recorded at an fsync since.
  void PlBeforeEntryChange(const PlAt& at) {
    if (at.dir_node) PlTrack(*at.dir_node, at.dir);
  }
  // Before the inode named by `at` loses that name or its content (unlink,
  // rename over it, O_TRUNC): its durable state is fixed now, while a name
  // still leads to it.
  void PlBeforeLoss(const PlAt& at) {
    if (!at.dir_node) return;
    Result<struct stat> st = base_->FstatAt(at.dir, at.leaf, AT_SYMLINK_NOFOLLOW);
    if (!st.ok()) return;  // nothing there
    Result<UniqueFd> fd = base_->OpenAt(at.dir, at.leaf, O_PATH | O_NOFOLLOW);
    if (!fd.ok()) return PlNote(fd.status());
    PlTrack(PlNodeOf(*st), fd->get());
  }
  // A new inode at `at` (mkdir, symlink, mknod, O_CREAT): nothing of it is
  // durable yet. Its number may be one an unlinked inode had.
  void PlCreated(const PlAt& at) {
    if (!at.dir_node) return;
    Result<struct stat> st = base_->FstatAt(at.dir, at.leaf, AT_SYMLINK_NOFOLLOW);
    if (!st.ok()) return PlNote(st.status());
    const uint64_t id = pl_->next++;
    pl_->node_of[KeyOf(*st)] = id;
    PlNode& n = pl_->nodes[id];
    n.mode = st->st_mode;
    n.tracked = true;
    if (S_ISLNK(st->st_mode)) {
      Result<std::string> target = base_->ReadlinkAt(at.dir, at.leaf);
      if (!target.ok()) return PlNote(target.status());
      pl_->nodes[id].target = std::move(target).value();
    }
  }
  void PlBeforeWrite(int fd) {
    if (std::optional<uint64_t> id = PlKnown(fd)) PlTrack(*id, fd);
  }
  // fsync/fdatasync of a modelled file or directory: its present state is
  // its durable one.
  Status PlSynced(int fd, Status synced) {
    if (!pl_ || !synced.ok()) return synced;
    if (std::optional<uint64_t> id = PlKnown(fd)) {
      pl_->nodes[*id].tracked = false;
      PlTrack(*id, fd);
    }
    return synced;
  }

  Status PlStart(const std::string& root) {
    auto state = std::make_unique<PlState>();
    state->root = root;
    pl_ = std::move(state);
    pl_on_ = true;
    Result<UniqueFd> fd = base_->OpenAt(AT_FDCWD, root, O_RDONLY | O_DIRECTORY);
    Status s = fd.ok() ? PlScan(fd->get()) : fd.status();
    if (s.ok()) {
      Result<struct stat> st = base_->Fstat(fd->get());
      if (st.ok()) pl_->root_node = PlNodeOf(*st);
      s = st.status();
    }
    if (!s.ok()) {
      pl_.reset();
      pl_on_ = false;
    }
    return s;
  }
  // Gives every inode under dirfd a node, so that calls on the tree are
  // told apart from calls elsewhere.
  Status PlScan(int dirfd) {
    ASSIGN_OR_RETURN(std::vector<DirEntry> list, base_->ListDir(dirfd));
    for (const DirEntry& e : list) {
      ASSIGN_OR_RETURN(struct stat st, base_->FstatAt(dirfd, e.name, AT_SYMLINK_NOFOLLOW));
      PlNodeOf(st);
      if (S_ISDIR(st.st_mode)) {
        ASSIGN_OR_RETURN(UniqueFd sub, base_->OpenAt(dirfd, e.name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
        RETURN_IF_ERROR(PlScan(sub.get()));
      }
    }
    return Status::Ok();
  }

  static Status PlFsError(const std::error_code& ec, const std::string& what) {
    return Status::FromErrno(ec.value(), "power-loss model: " + what);
  }
  // Builds the durable tree in a sibling directory, then swaps it in.
  Status PlRebuild() {
    namespace fs = std::filesystem;
    if (!pl_->error.ok()) return pl_->error;
    std::error_code ec;
    const fs::path root = pl_->root;
    // Where the nodes whose durable state is their present one are now.
    std::map<uint64_t, fs::path> now{{pl_->root_node, root}};
    for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
      struct stat st {};
      if (::lstat(it->path().c_str(), &st) != 0) continue;
      auto n = pl_->node_of.find(KeyOf(st));
      if (n != pl_->node_of.end()) now.emplace(n->second, it->path());
    }
    if (ec) return PlFsError(ec, "walking " + root.string());
    const fs::path out = root.string() + ".powerloss";
    fs::remove_all(out, ec);
    if (!fs::create_directory(out, ec)) return PlFsError(ec, "creating " + out.string());
    std::map<uint64_t, fs::path> made;
    Status built = PlBuild(pl_->root_node, out, now, &made);
    if (!built.ok()) {
      fs::remove_all(out, ec);
      return built;
    }
    for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
      fs::remove_all(e.path(), ec);
      if (ec) return PlFsError(ec, "clearing " + e.path().string());
    }
    for (const fs::directory_entry& e : fs::directory_iterator(out, ec)) {
      fs::rename(e.path(), root / e.path().filename(), ec);
      if (ec) return PlFsError(ec, "moving " + e.path().string());
    }
    fs::remove(out, ec);
    return Status::Ok();
  }
  // Writes directory node `dir`'s durable entries into `out`, recursively.
  Status PlBuild(uint64_t dir, const std::filesystem::path& out, const std::map<uint64_t, std::filesystem::path>& now,
                 std::map<uint64_t, std::filesystem::path>* made) {
    namespace fs = std::filesystem;
    auto present = [&](uint64_t id) -> Result<fs::path> {
      auto it = now.find(id);
      if (it == now.end()) return Status::Error(EIO, "power-loss model lost track of node " + std::to_string(id));
      return it->second;
    };
    std::map<std::string, uint64_t> entries;
    if (pl_->nodes[dir].tracked) {
      entries = pl_->nodes[dir].entries;
    } else {
      ASSIGN_OR_RETURN(fs::path where, present(dir));
      ASSIGN_OR_RETURN(UniqueFd fd, base_->OpenAt(AT_FDCWD, where.string(), O_RDONLY | O_DIRECTORY));
      ASSIGN_OR_RETURN(entries, PlListing(fd.get()));
    }
    for (const auto& [name, id] : entries) {
      const PlNode node = pl_->nodes[id];
      const fs::path path = out / name;
      const mode_t perms = node.mode & 07777;
      std::error_code ec;
      if (S_ISDIR(node.mode)) {
        if (made->count(id)) continue;  // directories have one name
        if (!fs::create_directory(path, ec)) return PlFsError(ec, "mkdir " + path.string());
        (*made)[id] = path;
        RETURN_IF_ERROR(PlBuild(id, path, now, made));
        ::chmod(path.c_str(), perms);
      } else if (S_ISREG(node.mode)) {
        if (auto m = made->find(id); m != made->end()) {
          fs::create_hard_link(m->second, path, ec);
          if (ec) return PlFsError(ec, "link " + path.string());
          continue;
        }
        std::vector<uint8_t> data = node.data;
        if (!node.tracked) {
          ASSIGN_OR_RETURN(fs::path where, present(id));
          ASSIGN_OR_RETURN(UniqueFd fd, base_->OpenAt(AT_FDCWD, where.string(), O_PATH | O_NOFOLLOW));
          ASSIGN_OR_RETURN(data, PlContent(fd.get()));
        }
        ASSIGN_OR_RETURN(UniqueFd fd, base_->OpenAt(AT_FDCWD, path.string(), O_CREAT | O_EXCL | O_WRONLY, perms));
        RETURN_IF_ERROR(base_->PWriteAll(fd.get(), data, 0));
        ::fchmod(fd.get(), perms);
        (*made)[id] = path;
      } else if (S_ISLNK(node.mode)) {
        std::string target = node.target;
        if (!node.tracked) {
          ASSIGN_OR_RETURN(fs::path where, present(id));
          ASSIGN_OR_RETURN(target, base_->ReadlinkAt(AT_FDCWD, where.string()));
        }
        fs::create_symlink(target, path, ec);
        if (ec) return PlFsError(ec, "symlink " + path.string());
      } else {
        RETURN_IF_ERROR(base_->MknodAt(AT_FDCWD, path.string(), node.mode, 0));
      }
    }
    return Status::Ok();
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
  std::atomic<uint64_t> wall_time_ns_{0};
  // Power loss: enable it before the Env is shared between threads.
  std::atomic<bool> pl_on_{false};
  std::mutex pl_mu_;  // held by mutating calls while pl_on_; guards pl_
  std::unique_ptr<PlState> pl_;
};

}  // namespace ckptfs
