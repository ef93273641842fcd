// Keeps what the chunk cache evicts before a reader has read it: the pages
// of an evicted chunk that were never replied go into the kernel's page
// cache of the file (FUSE_NOTIFY_STORE), where the reader's later read finds
// them without asking the daemon, instead of the chunk being decoded again.
//
// torch.load reads a zip's records in an order that leaves the ends of many
// chunks for later (bench/history/2026-12-08-restore.md, "torch.load's read
// order"); with a
// 128 MiB cache a 1 GiB checkpoint had half its chunks decoded twice, and a
// delta's base chunks with them. The page cache is the kernel's: it is not
// in the daemon's memory, and the kernel may drop it under pressure (the
// read then comes to the daemon, which decodes the chunk again).
//
// Only a file's sealed content, while no handle can write it, is pushed
// (FileContent::BeginPagePush): pushed pages overwrite what the kernel
// holds. The pushes run on one thread of their own, because a push waits
// for the pages a read in flight has locked, which a FUSE thread must be
// free to reply to; for the same reason, the requests that wait for the
// pushes in flight wait off the FUSE threads (fuse/deferred_ops.h).
#pragma once

#include <fuse_lowlevel.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/chunk_cache.h"
#include "fuse/file_content.h"
#include "fuse/inode.h"

namespace ckptfs {

class PagePush {
 public:
  // enabled: false with the kernel's writeback cache, where pages may hold
  // bytes written and not yet sent to the daemon.
  PagePush(InodeTable* inodes, bool enabled) : inodes_(inodes), enabled_(enabled) {}
  ~PagePush() { Stop(); }
  PagePush(const PagePush&) = delete;
  PagePush& operator=(const PagePush&) = delete;

  // Starts the thread (after the daemon's fork, as DecodeAhead::Start).
  void Start(fuse_session* session);
  // Ends the thread and forgets the queue and the open files; before the
  // session goes.
  void Stop();

  // A handle on `inode`, whose content is `content`, was opened / released.
  void Opened(Inode& inode, std::shared_ptr<FileContent> content);
  void Released(Inode& inode);

  // ChunkCache::EvictUnread: queues the push, or drops it when the queue
  // holds kMaxQueuedBytes already (the evicted chunk stays alive until
  // pushed: this bounds the memory outside the cache). Never blocks.
  void Offer(const ChunkKey& key, ChunkBytes bytes, std::vector<ChunkCache::Range> unread);

  static constexpr uint64_t kMaxQueuedBytes = 16ull << 20;

 private:
  struct Job {
    ChunkKey key;
    ChunkBytes bytes;
    std::vector<ChunkCache::Range> unread;
  };
  struct Open {
    std::shared_ptr<FileContent> content;
    int handles = 0;
  };
  void Work();
  void Push(const Job& job);

  InodeTable* const inodes_;
  const bool enabled_;
  fuse_session* session_ = nullptr;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Job> queue_;
  uint64_t queued_bytes_ = 0;
  bool running_ = false;
  std::thread worker_;
  std::mutex open_mu_;  // taken before a FileContent's mutex and InodeTable's, never after
  std::unordered_map<Inode*, Open> open_;
};

}  // namespace ckptfs
