// The mounted filesystem: the low-level libfuse operations over a Store.
// See docs/ARCHITECTURE.md for the write, read and seal paths and
// docs/SEMANTICS.md for what applications can rely on.
#pragma once

#include <fuse_lowlevel.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "base/metrics_text.h"
#include "cache/chunk_cache.h"
#include "cache/decode_ahead.h"
#include "fuse/deferred_ops.h"
#include "fuse/fd_cache.h"
#include "fuse/inode.h"
#include "fuse/page_push.h"
#include "fuse/seal_queue.h"
#include "store/store.h"

namespace ckptfs {

struct FsConfig {
  double attr_timeout = 1.0;
  double entry_timeout = 1.0;
  uint64_t cache_bytes = 128ull << 20;
  // Threads decoding chunks ahead of sequential readers (0: none; -1: one per core).
  int decode_threads = -1;
  int seal_threads = 1;
  bool writeback_cache = false;
  // Evicted, unread pages go to the kernel's page cache (PagePush). The
  // requests that must wait for pushes in flight wait on a thread of their
  // own (DeferredOps), never on a FUSE thread.
  bool page_push = true;
  // Below 1 MiB so that a request fits a pipe without CAP_SYS_RESOURCE;
  // otherwise libfuse 3.14 stops splicing for good.
  uint32_t max_write = 512u << 10;
  bool chown_new_files = true;  // daemon is root: hand new files to the caller
  // The descriptors the daemon may hold (docs/SEMANTICS.md "File
  // descriptors"); the fd cache keeps those of idle files within it,
  // leaving FdReserve(max_fds) for everything else. 0: kDefaultMaxFds.
  uint64_t max_fds = 0;
};

// max_fds when none is configured (the mount command derives one from
// RLIMIT_NOFILE instead: DefaultMaxFds).
inline constexpr uint64_t kDefaultMaxFds = 1024;
inline constexpr uint64_t kMinMaxFds = 64;
// The fds max_fds leaves outside the fd cache: the store's directories, the
// log, /dev/fuse and the FUSE threads' pipes, the packs of open files and
// the fds of requests in flight.
inline uint64_t FdReserve(uint64_t max_fds) { return std::min<uint64_t>(256, max_fds / 2); }
// The max_fds a soft RLIMIT_NOFILE of `limit` allows: an eighth (at least
// 64) stays free, for what the daemon opens outside its own count.
inline uint64_t DefaultMaxFds(uint64_t limit) {
  const uint64_t headroom = std::max<uint64_t>(64, limit / 8);
  return std::max(kMinMaxFds, limit > headroom ? limit - headroom : 0);
}

class Filesystem {
 public:
  // Opens the store's ns/ as the root of the mount.
  static Result<std::unique_ptr<Filesystem>> Open(Store* store, const FsConfig& cfg);

  static const fuse_lowlevel_ops& Ops();

  Store* store() { return store_; }
  ChunkCache& cache() { return cache_; }
  DecodeAhead& decode_ahead() { return decode_ahead_; }
  InodeTable& inodes() { return inodes_; }
  FdCache& fds() { return fds_; }
  PagePush& page_push() { return page_push_; }
  DeferredOps& deferred() { return deferred_; }
  SealQueue& seals() { return seals_; }
  const FsConfig& config() const { return cfg_; }

  // The file's content, loading its stub on first use.
  Result<std::shared_ptr<FileContent>> ContentOf(Inode& inode);
  // stat of the backing entry, with size/blocks/mtime of the content.
  Status Stat(Inode& inode, struct stat* st);
  // After an unlink or a rename that may have dropped `victim`'s last link.
  void ForgetLinkIfGone(Inode* victim);
  // The figures of `-o metrics` and `ckptfs top` (base/metrics_text.h), now.
  MetricsSample SampleMetrics();

  // `fn` runs once, on the first request after INIT: the kernel applies
  // INIT's reply (e.g. readahead) only then, so tuning must come after.
  void SetAfterInit(std::function<void()> fn) { after_init_ = std::move(fn); }
  void RunAfterInitOnce() {
    std::call_once(after_init_once_, [this] {
      if (after_init_) after_init_();
    });
  }

 private:
  Filesystem(Store* store, const FsConfig& cfg, UniqueFd ns_root, const struct stat& ns_root_st);

  Store* store_;
  FsConfig cfg_;
  // Before everything that holds a Slot (inodes and their contents, which
  // the seal queue, page pushes and handles may keep).
  FdCache fds_;
  // Before cache_: the cache's evictions (decode-ahead's threads among
  // them) reach it until they stop. Its own thread stops before inodes_
  // goes (FuseMount stops it).
  PagePush page_push_;
  ChunkCache cache_;
  DecodeAhead decode_ahead_;  // after cache_: its threads stop before the cache goes
  InodeTable inodes_;
  SealQueue seals_;
  // Last: a request it cancels undoes its open in inodes_, page_push_ and
  // seals_. Its thread stops after PagePush's (FuseMount stops both).
  DeferredOps deferred_;
  std::function<void()> after_init_;
  std::once_flag after_init_once_;
};

}  // namespace ckptfs
