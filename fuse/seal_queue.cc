#include "fuse/seal_queue.h"

#include <algorithm>
#include <span>

#include "base/log.h"
#include "base/metrics.h"
#include "store/store.h"

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
  for (int i = 0; i < threads_; ++i) workers_.emplace_back([this] { Work(/*small_only=*/false); });
  // The small lane's own worker: a small file never waits for a big seal.
  workers_.emplace_back([this] { Work(/*small_only=*/true); });
}

void SealQueue::EnqueueLocked(std::shared_ptr<SealTarget> file, SealTarget::SealClass cls) {
  if (!queued_.emplace(file.get(), cls).second) return;
  since_.try_emplace(file.get(), std::chrono::steady_clock::now());
  Lane& lane = lanes_[cls.small ? 0 : 1];
  std::deque<std::shared_ptr<SealTarget>>& mine = lane.by_owner[cls.owner];
  if (mine.empty()) lane.turn.push_back(cls.owner);
  mine.push_back(std::move(file));
  ++lane.files;
}

void SealQueue::Push(std::shared_ptr<SealTarget> file) {
  const SealTarget::SealClass cls = file->ClassForSeal();  // outside the lock: it may stat the file
  {
    std::lock_guard lk(mu_);
    EnqueueLocked(std::move(file), cls);
  }
  cv_.notify_all();  // the small lane's worker may be the one to take it
}

// The position in `lane`'s turn of the first owner that may start a seal
// now: one with fewer than threads_ seals running. So one owner's files
// seal in turn, as with one seal thread (a checkpoint's seal finds its
// predecessor sealed, to be coded against), and the extra small-file
// worker only lets other owners' small files pass a big seal.
std::optional<size_t> SealQueue::NextTurnLocked(const Lane& lane) const {
  for (size_t i = 0; i < lane.turn.size(); ++i) {
    auto r = running_by_owner_.find(lane.turn[i]);
    if (r == running_by_owner_.end() || r->second < threads_) return i;
  }
  return std::nullopt;
}

std::span<const int> SealQueue::LanesFor(bool small_only) {
  // The general workers take big files first: small ones have a worker of
  // their own, and a flood of small files must not starve big ones.
  static constexpr int kSmallOnly[] = {0}, kBigFirst[] = {1, 0};
  return small_only ? std::span<const int>(kSmallOnly) : std::span<const int>(kBigFirst);
}

std::optional<SealQueue::Queued> SealQueue::PopLocked(bool small_only) {
  for (int l : LanesFor(small_only)) {
    Lane& lane = lanes_[l];
    const std::optional<size_t> at = NextTurnLocked(lane);
    if (!at) continue;
    const uid_t owner = lane.turn[*at];
    lane.turn.erase(lane.turn.begin() + static_cast<std::ptrdiff_t>(*at));
    auto it = lane.by_owner.find(owner);
    Queued job{std::move(it->second.front()), {}};
    it->second.pop_front();
    if (it->second.empty()) {
      lane.by_owner.erase(it);
    } else {
      lane.turn.push_back(owner);  // its next file waits for the other owners' turns
    }
    --lane.files;
    auto q = queued_.find(job.file.get());
    job.cls = q->second;
    queued_.erase(q);
    return job;
  }
  return std::nullopt;
}

bool SealQueue::ReadyLocked(bool small_only) const {
  if (stop_ || (draining_ && !postponed_.empty())) return true;
  for (int l : LanesFor(small_only))
    if (NextTurnLocked(lanes_[l])) return true;
  return false;
}

void SealQueue::Drain() {
  std::unique_lock lk(mu_);
  draining_ = true;
  cv_.notify_all();  // postponed seals are due now
  idle_cv_.wait(lk, [this] { return (QueuedLocked() == 0 && postponed_.empty() && running_ == 0) || workers_.empty(); });
}

size_t SealQueue::pending() const {
  std::lock_guard lk(mu_);
  return QueuedLocked() + postponed_.size() + static_cast<size_t>(running_);
}

SealQueue::Backlog SealQueue::backlog() const {
  std::lock_guard lk(mu_);
  Backlog b{since_.size(), 0};
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [file, t] : since_)
    b.oldest_seconds = std::max(b.oldest_seconds, std::chrono::duration<double>(now - t).count());
  return b;
}

void SealQueue::SettleLocked(const SealTarget* file) {
  if (queued_.count(file)) return;
  for (const auto* waiting : {&retries_, &postponed_}) {
    for (const auto& [due, q] : *waiting)
      if (q.file.get() == file) return;
  }
  since_.erase(file);
}

void SealQueue::RetryLater(std::shared_ptr<SealTarget> file, SealTarget::SealClass cls) {
  std::lock_guard lk(mu_);
  auto& delay = backoff_[file.get()];
  delay = std::min(std::chrono::seconds(60), delay == std::chrono::seconds(0) ? std::chrono::seconds(1) : delay * 2);
  retries_.emplace(std::chrono::steady_clock::now() + delay, Queued{std::move(file), cls});
}

void SealQueue::PostponeLocked(std::shared_ptr<SealTarget> file, SealTarget::SealClass cls) {
  postponed_.emplace(std::chrono::steady_clock::now() + kPostponedRetry, Queued{std::move(file), cls});
}

void SealQueue::PromoteDueRetriesLocked() {
  const auto now = std::chrono::steady_clock::now();
  auto promote = [&](auto& waiting, bool all) {
    while (!waiting.empty() && (all || waiting.begin()->first <= now)) {
      Queued q = std::move(waiting.begin()->second);
      waiting.erase(waiting.begin());
      EnqueueLocked(std::move(q.file), q.cls);
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

void SealQueue::SealOne(const Queued& job, bool may_postpone) {
  const std::shared_ptr<SealTarget>& file = job.file;
  Status st = file->SealIfIdle(/*reader_waits=*/false, may_postpone);
  if (st.ok()) {
    std::lock_guard relk(mu_);
    backoff_.erase(file.get());
  } else if (st.code() == kSealPostponed) {
    std::lock_guard relk(mu_);
    PostponeLocked(file, job.cls);
  } else if (st.code() == EAGAIN) {
    // Changed while sealing: the release that follows requeues it, unless
    // that already happened while we worked.
    if (file->NeedsSeal()) Push(file);
  } else {
    if (LogAllowed(log_kind::kSeal, job.cls.owner))
      spdlog::error("sealing {} failed, will retry: {}", LogSafe(file->label()), LogSafe(st.message()));
    GlobalMetrics().seal_failures.Add();
    if (file->NeedsSeal()) RetryLater(file, job.cls);
  }
}

void SealQueue::Work(bool small_only) {
  std::unique_lock lk(mu_);
  for (;;) {
    auto ready = [&] { return ReadyLocked(small_only); };
    if (const std::optional<std::chrono::steady_clock::time_point> due = NextDueLocked()) {
      cv_.wait_until(lk, *due, ready);
    } else {
      cv_.wait(lk, ready);
    }
    PromoteDueRetriesLocked();
    std::optional<Queued> job = PopLocked(small_only);
    if (!job) {
      if (stop_) return;
      if (QueuedLocked() > 0) cv_.notify_all();  // a promoted retry this worker does not take
      continue;
    }
    ++running_;
    ++running_by_owner_[job->cls.owner];
    const bool may_postpone = !draining_;
    lk.unlock();
    SealOne(*job, may_postpone);
    lk.lock();
    SettleLocked(job->file.get());
    --running_;
    if (--running_by_owner_[job->cls.owner] == 0) running_by_owner_.erase(job->cls.owner);
    if (QueuedLocked() == 0 && running_ == 0) idle_cv_.notify_all();
    // Another worker may take what this one's turn left (or a promoted retry).
    if (QueuedLocked() > 0) cv_.notify_all();
  }
}

}  // namespace ckptfs
