#include "fuse/deferred_ops.h"

#include <utility>

namespace ckptfs {

void DeferredOps::Start() {
  std::lock_guard lk(mu_);
  if (running_) return;
  running_ = true;
  worker_ = std::thread([this] { Work(); });
}

void DeferredOps::Stop() {
  std::deque<std::unique_ptr<DeferredOp>> left;
  {
    std::lock_guard lk(mu_);
    running_ = false;
    left.swap(queue_);
  }
  wake_.notify_all();
  // Answered now, not after the op in progress, whose wait may be long.
  for (std::unique_ptr<DeferredOp>& op : left) op->Cancel();
  if (worker_.joinable()) worker_.join();
}

void DeferredOps::Push(std::unique_ptr<DeferredOp> op) {
  {
    std::lock_guard lk(mu_);
    if (running_) {
      queue_.push_back(std::move(op));
      op = nullptr;
    }
  }
  if (op) return op->Cancel();
  wake_.notify_one();
}

void DeferredOps::Work() {
  std::unique_lock lk(mu_);
  for (;;) {
    wake_.wait(lk, [&] { return !running_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopped
    std::unique_ptr<DeferredOp> op = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    op->Wait();
    op->Run();
    op.reset();  // what it holds goes before the lock
    lk.lock();
  }
}

}  // namespace ckptfs
