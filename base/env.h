// Env: every system call that touches the backing store goes through here,
// so tests can inject ENOSPC, EIO, short writes or a "crash" at any call
// (see tests/unit/fault_env.h). Modelled on LevelDB's Env, but fd-based: ckptfs
// works with *at() calls relative to directory fds it holds open.
#pragma once

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace ckptfs {

struct DirEntry {
  std::string name;
  unsigned char type;  // DT_* from dirent
  ino_t ino;
};

class Env {
 public:
  virtual ~Env() = default;
  // The process-wide POSIX implementation.
  static Env* Default();

  virtual Result<UniqueFd> OpenAt(int dirfd, const std::string& path, int flags, mode_t mode = 0) = 0;
  // Returns the bytes read; fewer than asked only at end of file.
  virtual Result<size_t> PRead(int fd, std::span<uint8_t> buf, uint64_t off) = 0;
  // May write fewer bytes than asked, like pwrite(2). Prefer PWriteAll.
  virtual Result<size_t> PWrite(int fd, std::span<const uint8_t> buf, uint64_t off) = 0;
  virtual Status Fsync(int fd) = 0;
  virtual Status Fdatasync(int fd) = 0;
  // syncfs(2): everything on fd's file system is durable once it returns,
  // namespace changes in any directory included.
  virtual Status SyncFs(int fd) = 0;
  virtual Status Ftruncate(int fd, uint64_t size) = 0;
  virtual Result<struct stat> Fstat(int fd) = 0;
  virtual Result<struct stat> FstatAt(int dirfd, const std::string& path, int flags) = 0;
  virtual Status Futimens(int fd, const struct timespec times[2]) = 0;
  virtual Status RenameAt(int olddir, const std::string& oldname, int newdir, const std::string& newname,
                          unsigned flags = 0) = 0;
  virtual Status UnlinkAt(int dirfd, const std::string& path, int flags = 0) = 0;
  virtual Status MkdirAt(int dirfd, const std::string& path, mode_t mode) = 0;
  virtual Status SymlinkAt(const std::string& target, int dirfd, const std::string& path) = 0;
  virtual Result<std::string> ReadlinkAt(int dirfd, const std::string& path) = 0;
  virtual Status LinkAt(int olddir, const std::string& oldpath, int newdir, const std::string& newpath, int flags) = 0;
  virtual Status MknodAt(int dirfd, const std::string& path, mode_t mode, dev_t dev) = 0;
  virtual Status FchmodAt(int dirfd, const std::string& path, mode_t mode, int flags) = 0;
  virtual Status FchownAt(int dirfd, const std::string& path, uid_t uid, gid_t gid, int flags) = 0;
  virtual Status UtimensAt(int dirfd, const std::string& path, const struct timespec times[2], int flags) = 0;
  virtual Result<std::vector<DirEntry>> ListDir(int dirfd) = 0;
  virtual Result<struct statvfs> Fstatvfs(int fd) = 0;
  // flock(2) on an open file; with LOCK_NB a lock held elsewhere is EWOULDBLOCK.
  virtual Status Flock(int fd, int operation) = 0;
  // posix_fadvise(2). Advice only: callers may ignore a failure.
  virtual Status Fadvise(int fd, uint64_t off, uint64_t len, int advice) = 0;
  // sync_file_range(2): starts (and with SYNC_FILE_RANGE_WAIT_* waits for)
  // writeback of a range. Not a durability point (no metadata, no device
  // flush): only Fsync/Fdatasync are. Used to keep long writes from filling
  // the page cache (store/write_behind.h).
  virtual Status SyncFileRange(int fd, uint64_t off, uint64_t len, unsigned flags) = 0;
  // lseek(2) with SEEK_DATA: where the first byte of data at or after `off`
  // is, or UINT64_MAX when only a hole follows (ENXIO), so that a seal
  // skips a sparse file's holes instead of reading their zeros. A file
  // system without SEEK_DATA reports data everywhere, as this default does.
  virtual Result<uint64_t> SeekData(int fd, uint64_t off) {
    (void)fd;
    return off;
  }
  // Wall-clock time (CLOCK_REALTIME) in nanoseconds since the epoch, for
  // timestamps that are stored.
  virtual uint64_t WallTimeNs() = 0;
  // Extended attributes by path (use "/proc/self/fd/N" for fd-held inodes).
  virtual Status SetXattr(const std::string& path, const std::string& name, std::span<const uint8_t> value,
                          int flags) = 0;
  // size == 0 queries the length, like getxattr(2).
  virtual Result<size_t> GetXattr(const std::string& path, const std::string& name, std::span<uint8_t> out) = 0;
  virtual Result<size_t> ListXattr(const std::string& path, std::span<char> out) = 0;
  virtual Status RemoveXattr(const std::string& path, const std::string& name) = 0;
  // name_to_handle_at(2): an opaque handle naming the inode at `path`
  // (AT_EMPTY_PATH: dirfd's own) on its file system for as long as the
  // inode lives, whatever its names become. EOPNOTSUPP where the file
  // system has none.
  virtual Result<std::string> NameToHandleAt(int dirfd, const std::string& path, int flags) = 0;
  // open_by_handle_at(2): opens what `handle` names; mount_fd is any fd on
  // its file system. Needs CAP_DAC_READ_SEARCH (EPERM without it); ESTALE
  // once the inode is gone.
  virtual Result<UniqueFd> OpenByHandleAt(int mount_fd, const std::string& handle, int flags) = 0;

  // Loops over PWrite until all of `buf` is written; a zero-byte write is ENOSPC.
  Status PWriteAll(int fd, std::span<const uint8_t> buf, uint64_t off);
  // Reads exactly buf.size() bytes or fails with EIO ("short read").
  Status PReadExact(int fd, std::span<uint8_t> buf, uint64_t off);
};

// Descriptors are a process-wide resource. When an open fails with EMFILE
// or ENFILE, the POSIX Env asks every registered relief (fuse/fd_cache.h)
// to close descriptors it keeps only as a cache, and retries while one
// closed some: a full table is no error while an idle descriptor can go.
// A relief returns how many it closed; it must not open anything.
class FdRelief {
 public:
  explicit FdRelief(std::function<size_t()> relieve);
  ~FdRelief();
  FdRelief(const FdRelief&) = delete;
  FdRelief& operator=(const FdRelief&) = delete;
  // Runs the registered reliefs; the number of descriptors they closed.
  static size_t RelieveAll();

 private:
  std::function<size_t()> relieve_;
};

// How far a write must reach before the call returns.
enum class Durability {
  kNone,         // the page cache only: lost on power failure (caches, tests)
  kData,         // the file's bytes are on disk (fdatasync); its name may not be
  kDataAndName,  // the bytes and the directory entry (fsync of the parent): survives power loss
};

// The whole of `name` under `dir_fd` (or of an open `fd`), at most
// `max_bytes`. A larger file fails with EFBIG: every file read this way has
// a small size ckptfs knows, so a larger one is damage or a planted file,
// not something to allocate for.
Result<std::string> ReadFileToString(Env* env, int dir_fd, const std::string& name, size_t max_bytes);
Result<std::string> ReadFdToString(Env* env, int fd, size_t max_bytes);

// Creates (or truncates) `name` under `dir_fd` and writes `data`, synced
// as `durability` says (with kDataAndName the directory is synced after).
// A reader may see it partly written: for files published some other way
// (link(2) into place, a later rename).
Status WriteNewFile(Env* env, int dir_fd, const std::string& name, std::string_view data, mode_t mode,
                    Durability durability);

// Replaces `name` under `dir_fd` so that a reader sees the old file or the
// new one whole: `tmp_name` (NAME.tmp when empty; writers on several nodes
// give each their own) is written, synced as `durability` says, and renamed
// over NAME (with kDataAndName the directory is synced after).
Status WriteFileAtomically(Env* env, int dir_fd, const std::string& name, std::string_view data, mode_t mode,
                           Durability durability, const std::string& tmp_name = {});

// Opens directory `name` under `parent`, making it first when missing.
// With kDataAndName a directory made here has its entry synced into
// `parent`, so a crash cannot lose it while something inside is durable.
Result<UniqueFd> EnsureDir(Env* env, int parent, const std::string& name, mode_t mode, Durability durability);

// "/proc/self/fd/N": reaches an O_PATH fd's inode through path-based calls.
std::string ProcFdPath(int fd);
// Where fd currently lives, for messages: readlink of ProcFdPath(fd).
std::string FdPathForLog(int fd);

}  // namespace ckptfs
