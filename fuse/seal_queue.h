// Background sealing: a save returns as soon as its last close does; the
// encoding into a pack happens here, on a few worker threads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
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
  // Blocks until the queue is empty and no seal is running. Seals waiting
  // to be retried after a failure are not waited for: recovery at the next
  // mount does them. Postponed seals are tried at once, without postponing.
  void Drain();
  size_t pending() const;
  // For the metrics: the files pushed and not yet sealed (queued, sealing,
  // or waiting for a retry), and how long the oldest has waited.
  struct Backlog {
    size_t files = 0;
    double oldest_seconds = 0;
  };
  Backlog backlog() const;

 private:
  void Work();
  // A seal that failed (e.g. ENOSPC in the backing store) is retried with
  // backoff; the file stays readable from its staging file meanwhile.
  void RetryLater(std::shared_ptr<FileContent> file);
  // A seal that waits for more of its save (kSealPostponed) is tried again
  // after kPostponedRetry, and holds no worker meanwhile.
  void PostponeLocked(std::shared_ptr<FileContent> file);
  static constexpr std::chrono::milliseconds kPostponedRetry{100};
  void PromoteDueRetriesLocked();
  // When the next retry or postponed seal is due.
  std::optional<std::chrono::steady_clock::time_point> NextDueLocked() const;
  // After a worker is done with `file`: it leaves the backlog unless it is
  // queued again or waits for a retry.
  void SettleLocked(const FileContent* file);

  const int threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<std::shared_ptr<FileContent>> queue_;
  std::set<const FileContent*> queued_;
  std::multimap<std::chrono::steady_clock::time_point, std::shared_ptr<FileContent>> retries_;
  std::multimap<std::chrono::steady_clock::time_point, std::shared_ptr<FileContent>> postponed_;
  std::map<const FileContent*, std::chrono::seconds> backoff_;
  // When each file of the backlog was first pushed.
  std::map<const FileContent*, std::chrono::steady_clock::time_point> since_;
  int running_ = 0;
  bool stop_ = false;
  bool draining_ = false;  // seals no longer postpone
  std::vector<std::thread> workers_;
};

}  // namespace ckptfs
