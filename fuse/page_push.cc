#include "fuse/page_push.h"

#include <algorithm>
#include <cerrno>
#include <utility>

#include "base/log.h"
#include "base/metrics.h"

namespace ckptfs {

void PagePush::Start(fuse_session* session) {
  std::lock_guard lk(mu_);
  if (!enabled_ || running_ || session == nullptr) return;
  session_ = session;
  running_ = true;
  worker_ = std::thread([this] { Work(); });
}

void PagePush::Stop() {
  {
    std::lock_guard lk(mu_);
    running_ = false;
    queue_.clear();
    queued_bytes_ = 0;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard lk(open_mu_);
  open_.clear();
}

void PagePush::Opened(Inode& inode, std::shared_ptr<FileContent> content) {
  if (!enabled_) return;
  std::lock_guard lk(open_mu_);
  Open& o = open_[&inode];
  o.content = std::move(content);
  ++o.handles;
}

void PagePush::Released(Inode& inode) {
  if (!enabled_) return;
  std::lock_guard lk(open_mu_);
  auto it = open_.find(&inode);
  if (it != open_.end() && --it->second.handles <= 0) open_.erase(it);
}

void PagePush::Offer(const ChunkKey& key, ChunkBytes bytes, std::vector<ChunkCache::Range> unread) {
  {
    std::lock_guard lk(mu_);
    if (!running_) return;
    if (queued_bytes_ + bytes->size() > kMaxQueuedBytes) {
      GlobalMetrics().pages_push_dropped.Add();
      return;
    }
    queued_bytes_ += bytes->size();
    queue_.push_back(Job{key, std::move(bytes), std::move(unread)});
  }
  wake_.notify_one();
}

void PagePush::Work() {
  std::unique_lock lk(mu_);
  for (;;) {
    wake_.wait(lk, [&] { return !running_ || !queue_.empty(); });
    if (!running_) return;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    Push(job);
    const uint64_t size = job.bytes->size();
    job = Job{};  // the chunk's buffer goes back before the lock
    lk.lock();
    queued_bytes_ -= std::min(queued_bytes_, size);
  }
}

void PagePush::Push(const Job& job) {
  Inode* inode = nullptr;
  std::shared_ptr<FileContent> content;
  uint64_t chunk_size = 0;
  {
    std::lock_guard lk(open_mu_);
    for (auto& [in, o] : open_) {
      chunk_size = o.content->BeginPagePush(job.key.pack);
      if (chunk_size == 0) continue;
      inode = in;
      content = o.content;
      // The kernel knows the inode by its address: it must not be freed,
      // and the address given to another file, before the push is written.
      inodes_->Opened(*inode);
      break;
    }
  }
  if (chunk_size == 0) return;  // no open file reads that pack now
  const fuse_ino_t ino = inodes_->IdOf(*inode);
  const uint64_t base = job.key.index * chunk_size;
  bool whole = true;
  for (const ChunkCache::Range& r : job.unread) {
    fuse_bufvec bv = FUSE_BUFVEC_INIT(r.end - r.begin);
    bv.buf[0].mem = const_cast<uint8_t*>(job.bytes->data() + r.begin);
    const int rc = fuse_lowlevel_notify_store(session_, ino, static_cast<off_t>(base + r.begin), &bv,
                                              static_cast<fuse_buf_copy_flags>(0));
    // ENOENT: the kernel has forgotten the inode; anything else: the reader
    // asks the daemon for those bytes, as without the push.
    if (rc != 0) {
      if (rc != -ENOENT) spdlog::debug("page push at {} failed: {}", base + r.begin, rc);
      whole = false;
      break;
    }
    GlobalMetrics().pages_pushed_bytes.Add(r.end - r.begin);
  }
  content->EndPagePush(job.key.pack, job.key.index, whole);
  inodes_->Released(*inode);
}

}  // namespace ckptfs
