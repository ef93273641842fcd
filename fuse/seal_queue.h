// Background sealing: a save returns as soon as its last close does; the
// encoding into a pack happens here, on a few worker threads.
//
// Fair across owners (docs/ARCHITECTURE.md, "Sealing"): files wait in two
// lanes, small and big (SealTarget::SealClass), each a round robin over the
// files' owners, so one user's many files take turns with another user's
// one. The seal_threads workers take big files first, then small ones; one
// more worker takes small files only, so a small file never waits for a
// big seal in progress, whoever's it is, and a flood of small files does
// not starve big ones.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"

namespace ckptfs {

// What the seal queue needs of a file (FileContent; tests use fakes).
class SealTarget {
 public:
  virtual ~SealTarget() = default;
  // Seals the file if it is staged and idle (FileContent::SealIfIdle).
  virtual Status SealIfIdle(bool reader_waits, bool may_postpone) = 0;
  virtual bool NeedsSeal() = 0;
  virtual const std::string& label() const = 0;
  // Who a seal is charged to, and which lane it waits in.
  struct SealClass {
    uid_t owner = 0;
    bool small = true;
  };
  virtual SealClass ClassForSeal() = 0;
};

// A file is small, for the seal queue, when its staging file holds at most
// this many bytes of data (holes do not count: they cost nothing to seal)
// and its size needs at most kSmallSealChunks chunk table entries' worth.
inline constexpr uint64_t kSmallSealBytes = 64ull << 20;
inline constexpr uint64_t kSmallSealSize = 64ull << 30;

class SealQueue {
 public:
  explicit SealQueue(int threads);
  ~SealQueue();  // drains, then joins

  void Start();  // separate from construction: workers must start after fork()
  void Push(std::shared_ptr<SealTarget> file);
  // Blocks until the queue is empty and no seal is running. Seals waiting
  // to be retried after a failure are not waited for: recovery at the next
  // mount does them. Postponed seals are tried at once, without postponing.
  // A seal of a deleted file is cancelled (FileContent::MarkUnlinked) and
  // ends at its next chunk, so Drain never waits for one.
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
  // Files waiting for a worker: per owner, in the order pushed, and the
  // owners in turn (round robin).
  struct Lane {
    std::map<uid_t, std::deque<std::shared_ptr<SealTarget>>> by_owner;
    std::deque<uid_t> turn;
    size_t files = 0;
  };
  struct Queued {
    std::shared_ptr<SealTarget> file;
    SealTarget::SealClass cls;
  };
  void Work(bool small_only);
  void EnqueueLocked(std::shared_ptr<SealTarget> file, SealTarget::SealClass cls);
  // The next file for a worker (big lane first; `small_only`: the small
  // lane only), or nothing.
  std::optional<Queued> PopLocked(bool small_only);
  std::optional<size_t> NextTurnLocked(const Lane& lane) const;
  static std::span<const int> LanesFor(bool small_only);
  bool ReadyLocked(bool small_only) const;
  size_t QueuedLocked() const { return lanes_[0].files + lanes_[1].files; }
  void SealOne(const Queued& job, bool may_postpone);
  // A seal that failed (e.g. ENOSPC in the backing store) is retried with
  // backoff; the file stays readable from its staging file meanwhile.
  void RetryLater(std::shared_ptr<SealTarget> file, SealTarget::SealClass cls);
  // A seal that waits for more of its save (kSealPostponed) is tried again
  // after kPostponedRetry, and holds no worker meanwhile.
  void PostponeLocked(std::shared_ptr<SealTarget> file, SealTarget::SealClass cls);
  static constexpr std::chrono::milliseconds kPostponedRetry{100};
  void PromoteDueRetriesLocked();
  // When the next retry or postponed seal is due.
  std::optional<std::chrono::steady_clock::time_point> NextDueLocked() const;
  // After a worker is done with `file`: it leaves the backlog unless it is
  // queued again or waits for a retry.
  void SettleLocked(const SealTarget* file);

  const int threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  Lane lanes_[2];  // small, big
  // The lane each queued file waits in, by file.
  std::map<const SealTarget*, SealTarget::SealClass> queued_;
  std::multimap<std::chrono::steady_clock::time_point, Queued> retries_;
  std::multimap<std::chrono::steady_clock::time_point, Queued> postponed_;
  std::map<const SealTarget*, std::chrono::seconds> backoff_;
  // When each file of the backlog was first pushed.
  std::map<const SealTarget*, std::chrono::steady_clock::time_point> since_;
  int running_ = 0;
  // Seals running per owner: at most threads_ each (NextTurnLocked).
  std::map<uid_t, int> running_by_owner_;
  bool stop_ = false;
  bool draining_ = false;  // seals no longer postpone
  std::vector<std::thread> workers_;
};

}  // namespace ckptfs
