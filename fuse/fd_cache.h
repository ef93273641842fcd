// FdCache: bounds the descriptors the daemon keeps for files nobody is
// using. Each Inode's O_PATH fd and each FileContent's stub and staging
// fds live in a Slot; a Slot's fd is open while a request leases it (Lease,
// RAII) and, once idle, stays open only while it is among the `capacity`
// most recently used idle ones (an LRU, like LevelDB's TableCache). An
// evicted fd is reopened on the next lease (by file handle, or from the
// staging file's id), so the fds held grow with the requests in flight,
// not with the inodes the kernel caches (issue 40: one user's 20,000 files
// took the daemon to its fd limit, and everyone got EMFILE).
//
// A Slot without a way to reopen its fd is never evicted (counted, outside
// the bound). While the cache lives it is registered as an FdRelief
// (base/env.h): an open anywhere that finds the fd table full evicts
// idle fds and retries.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <utility>

#include "base/status.h"
#include "base/unique_fd.h"
#include "base/env.h"

namespace ckptfs {

class FdCache {
 public:
  using Reopen = std::function<Result<UniqueFd>()>;
  class Slot;

  // Keeps a Slot's fd open; what `owner` holds (if anything) stays alive
  // with it, so a lease may outlive its owner's other references.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept : slot_(std::exchange(o.slot_, nullptr)), fd_(o.fd_), owner_(std::move(o.owner_)) {}
    Lease& operator=(Lease&& o) noexcept;
    ~Lease() { Drop(); }
    int get() const { return fd_; }

   private:
    friend class Slot;
    Lease(Slot* slot, int fd, std::shared_ptr<const void> owner) : slot_(slot), fd_(fd), owner_(std::move(owner)) {}
    void Drop();
    Slot* slot_ = nullptr;
    int fd_ = -1;
    std::shared_ptr<const void> owner_;
  };

  // One descriptor the cache may close while it is idle. Its destruction
  // (Reset) waits until no lease is held: the kernel may FORGET an inode
  // as soon as a request's reply is sent, before the request's leases go.
  // So a thread must not destroy a Slot it holds a lease on.
  class Slot {
   public:
    Slot() = default;  // empty until Assign
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() { Reset(); }
    // Takes `fd` (open now) and how to open it again; a null `reopen`
    // keeps the fd open until the Slot goes.
    void Assign(FdCache* cache, UniqueFd fd, Reopen reopen);
    // The fd, reopened if it was evicted. `owner` is kept alive by the lease.
    Result<Lease> Take(std::shared_ptr<const void> owner = nullptr);
    // From now on the fd is never evicted (a file whose last name is gone
    // may not be reachable by handle any more): best effort, reopening it
    // now if it was evicted.
    void KeepOpen();
    // Closes the fd and leaves the cache, once no lease is held.
    void Reset();

   private:
    friend class FdCache;
    FdCache* cache_ = nullptr;
    Reopen reopen_;
    // Guarded by cache_->mu_:
    UniqueFd fd_;
    int leases_ = 0;
    bool keep_open_ = false;
    bool in_lru_ = false;
    std::list<Slot*>::iterator lru_pos_;
  };

  // capacity: the idle fds kept open at most (at least 1).
  explicit FdCache(size_t capacity);
  ~FdCache();
  FdCache(const FdCache&) = delete;
  FdCache& operator=(const FdCache&) = delete;

  // Closes up to `n` idle fds, least recently used first; how many closed.
  size_t Evict(size_t n);
  size_t capacity() const { return capacity_; }
  // Fds held by slots now: idle ones, leased ones and kept-open ones.
  size_t open_fds() const;
  // Fds reopened after an eviction, since the cache was made.
  uint64_t reopens() const;

 private:
  // Takes idle fds out beyond capacity_ (or `n` of them) into `closing`,
  // which the caller closes after releasing mu_.
  void TrimLocked(size_t keep, size_t n, std::vector<UniqueFd>* closing);
  void IdleLocked(Slot* slot);
  void BusyLocked(Slot* slot);
  void Release(Slot* slot);

  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable released_cv_;  // a slot's last lease went
  std::list<Slot*> lru_;                 // idle slots with an fd; front: most recently used
  size_t open_ = 0;
  uint64_t reopens_ = 0;
  // Last: unregistered before the rest goes.
  std::unique_ptr<FdRelief> relief_;
};

}  // namespace ckptfs
