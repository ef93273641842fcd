#include "fuse/seal_queue.h"

#include "base/log.h"

namespace ckptfs {

SealQueue::SealQueue(int threads) : threads_(threads < 1 ? 1 : threads) {}

SealQueue::~SealQueue() {
  Drain();
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void SealQueue::Start() {
  for (int i = 0; i < threads_; ++i) workers_.emplace_back([this] { Work(); });
}

void SealQueue::Push(std::shared_ptr<FileContent> file) {
  {
    std::lock_guard lk(mu_);
    if (!queued_.insert(file.get()).second) return;
    queue_.push_back(std::move(file));
  }
  cv_.notify_one();
}

void SealQueue::Drain() {
  std::unique_lock lk(mu_);
  idle_cv_.wait(lk, [this] { return (queue_.empty() && running_ == 0) || workers_.empty(); });
}

size_t SealQueue::pending() const {
  std::lock_guard lk(mu_);
  return queue_.size() + static_cast<size_t>(running_);
}

void SealQueue::Work() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and nothing left
    std::shared_ptr<FileContent> file = std::move(queue_.front());
    queue_.pop_front();
    queued_.erase(file.get());
    ++running_;
    lk.unlock();
    Status st = file->SealIfIdle();
    // EAGAIN: it changed while sealing; the release that follows requeues it.
    if (!st.ok() && st.code() != EAGAIN) spdlog::error("sealing {} failed: {}", file->label(), st.message());
    if (st.code() == EAGAIN && file->NeedsSeal()) Push(file);
    lk.lock();
    --running_;
    if (queue_.empty() && running_ == 0) idle_cv_.notify_all();
  }
}

}  // namespace ckptfs
