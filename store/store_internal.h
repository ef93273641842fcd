// Helpers shared by store.cc, recovery.cc and fsck.cc. Not part of the
// public interface.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <unordered_set>

#include "base/status.h"
#include "base/unique_fd.h"
#include "base/env.h"
#include "store/object_id.h"

namespace ckptfs::internal {

inline constexpr char kSuperblockName[] = "CKPTFS";
inline constexpr char kSuperblockTmpName[] = "CKPTFS.tmp";  // WriteFileAtomically's NAME.tmp
inline constexpr char kLockName[] = "LOCK";
inline constexpr char kPackSuffix[] = ".pack";
inline constexpr char kStagingSuffix[] = ".stage";
inline constexpr char kTmpPackSuffix[] = ".pack.tmp";

inline std::string PackFileName(ObjectId id) { return ObjectIdHex(id) + kPackSuffix; }
inline std::string PackDirName(ObjectId id) { return ObjectIdHex(id).substr(0, 2); }
inline std::string StagingFileName(ObjectId id) { return ObjectIdHex(id) + kStagingSuffix; }

// "0123456789abcdef.pack" -> id, when `name` is exactly <hex id><suffix>.
inline std::optional<ObjectId> ParseObjectFileName(const std::string& name, const std::string& suffix) {
  if (name.size() != 16 + suffix.size() || name.compare(16, suffix.size(), suffix) != 0) return std::nullopt;
  return ParseObjectIdHex(name.substr(0, 16));
}

struct Superblock {
  int version = 0;
  uint32_t chunk_size = 0;
  bool shared = false;  // version 2: served by several nodes (cluster mode)
  // "packs": where packs live, "dir" (also when absent) or "rados:POOL";
  // "rados_namespace": the store's RADOS namespace in that pool.
  std::string packs = "dir";
  std::string rados_namespace;
};

// Writes BACKING/CKPTFS (tmp + fsync + rename + dir fsync); a shared store,
// or one with packs in RADOS, is version 2.
Status WriteSuperblock(Env* env, int root_fd, const std::string& backing, const Superblock& sb);

// One single-node daemon per store: flock on LOCK (EBUSY naming the pid
// when another process holds it).
Result<UniqueFd> TakeLock(Env* env, int root_fd, const std::string& backing);

// Reads and validates BACKING/CKPTFS. A missing file keeps code ENOENT.
Result<Superblock> ReadSuperblock(Env* env, int root_fd, const std::string& store_path);

// Called for each regular file under the walked directory. `stub_fd` is
// -1 when the file could not be opened; `open_status` then says why. A
// subdirectory that cannot be opened or listed is reported the same way,
// with its path ending in '/', and skipped.
using TreeVisitor = std::function<Status(const std::string& path, int stub_fd, const Status& open_status)>;

// Depth-first walk of regular files below `dirfd`, never following
// symlinks. Stubs are opened O_RDWR (O_RDONLY if that is refused). Each
// inode is visited once even when hard-linked (`seen` holds inode numbers).
// Paths are `prefix`-relative ("a/b"). Stops at the first visitor error, or
// when `dirfd` itself cannot be listed.
Status WalkTree(Env* env, int dirfd, const std::string& prefix, const TreeVisitor& fn, std::unordered_set<ino_t>* seen);

}  // namespace ckptfs::internal
