#include "fuse/seal_queue.h"

#include <algorithm>

#include "base/log.h"
#include "base/metrics.h"

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
    since_.try_emplace(file.get(), std::chrono::steady_clock::now());
    queue_.push_back(std::move(file));
  }
  cv_.notify_one();
}

void SealQueue::Drain() {
  std::unique_lock lk(mu_);
  draining_ = true;
  cv_.notify_all();  // postponed seals are due now
  idle_cv_.wait(lk, [this] { return (queue_.empty() && postponed_.empty() && running_ == 0) || workers_.empty(); });
}

size_t SealQueue::pending() const {
  std::lock_guard lk(mu_);
  return queue_.size() + postponed_.size() + static_cast<size_t>(running_);
}

SealQueue::Backlog SealQueue::backlog() const {
  std::lock_guard lk(mu_);
  Backlog b{since_.size(), 0};
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [file, t] : since_)
    b.oldest_seconds = std::max(b.oldest_seconds, std::chrono::duration<double>(now - t).count());
  return b;
}

void SealQueue::SettleLocked(const FileContent* file) {
  if (queued_.count(file)) return;
  for (const auto* waiting : {&retries_, &postponed_}) {
    for (const auto& [due, f] : *waiting)
      if (f.get() == file) return;
  }
  since_.erase(file);
}

void SealQueue::RetryLater(std::shared_ptr<FileContent> file) {
  std::lock_guard lk(mu_);
  auto& delay = backoff_[file.get()];
  delay = std::min(std::chrono::seconds(60), delay == std::chrono::seconds(0) ? std::chrono::seconds(1) : delay * 2);
  retries_.emplace(std::chrono::steady_clock::now() + delay, std::move(file));
}

void SealQueue::PostponeLocked(std::shared_ptr<FileContent> file) {
  postponed_.emplace(std::chrono::steady_clock::now() + kPostponedRetry, std::move(file));
}

void SealQueue::PromoteDueRetriesLocked() {
  const auto now = std::chrono::steady_clock::now();
  auto promote = [&](auto& waiting, bool all) {
    while (!waiting.empty() && (all || waiting.begin()->first <= now)) {
      std::shared_ptr<FileContent> file = std::move(waiting.begin()->second);
      waiting.erase(waiting.begin());
      if (queued_.insert(file.get()).second) queue_.push_back(std::move(file));
    }
  };
  promote(retries_, false);
  promote(postponed_, draining_);
}

std::optional<std::chrono::steady_clock::time_point> SealQueue::NextDueLocked() const {
  std::optional<std::chrono::steady_clock::time_point> due;
  if (!retries_.empty()) due = retries_.begin()->first;
  if (!postponed_.empty() && (!due || postponed_.begin()->first < *due)) due = postponed_.begin()->first;
  return due;
}

void SealQueue::Work() {
  std::unique_lock lk(mu_);
  for (;;) {
    auto ready = [this] { return stop_ || !queue_.empty() || (draining_ && !postponed_.empty()); };
    if (const std::optional<std::chrono::steady_clock::time_point> due = NextDueLocked()) {
      cv_.wait_until(lk, *due, ready);
    } else {
      cv_.wait(lk, ready);
    }
    PromoteDueRetriesLocked();
    if (queue_.empty()) {
      if (stop_) return;
      continue;
    }
    std::shared_ptr<FileContent> file = std::move(queue_.front());
    queue_.pop_front();
    queued_.erase(file.get());
    ++running_;
    const bool may_postpone = !draining_;
    lk.unlock();
    Status st = file->SealIfIdle(/*reader_waits=*/false, may_postpone);
    if (st.ok()) {
      std::lock_guard relk(mu_);
      backoff_.erase(file.get());
    } else if (st.code() == kSealPostponed) {
      std::lock_guard relk(mu_);
      PostponeLocked(file);
    } else if (st.code() == EAGAIN) {
      // Changed while sealing: the release that follows requeues it, unless
      // that already happened while we worked.
      if (file->NeedsSeal()) Push(file);
    } else {
      if (LogAllowed(log_kind::kSeal, file->owner_uid()))
        spdlog::error("sealing {} failed, will retry: {}", file->label(), LogSafe(st.message()));
      GlobalMetrics().seal_failures.Add();
      if (file->NeedsSeal()) RetryLater(file);
    }
    lk.lock();
    SettleLocked(file.get());
    --running_;
    if (queue_.empty() && running_ == 0) idle_cv_.notify_all();
  }
}

}  // namespace ckptfs
