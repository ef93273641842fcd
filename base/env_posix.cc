// PosixEnv: thin wrappers over the *at() system calls. Every failure names
// the operation and the path (resolved through /proc/self/fd on the error
// path only), so a log line says what failed where without a debugger.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "base/env.h"

namespace ckptfs {
namespace {

// Best-effort name of an fd for error messages (FdPathForLog: its path).
std::string FdName(int fd) { return fd == AT_FDCWD ? "." : FdPathForLog(fd); }

// "dir/path" for messages; the dir part is only resolved when needed.
std::string AtName(int dirfd, const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  if (dirfd == AT_FDCWD) return path;
  std::string dir = FdName(dirfd);
  if (path.empty()) return dir;
  return dir + "/" + path;
}

Status ErrAt(const char* op, int dirfd, const std::string& path) {
  int err = errno;
  return Status::FromErrno(err, std::string(op) + " " + AtName(dirfd, path));
}

Status ErrFd(const char* op, int fd) {
  int err = errno;
  return Status::FromErrno(err, std::string(op) + " " + FdName(fd));
}

Status ErrPath(const char* op, const std::string& path) {
  int err = errno;
  return Status::FromErrno(err, std::string(op) + " " + path);
}

// Retries a syscall interrupted by a signal (FUSE threads get them).
template <typename F>
auto RetryEintr(F&& f) -> decltype(f()) {
  decltype(f()) r;
  do {
    r = f();
  } while (r == -1 && errno == EINTR);
  return r;
}

// The registered reliefs (FdRelief), process-wide like the fd table.
std::mutex relief_mu;
std::vector<const std::function<size_t()>*>& Reliefs() {
  static std::vector<const std::function<size_t()>*> reliefs;
  return reliefs;
}

// Runs `open` (returning an fd or -1 with errno); a full fd table
// (EMFILE, or the system's: ENFILE) is retried while reliefs close idle
// descriptors, a bounded number of times.
template <typename F>
int OpenRelieved(F&& open) {
  for (int tries = 0;; ++tries) {
    const int fd = RetryEintr(open);
    if (fd >= 0 || (errno != EMFILE && errno != ENFILE) || tries == 16) return fd;
    const int err = errno;
    if (FdRelief::RelieveAll() == 0) {
      errno = err;
      return fd;
    }
  }
}

class PosixEnv final : public Env {
 public:
  Result<UniqueFd> OpenAt(int dirfd, const std::string& path, int flags, mode_t mode) override {
    int fd = OpenRelieved([&] { return ::openat(dirfd, path.c_str(), flags | O_CLOEXEC, mode); });
    if (fd < 0) return ErrAt("open", dirfd, path);
    return UniqueFd(fd);
  }

  Result<std::string> NameToHandleAt(int dirfd, const std::string& path, int flags) override;
  Result<UniqueFd> OpenByHandleAt(int mount_fd, const std::string& handle, int flags) override;

  Result<size_t> PRead(int fd, std::span<uint8_t> buf, uint64_t off) override {
    size_t done = 0;
    while (done < buf.size()) {
      ssize_t n = RetryEintr([&] { return ::pread(fd, buf.data() + done, buf.size() - done, off + done); });
      if (n < 0) return ErrFd("pread", fd);
      if (n == 0) break;  // end of file
      done += static_cast<size_t>(n);
    }
    return done;
  }

  Result<size_t> PWrite(int fd, std::span<const uint8_t> buf, uint64_t off) override {
    ssize_t n = RetryEintr([&] { return ::pwrite(fd, buf.data(), buf.size(), off); });
    if (n < 0) return ErrFd("pwrite", fd);
    return static_cast<size_t>(n);
  }

  Status Fsync(int fd) override {
    if (RetryEintr([&] { return ::fsync(fd); }) != 0) return ErrFd("fsync", fd);
    return Status::Ok();
  }

  Status Fdatasync(int fd) override {
    if (RetryEintr([&] { return ::fdatasync(fd); }) != 0) return ErrFd("fdatasync", fd);
    return Status::Ok();
  }

  Status SyncFs(int fd) override {
    if (::syncfs(fd) != 0) return ErrFd("syncfs", fd);
    return Status::Ok();
  }

  Status Ftruncate(int fd, uint64_t size) override {
    if (RetryEintr([&] { return ::ftruncate(fd, static_cast<off_t>(size)); }) != 0) return ErrFd("ftruncate", fd);
    return Status::Ok();
  }

  Result<struct stat> Fstat(int fd) override {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return ErrFd("fstat", fd);
    return st;
  }

  Result<struct stat> FstatAt(int dirfd, const std::string& path, int flags) override {
    struct stat st {};
    if (::fstatat(dirfd, path.c_str(), &st, flags) != 0) return ErrAt("stat", dirfd, path);
    return st;
  }

  Status Futimens(int fd, const struct timespec times[2]) override {
    if (::futimens(fd, times) != 0) return ErrFd("futimens", fd);
    return Status::Ok();
  }

  Status RenameAt(int olddir, const std::string& oldname, int newdir, const std::string& newname,
                  unsigned flags) override {
    int r = flags == 0 ? ::renameat(olddir, oldname.c_str(), newdir, newname.c_str())
                       : ::renameat2(olddir, oldname.c_str(), newdir, newname.c_str(), flags);
    if (r != 0) {
      int err = errno;
      return Status::FromErrno(err, "rename " + AtName(olddir, oldname) + " -> " + AtName(newdir, newname));
    }
    return Status::Ok();
  }

  Status UnlinkAt(int dirfd, const std::string& path, int flags) override {
    if (::unlinkat(dirfd, path.c_str(), flags) != 0) {
      return ErrAt((flags & AT_REMOVEDIR) ? "rmdir" : "unlink", dirfd, path);
    }
    return Status::Ok();
  }

  Status MkdirAt(int dirfd, const std::string& path, mode_t mode) override {
    if (::mkdirat(dirfd, path.c_str(), mode) != 0) return ErrAt("mkdir", dirfd, path);
    return Status::Ok();
  }

  Status SymlinkAt(const std::string& target, int dirfd, const std::string& path) override {
    if (::symlinkat(target.c_str(), dirfd, path.c_str()) != 0) return ErrAt("symlink", dirfd, path);
    return Status::Ok();
  }

  Result<std::string> ReadlinkAt(int dirfd, const std::string& path) override {
    // Grow until the target fits: readlink truncates silently.
    std::vector<char> buf(256);
    for (;;) {
      ssize_t n = ::readlinkat(dirfd, path.c_str(), buf.data(), buf.size());
      if (n < 0) return ErrAt("readlink", dirfd, path);
      if (static_cast<size_t>(n) < buf.size()) return std::string(buf.data(), static_cast<size_t>(n));
      buf.resize(buf.size() * 2);
    }
  }

  Status LinkAt(int olddir, const std::string& oldpath, int newdir, const std::string& newpath, int flags) override {
    if (::linkat(olddir, oldpath.c_str(), newdir, newpath.c_str(), flags) != 0) {
      int err = errno;
      return Status::FromErrno(err, "link " + AtName(olddir, oldpath) + " -> " + AtName(newdir, newpath));
    }
    return Status::Ok();
  }

  Status MknodAt(int dirfd, const std::string& path, mode_t mode, dev_t dev) override {
    if (::mknodat(dirfd, path.c_str(), mode, dev) != 0) return ErrAt("mknod", dirfd, path);
    return Status::Ok();
  }

  Status FchmodAt(int dirfd, const std::string& path, mode_t mode, int flags) override {
    if (::fchmodat(dirfd, path.c_str(), mode, flags) != 0) return ErrAt("chmod", dirfd, path);
    return Status::Ok();
  }

  Status FchownAt(int dirfd, const std::string& path, uid_t uid, gid_t gid, int flags) override {
    if (::fchownat(dirfd, path.c_str(), uid, gid, flags) != 0) return ErrAt("chown", dirfd, path);
    return Status::Ok();
  }

  Status UtimensAt(int dirfd, const std::string& path, const struct timespec times[2], int flags) override {
    if (::utimensat(dirfd, path.c_str(), times, flags) != 0) return ErrAt("utimens", dirfd, path);
    return Status::Ok();
  }

  Result<std::vector<DirEntry>> ListDir(int dirfd) override;

  Result<struct statvfs> Fstatvfs(int fd) override {
    struct statvfs sv {};
    if (RetryEintr([&] { return ::fstatvfs(fd, &sv); }) != 0) return ErrFd("statvfs", fd);
    return sv;
  }

  Status Flock(int fd, int operation) override {
    if (RetryEintr([&] { return ::flock(fd, operation); }) != 0) return ErrFd("flock", fd);
    return Status::Ok();
  }

  Status Fadvise(int fd, uint64_t off, uint64_t len, int advice) override {
    // Returns the error number instead of setting errno.
    const int err = ::posix_fadvise(fd, static_cast<off_t>(off), static_cast<off_t>(len), advice);
    if (err != 0) return Status::FromErrno(err, "fadvise " + FdName(fd));
    return Status::Ok();
  }

  Result<uint64_t> SeekData(int fd, uint64_t off) override {
    if (off > static_cast<uint64_t>(INT64_MAX)) return uint64_t{UINT64_MAX};
    const off_t at = ::lseek(fd, static_cast<off_t>(off), SEEK_DATA);
    if (at >= 0) return static_cast<uint64_t>(at);
    if (errno == ENXIO) return uint64_t{UINT64_MAX};  // a hole up to the end
    // No SEEK_DATA here (EINVAL): data everywhere, read as before.
    if (errno == EINVAL || errno == EOPNOTSUPP) return off;
    return ErrFd("lseek SEEK_DATA", fd);
  }

  Status SyncFileRange(int fd, uint64_t off, uint64_t len, unsigned flags) override {
    if (RetryEintr(
            [&] { return ::sync_file_range(fd, static_cast<off64_t>(off), static_cast<off64_t>(len), flags); }) != 0)
      return ErrFd("sync_file_range", fd);
    return Status::Ok();
  }

  uint64_t WallTimeNs() override {
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    return static_cast<uint64_t>(now.tv_sec) * 1000000000ull + static_cast<uint64_t>(now.tv_nsec);
  }

  Status SetXattr(const std::string& path, const std::string& name, std::span<const uint8_t> value,
                  int flags) override {
    if (::setxattr(path.c_str(), name.c_str(), value.data(), value.size(), flags) != 0) {
      return ErrPath(("setxattr " + name + " on").c_str(), path);
    }
    return Status::Ok();
  }

  Result<size_t> GetXattr(const std::string& path, const std::string& name, std::span<uint8_t> out) override {
    ssize_t n = ::getxattr(path.c_str(), name.c_str(), out.data(), out.size());
    if (n < 0) return ErrPath(("getxattr " + name + " on").c_str(), path);
    return static_cast<size_t>(n);
  }

  Result<size_t> ListXattr(const std::string& path, std::span<char> out) override {
    ssize_t n = ::listxattr(path.c_str(), out.data(), out.size());
    if (n < 0) return ErrPath("listxattr", path);
    return static_cast<size_t>(n);
  }

  Status RemoveXattr(const std::string& path, const std::string& name) override {
    if (::removexattr(path.c_str(), name.c_str()) != 0) return ErrPath(("removexattr " + name + " on").c_str(), path);
    return Status::Ok();
  }
};

// Lists through a private open file description: the caller's fd keeps its
// offset, and two threads listing the same directory fd cannot interleave
// getdents. openat(".") also works on O_PATH fds, which fdopendir cannot use;
// dup() (shared offset, hence rewinddir) is the fallback when "." cannot be
// opened, e.g. without read permission on the directory.
// The handle is kept as its bytes: the struct file_handle header
// (handle_bytes, handle_type) followed by f_handle.
Result<std::string> PosixEnv::NameToHandleAt(int dirfd, const std::string& path, int flags) {
  union {
    file_handle fh;
    char room[sizeof(file_handle) + MAX_HANDLE_SZ];
  } buf{};
  buf.fh.handle_bytes = MAX_HANDLE_SZ;
  int mount_id = 0;
  if (::name_to_handle_at(dirfd, path.c_str(), &buf.fh, &mount_id, flags) != 0)
    return ErrAt("name_to_handle_at", dirfd, path);
  return std::string(buf.room, sizeof(file_handle) + buf.fh.handle_bytes);
}

Result<UniqueFd> PosixEnv::OpenByHandleAt(int mount_fd, const std::string& handle, int flags) {
  union {
    file_handle fh;
    char room[sizeof(file_handle) + MAX_HANDLE_SZ];
  } buf{};
  if (handle.size() < sizeof(file_handle) || handle.size() > sizeof(buf)) {
    return Status::Error(EINVAL, "open_by_handle_at: a malformed handle");
  }
  std::copy(handle.begin(), handle.end(), buf.room);
  if (buf.fh.handle_bytes != handle.size() - sizeof(file_handle)) {
    return Status::Error(EINVAL, "open_by_handle_at: a malformed handle");
  }
  int fd = OpenRelieved([&] { return ::open_by_handle_at(mount_fd, &buf.fh, flags | O_CLOEXEC); });
  if (fd < 0) return ErrFd("open_by_handle_at on", mount_fd);
  return UniqueFd(fd);
}

Result<std::vector<DirEntry>> PosixEnv::ListDir(int dirfd) {
  int fd = OpenRelieved([&] { return ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); });
  bool shared_offset = false;
  if (fd < 0) {
    fd = ::fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
    shared_offset = true;
    if (fd < 0) return ErrFd("opendir", dirfd);
  }
  DIR* dir = ::fdopendir(fd);
  if (dir == nullptr) {
    Status st = ErrFd("opendir", dirfd);
    ::close(fd);
    return st;
  }
  if (shared_offset) ::rewinddir(dir);
  std::vector<DirEntry> out;
  for (;;) {
    errno = 0;
    struct dirent* de = ::readdir(dir);
    if (de == nullptr) {
      if (errno != 0) {
        Status st = ErrFd("readdir", dirfd);
        ::closedir(dir);
        return st;
      }
      break;
    }
    std::string name = de->d_name;
    if (name == "." || name == "..") continue;
    out.push_back(DirEntry{std::move(name), de->d_type, de->d_ino});
  }
  ::closedir(dir);
  return out;
}

}  // namespace

FdRelief::FdRelief(std::function<size_t()> relieve) : relieve_(std::move(relieve)) {
  std::lock_guard lk(relief_mu);
  Reliefs().push_back(&relieve_);
}

FdRelief::~FdRelief() {
  std::lock_guard lk(relief_mu);
  std::erase(Reliefs(), &relieve_);
}

size_t FdRelief::RelieveAll() {
  std::lock_guard lk(relief_mu);
  size_t closed = 0;
  for (const auto* relieve : Reliefs()) closed += (*relieve)();
  return closed;
}

Env* Env::Default() {
  static PosixEnv* env = new PosixEnv();  // never destroyed: used from static destructors too
  return env;
}

Status Env::PWriteAll(int fd, std::span<const uint8_t> buf, uint64_t off) {
  while (!buf.empty()) {
    Result<size_t> n = PWrite(fd, buf, off);
    if (!n.ok()) return n.status();
    if (*n == 0) {
      return Status::FromErrno(ENOSPC, "pwrite " + FdName(fd) + " at offset " + std::to_string(off) + " wrote 0 bytes");
    }
    buf = buf.subspan(*n);
    off += *n;
  }
  return Status::Ok();
}

Status Env::PReadExact(int fd, std::span<uint8_t> buf, uint64_t off) {
  Result<size_t> n = PRead(fd, buf, off);
  if (!n.ok()) return n.status();
  if (*n != buf.size()) {
    return Status::Error(EIO, "short read from " + FdName(fd) + " at offset " + std::to_string(off) + ": got " +
                                  std::to_string(*n) + " of " + std::to_string(buf.size()) + " bytes");
  }
  return Status::Ok();
}

std::string ProcFdPath(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

}  // namespace ckptfs
