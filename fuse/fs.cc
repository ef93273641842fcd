#include "fuse/fs.h"

#include <fcntl.h>

#include <algorithm>
#include <thread>

#include "base/log.h"

namespace ckptfs {

namespace {

// Whose file `fd` is, for the rate limit of the log lines it causes.
uint32_t OwnerOf(Env* env, int fd) {
  Result<struct stat> st = env->FstatAt(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
  return st.ok() ? st->st_uid : kLogAnyUid;
}

int DecodeThreads(int configured) {
  if (configured >= 0) return configured;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

size_t FdCacheCapacity(uint64_t max_fds) {
  const uint64_t bound = std::max(kMinMaxFds, max_fds == 0 ? kDefaultMaxFds : max_fds);
  return static_cast<size_t>(bound - FdReserve(bound));
}

}  // namespace

Result<std::unique_ptr<Filesystem>> Filesystem::Open(Store* store, const FsConfig& cfg) {
  Env* env = store->env();
  ASSIGN_OR_RETURN(UniqueFd root, env->OpenAt(store->ns_fd(), ".", O_PATH | O_DIRECTORY));
  Result<struct stat> st = env->Fstat(root.get());
  if (!st.ok()) return st.status().WithContext("cannot stat the root of the mount");
  return std::unique_ptr<Filesystem>(new Filesystem(store, cfg, std::move(root), *st));
}

Filesystem::Filesystem(Store* store, const FsConfig& cfg, UniqueFd ns_root, const struct stat& ns_root_st)
    : store_(store),
      cfg_(cfg),
      fds_(FdCacheCapacity(cfg.max_fds)),
      page_push_(&inodes_, cfg.page_push && !cfg.writeback_cache),
      cache_(cfg.cache_bytes),
      decode_ahead_(&cache_, DecodeThreads(cfg.decode_threads)),
      inodes_(store->env(), &fds_, std::move(ns_root), ns_root_st),
      seals_(cfg.seal_threads) {
  // Bases of deltas and references are decoded chunks like any other: one
  // cache bounds them all.
  store_->SetBaseCache(&cache_);
  cache_.SetEvictUnread([this](const ChunkKey& key, ChunkBytes bytes, std::vector<ChunkCache::Range> unread) {
    page_push_.Offer(key, std::move(bytes), std::move(unread));
  });
}

Result<std::shared_ptr<FileContent>> Filesystem::ContentOf(Inode& inode) {
  std::lock_guard lk(inode.content_mu);
  if (inode.content) return inode.content;
  ASSIGN_OR_RETURN(FdCache::Lease path, inode.Path());
  ASSIGN_OR_RETURN(UniqueFd stub, store_->env()->OpenAt(AT_FDCWD, ProcFdPath(path.get()), O_RDWR | O_CLOEXEC));
  FileContent::StubFd stub_fd{.fds = &fds_,
                              .fd = std::move(stub),
                              .reopen = inodes_.ReopenByHandle(inode.handle, O_RDWR, inode.dev, inode.ino)};
  auto content =
      FileContent::Load(store_, &cache_, std::move(stub_fd), "inode " + std::to_string(inode.ino), &decode_ahead_);
  if (!content.ok()) {
    if (LogAllowed(log_kind::kLoad, OwnerOf(store_->env(), path.get())))
      spdlog::error("cannot load {}: {}", LogSafe(FdPathForLog(path.get())), LogSafe(content.status().message()));
    return content.status();
  }
  inode.content = content.value();
  return inode.content;
}

Status Filesystem::Stat(Inode& inode, struct stat* st) {
  {
    ASSIGN_OR_RETURN(FdCache::Lease path, inode.Path());
    ASSIGN_OR_RETURN(*st, store_->env()->FstatAt(path.get(), "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW));
  }
  if (!S_ISREG(st->st_mode)) return Status::Ok();
  ASSIGN_OR_RETURN(auto content, ContentOf(inode));
  if (store_->cluster()) {
    RETURN_IF_ERROR(content->Refresh());
    if (content->HiddenHere()) return Status::Error(ENOENT, "file is being written on another node");
  }
  return content->FillStat(st);
}

MetricsSample Filesystem::SampleMetrics() {
  MetricsSample s;
  const PackIndex::Totals totals = store_->index().totals();
  s.logical_bytes = totals.root_logical;
  s.stored_bytes = totals.stored;
  const SealQueue::Backlog backlog = seals_.backlog();
  s.seal_queue_depth = backlog.files;
  s.seal_queue_oldest_seconds = backlog.oldest_seconds;
  s.cache_hits = cache_.hits();
  s.cache_misses = cache_.misses();
  s.cache_bytes = cache_.bytes();
  s.cache_capacity_bytes = cache_.capacity();
  ReadCounters(GlobalMetrics(), &s);
  return s;
}

void Filesystem::ForgetLinkIfGone(Inode* victim) {
  if (victim == nullptr || victim->type != S_IFREG) return;
  auto path = victim->Path();
  if (!path.ok()) return;
  auto st = store_->env()->Fstat(path->get());
  if (!st.ok() || st->st_nlink > 0) return;
  // With no name left, a handle may not reach the inode again once no fd
  // holds it: the Inode's fd stays open until the Inode goes (recovery
  // collects what a file unreachable after a crash leaves).
  victim->path.KeepOpen();
  auto content = ContentOf(*victim);
  if (!content.ok()) {
    if (LogAllowed(log_kind::kLoad, OwnerOf(store_->env(), path->get())))
      spdlog::warn("deleted inode {}: {} (recovery will collect its objects)", victim->ino,
                   LogSafe(content.status().message()));
    return;
  }
  content.value()->MarkUnlinked();
}

}  // namespace ckptfs
