// Store: the backing directory. Layout (docs/FORMAT.md, "Store layout"):
//   BACKING/CKPTFS        superblock: JSON with format name and version
//   BACKING/LOCK          flock'd by the one daemon that serves the store
//   BACKING/ns/           namespace mirror: dirs, symlinks, stubs (store/stub.h)
//   BACKING/packs/XX/ID.pack   sealed file versions, XX = first 2 hex digits of ID
//   BACKING/staging/ID.stage   bytes of files being written (plain sparse files)
//   BACKING/tmp/          packs being written; emptied by recovery
// Publishing a pack: write tmp/ID.pack.tmp, fdatasync, rename into packs/XX/,
// fsync packs/XX/. A stub is switched to the pack only after that.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"
#include "codec/chunk_codec.h"
#include "store/env.h"
#include "store/object_id.h"
#include "store/pack.h"
#include "store/stub.h"

namespace ckptfs {

inline constexpr int kStoreFormatVersion = 1;

struct StoreOptions {
  bool create_if_missing = true;  // initialise an empty (or absent) directory
  bool take_lock = true;          // false for read-only tools (stats, fsck)
  uint32_t chunk_size = kDefaultChunkSize;
  ChunkEncoderOptions encoder;
};

struct RecoveryReport {
  uint64_t stubs_scanned = 0;
  uint64_t staged_resealed = 0;    // STAGED stubs whose staging file was sealed
  uint64_t tmp_files_removed = 0;  // unpublished packs from an interrupted seal
  uint64_t orphan_packs_removed = 0;
  uint64_t orphan_staging_removed = 0;
  uint64_t broken_stubs = 0;         // unreadable stubs (left in place, fsck reports)
  std::vector<std::string> actions;  // one human line per thing done
};

struct FsckReport {
  uint64_t files_checked = 0;
  uint64_t packs_checked = 0;
  uint64_t chunks_checked = 0;
  uint64_t bytes_checked = 0;
  std::vector<std::string> errors;    // each names the path and what is wrong
  std::vector<std::string> warnings;  // not corruption (e.g. orphan packs)
  bool clean() const { return errors.empty(); }
};

struct FileUsage {
  std::string path;  // relative to the namespace root
  uint64_t logical = 0;
  uint64_t stored = 0;
  bool staged = false;
};

class Store {
 public:
  static Result<std::unique_ptr<Store>> Open(Env* env, const std::string& backing, const StoreOptions& opts);

  Env* env() const { return env_; }
  const std::string& path() const { return path_; }
  const StoreOptions& options() const { return opts_; }
  int ns_fd() const { return ns_.get(); }
  // Writes this process's pid into LOCK (after the daemon forks).
  Status RecordOwnerPid();

  // --- packs ---
  // Encodes [0,size) of src_fd and publishes it as a new pack.
  Result<ObjectId> PublishPack(int src_fd, uint64_t size, const std::atomic<bool>* cancel = nullptr);
  Result<std::shared_ptr<PackReader>> OpenPack(ObjectId id);
  Status DeletePack(ObjectId id);  // missing is fine
  Result<uint64_t> PackFileSize(ObjectId id);

  // --- staging ---
  Result<UniqueFd> CreateStaging(ObjectId* id);  // new empty file, O_RDWR
  Result<UniqueFd> OpenStaging(ObjectId id);
  Status DeleteStaging(ObjectId id);  // missing is fine
  Status SyncStagingDir();

  // --- whole-file transitions on a stub (caller serialises per stub) ---
  // Seals a STAGED stub: pack from the staging file, stub -> SEALED (fsync'd,
  // mtime taken from the staging file), staging file deleted. (The pack a
  // file had before it was staged was released when it was staged.)
  // `still_current` is asked right before the stub is switched; returning
  // false abandons the new pack (the file changed meanwhile).
  Result<StubRecord> SealStub(int stub_fd, const StubRecord& staged, int staging_fd,
                              const std::function<bool()>& still_current = {});
  // Deletes the objects a stub refers to (after its last link is gone).
  Status ReleaseStubObjects(const StubRecord& rec);

  // --- maintenance ---
  // Completes or rolls back interrupted work: clears tmp/, seals STAGED
  // stubs, deletes packs and staging files no stub refers to.
  Result<RecoveryReport> Recover();
  Result<FsckReport> Fsck();
  Result<std::vector<FileUsage>> Usage(const std::string& subpath = "");

 private:
  Store(Env* env, std::string path, StoreOptions opts) : env_(env), path_(std::move(path)), opts_(opts) {}
  Status InitLayout();
  Result<UniqueFd> PackDir(ObjectId id, bool create);
  // Visits every stub under ns/ (depth-first); path is relative to ns/.
  Status WalkStubs(const std::function<Status(const std::string& path, int stub_fd)>& fn);

  Env* env_;
  std::string path_;
  StoreOptions opts_;
  UniqueFd root_, ns_, packs_, staging_, tmp_, lock_;
};

}  // namespace ckptfs
