// Background sealing: a save returns as soon as its last close does; the
// encoding into a pack happens here, on a few worker threads.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "fuse/file_content.h"

namespace ckptfs {

class SealQueue {
 public:
  explicit SealQueue(int threads);
  ~SealQueue();  // drains, then joins

  void Start();  // separate from construction: workers must start after fork()
  void Push(std::shared_ptr<FileContent> file);
  // Blocks until the queue is empty and no seal is running.
  void Drain();
  size_t pending() const;

 private:
  void Work();

  const int threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<std::shared_ptr<FileContent>> queue_;
  std::set<const FileContent*> queued_;
  int running_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace ckptfs
