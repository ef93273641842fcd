#include "base/log_limit.h"

#include <algorithm>
#include <iterator>

namespace ckptfs {
namespace {

constexpr std::string_view kOverflowKind = "(other)";

}  // namespace

void LogLimiter::Refill(Bucket* b, Clock::time_point now) const {
  const double secs = std::chrono::duration<double>(now - b->refilled).count();
  if (secs <= 0) return;
  b->tokens = std::min(opts_.burst, b->tokens + secs * opts_.per_second);
  b->refilled = now;
}

void LogLimiter::EvictIdle(Clock::time_point now) {
  // Idle: a full bucket and nothing dropped, the same as a key never seen.
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    Refill(&it->second, now);
    const bool idle = it->second.dropped == 0 && it->second.tokens >= opts_.burst;
    it = idle ? buckets_.erase(it) : std::next(it);
  }
}

LogLimiter::Bucket& LogLimiter::BucketFor(std::string_view kind, uint32_t uid, Clock::time_point now, Key* key) {
  *key = Key(std::string(kind), uid);
  if (auto it = buckets_.find(*key); it != buckets_.end()) return it->second;
  if (buckets_.size() >= opts_.max_keys) EvictIdle(now);
  if (buckets_.size() >= opts_.max_keys) {
    // Many users at once: the newcomers share one bucket, so memory and
    // lines stay bounded whatever the number of uids.
    *key = Key(std::string(kOverflowKind), kLogAnyUid);
    if (!overflow_used_) overflow_ = Bucket{.tokens = opts_.burst, .refilled = now, .dropped = 0, .first_drop = now};
    overflow_used_ = true;
    return overflow_;
  }
  return buckets_.emplace(*key, Bucket{.tokens = opts_.burst, .refilled = now, .dropped = 0, .first_drop = now})
      .first->second;
}

LogLimiter::Suppressed LogLimiter::TakeReport(const Key& key, Bucket* b, Clock::time_point now) {
  Suppressed s{.kind = key.first,
               .uid = key.second,
               .count = b->dropped,
               .seconds = std::chrono::duration<double>(now - b->first_drop).count()};
  b->dropped = 0;
  return s;
}

bool LogLimiter::Admit(std::string_view kind, uint32_t uid, Clock::time_point now, Suppressed* report) {
  std::lock_guard lk(mu_);
  Key key;
  Bucket& b = BucketFor(kind, uid, now, &key);
  Refill(&b, now);
  *report = Suppressed{};
  if (b.tokens < 1) {
    if (b.dropped++ == 0) b.first_drop = now;
    return false;
  }
  b.tokens -= 1;
  if (b.dropped > 0) *report = TakeReport(key, &b, now);
  return true;
}

std::vector<LogLimiter::Suppressed> LogLimiter::TakeEnded(Clock::time_point now, bool all) {
  std::lock_guard lk(mu_);
  std::vector<Suppressed> ended;
  auto take = [&](const Key& key, Bucket* b) {
    if (b->dropped == 0) return;
    Refill(b, now);
    if (all || b->tokens >= 1) ended.push_back(TakeReport(key, b, now));
  };
  for (auto& [key, b] : buckets_) take(key, &b);
  if (overflow_used_) take(Key(std::string(kOverflowKind), kLogAnyUid), &overflow_);
  return ended;
}

size_t LogLimiter::keys() const {
  std::lock_guard lk(mu_);
  return buckets_.size();
}

}  // namespace ckptfs
