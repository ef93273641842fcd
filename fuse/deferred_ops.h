// The rest of requests that must not be answered before something else
// has happened, run on a thread of their own instead of a FUSE thread.
//
// A writable open, a truncate, and an open that drops the kernel's pages of
// a file must wait for the page pushes of that file in flight (fuse/page_push.h),
// and a push may wait in the kernel for a page that a read in flight has
// locked: that read needs a FUSE thread to be answered. Waiting on a FUSE
// thread could take the last one, and the mount would hang; here it takes
// none (FileContent::PushHold).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace ckptfs {

// One request, taken off its FUSE thread. Exactly one of Run and Cancel is
// called, and each replies to the request.
class DeferredOp {
 public:
  virtual ~DeferredOp() = default;
  // Blocks until the request may go on.
  virtual void Wait() = 0;
  // The rest of the request, after Wait.
  virtual void Run() = 0;
  // The mount is going away: fails the request and undoes what it counted.
  // Never blocks.
  virtual void Cancel() = 0;
};

class DeferredOps {
 public:
  DeferredOps() = default;
  ~DeferredOps() { Stop(); }
  DeferredOps(const DeferredOps&) = delete;
  DeferredOps& operator=(const DeferredOps&) = delete;

  // Starts the thread (after the daemon's fork, as PagePush::Start).
  void Start();
  // Cancels the queued requests, lets the one in progress finish, and ends
  // the thread; after PagePush::Stop (the pushes it may wait for end there)
  // and before the session goes (the requests are the session's).
  void Stop();
  // Queues `op`; never blocks. When the thread is not running, cancels it.
  void Push(std::unique_ptr<DeferredOp> op);

 private:
  void Work();

  std::mutex mu_;  // taken alone: no other lock is taken while it is held
  std::condition_variable wake_;
  std::deque<std::unique_ptr<DeferredOp>> queue_;
  bool running_ = false;
  std::thread worker_;
};

}  // namespace ckptfs
