#include "base/sync_point.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace ckptfs {

std::atomic<bool> SyncPoint::enabled_{false};

SyncPoint* SyncPoint::Get() {
  static SyncPoint* const points = new SyncPoint();
  return points;
}

void SyncPoint::LoadDependency(const std::vector<Dependency>& dependencies) {
  std::lock_guard lk(mu_);
  predecessors_.clear();
  for (const Dependency& d : dependencies) predecessors_[d.successor].push_back(d.predecessor);
  passed_.clear();
  cv_.notify_all();
}

void SyncPoint::SetCallBack(const std::string& point, std::function<void(void*)> callback) {
  std::lock_guard lk(mu_);
  callbacks_[point] = std::move(callback);
}

void SyncPoint::ClearCallBack(const std::string& point) {
  std::lock_guard lk(mu_);
  callbacks_.erase(point);
}

void SyncPoint::ClearAllCallBacks() {
  std::unique_lock lk(mu_);
  // A callback still running may use what the test is about to destroy.
  cv_.wait(lk, [&] { return callbacks_running_ == 0; });
  callbacks_.clear();
}

void SyncPoint::DisableProcessing() {
  std::lock_guard lk(mu_);  // a waiter checks the flag under the lock: no lost wakeup
  enabled_.store(false, std::memory_order_relaxed);
  cv_.notify_all();
}

void SyncPoint::ClearTrace() {
  std::lock_guard lk(mu_);
  passed_.clear();
}

void SyncPoint::Reset() {
  DisableProcessing();
  ClearAllCallBacks();
  std::lock_guard lk(mu_);
  predecessors_.clear();
  passed_.clear();
}

bool SyncPoint::PredecessorsPassed(const std::string& point) const {
  auto it = predecessors_.find(point);
  if (it == predecessors_.end()) return true;
  for (const std::string& p : it->second) {
    if (!passed_.contains(p)) return false;
  }
  return true;
}

void SyncPoint::Process(std::string_view name, void* arg) {
  if (!Enabled()) return;
  const std::string point(name);
  std::unique_lock lk(mu_);
  if (auto cb = callbacks_.find(point); cb != callbacks_.end()) {
    const std::function<void(void*)> callback = cb->second;  // a copy: the test may clear it meanwhile
    ++callbacks_running_;
    lk.unlock();
    callback(arg);
    lk.lock();
    --callbacks_running_;
    cv_.notify_all();
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kMaxWaitSeconds);
  while (Enabled() && !PredecessorsPassed(point)) {
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && Enabled() && !PredecessorsPassed(point)) {
      // A hang until ctest's timeout would say less than this.
      std::fprintf(stderr, "sync point %s: its predecessors were not passed within %d s; aborting\n", point.c_str(),
                   kMaxWaitSeconds);
      std::abort();
    }
  }
  passed_.insert(point);
  cv_.notify_all();
}

}  // namespace ckptfs
