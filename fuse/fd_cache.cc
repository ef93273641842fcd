#include "fuse/fd_cache.h"

#include <algorithm>
#include <vector>

namespace ckptfs {

FdCache::Lease& FdCache::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    Drop();
    slot_ = std::exchange(o.slot_, nullptr);
    fd_ = o.fd_;
    owner_ = std::move(o.owner_);
  }
  return *this;
}

void FdCache::Lease::Drop() {
  if (Slot* slot = std::exchange(slot_, nullptr); slot != nullptr) slot->cache_->Release(slot);
  owner_.reset();  // after: the slot may live in what it holds
}

FdCache::FdCache(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {
  // A full fd table gives back an eighth of the idle fds at a time (at
  // least 16): enough for the opens in flight, without emptying the cache.
  relief_ = std::make_unique<FdRelief>([this] { return Evict(std::max<size_t>(16, capacity_ / 8)); });
}

FdCache::~FdCache() { relief_.reset(); }

void FdCache::Slot::Assign(FdCache* cache, UniqueFd fd, Reopen reopen) {
  Reset();
  cache_ = cache;
  reopen_ = std::move(reopen);
  std::vector<UniqueFd> closing;
  std::lock_guard lk(cache_->mu_);
  fd_ = std::move(fd);
  if (!fd_.valid()) return;
  ++cache_->open_;
  cache_->IdleLocked(this);
  cache_->TrimLocked(cache_->capacity_, SIZE_MAX, &closing);
}

void FdCache::Slot::Reset() {
  if (cache_ == nullptr) return;
  UniqueFd closing;
  {
    std::unique_lock lk(cache_->mu_);
    // A request may still hold a lease for a moment after its reply let
    // the kernel FORGET the inode: the Inode waits for it before it goes.
    cache_->released_cv_.wait(lk, [this] { return leases_ == 0; });
    cache_->BusyLocked(this);
    if (fd_.valid()) --cache_->open_;
    closing = std::move(fd_);
    keep_open_ = false;
  }
  cache_ = nullptr;
}

Result<FdCache::Lease> FdCache::Slot::Take(std::shared_ptr<const void> owner) {
  if (cache_ == nullptr) return Status::Error(EBADF, "no descriptor");
  {
    std::lock_guard lk(cache_->mu_);
    if (fd_.valid()) {
      cache_->BusyLocked(this);
      ++leases_;
      return Lease(this, fd_.get(), std::move(owner));
    }
  }
  if (!reopen_) return Status::Error(EBADF, "descriptor closed and not reopenable");
  // Outside the lock: the open may itself have to relieve a full table.
  ASSIGN_OR_RETURN(UniqueFd fresh, reopen_());
  std::lock_guard lk(cache_->mu_);
  if (!fd_.valid()) {  // else another lease reopened it meanwhile; `fresh` goes
    fd_ = std::move(fresh);
    ++cache_->open_;
    ++cache_->reopens_;
  }
  cache_->BusyLocked(this);
  ++leases_;
  return Lease(this, fd_.get(), std::move(owner));
}

void FdCache::Slot::KeepOpen() {
  if (cache_ == nullptr) return;
  auto lease = Take();  // reopens an evicted fd, if it still can
  std::lock_guard lk(cache_->mu_);
  keep_open_ = true;
}

void FdCache::Release(Slot* slot) {
  std::vector<UniqueFd> closing;
  std::lock_guard lk(mu_);
  if (--slot->leases_ > 0) return;
  released_cv_.notify_all();  // a Reset may wait for it (it runs under mu_, after this)
  IdleLocked(slot);
  TrimLocked(capacity_, SIZE_MAX, &closing);
}

void FdCache::IdleLocked(Slot* slot) {
  if (slot->leases_ > 0 || slot->keep_open_ || !slot->reopen_ || !slot->fd_.valid() || slot->in_lru_) return;
  lru_.push_front(slot);
  slot->lru_pos_ = lru_.begin();
  slot->in_lru_ = true;
}

void FdCache::BusyLocked(Slot* slot) {
  if (!slot->in_lru_) return;
  lru_.erase(slot->lru_pos_);
  slot->in_lru_ = false;
}

void FdCache::TrimLocked(size_t keep, size_t n, std::vector<UniqueFd>* closing) {
  while (lru_.size() > keep && n > 0) {
    Slot* victim = lru_.back();
    lru_.pop_back();
    victim->in_lru_ = false;
    closing->push_back(std::move(victim->fd_));
    --open_;
    --n;
  }
}

size_t FdCache::Evict(size_t n) {
  std::vector<UniqueFd> closing;
  {
    std::lock_guard lk(mu_);
    TrimLocked(0, n, &closing);
  }
  return closing.size();
}

size_t FdCache::open_fds() const {
  std::lock_guard lk(mu_);
  return open_;
}

uint64_t FdCache::reopens() const {
  std::lock_guard lk(mu_);
  return reopens_;
}

}  // namespace ckptfs
