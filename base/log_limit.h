// Rate limits for log lines that users can cause: a token bucket per
// (kind, uid), so that one user's flood of failing calls costs a few lines
// a second, and does not silence another user's lines or other kinds.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ckptfs {

// The uid of a line no single user caused (or whose user is unknown).
inline constexpr uint32_t kLogAnyUid = 0xffffffffu;

struct LogLimitOptions {
  double burst = 10;       // lines a key may log at once
  double per_second = 1;   // and then, on average
  size_t max_keys = 1024;  // keys tracked; beyond, new keys share one bucket
};

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  // The lines of one key dropped since it last logged.
  struct Suppressed {
    std::string kind;
    uint32_t uid = kLogAnyUid;
    uint64_t count = 0;
    double seconds = 0;  // from the first dropped line to the report
  };

  explicit LogLimiter(LogLimitOptions opts = {}) : opts_(opts) {}

  // Whether a line of `kind` caused by `uid` may be logged at `now`. When it
  // may, and lines of that key were dropped before, `*report` gets their
  // count (to log first); otherwise report->count is 0.
  bool Admit(std::string_view kind, uint32_t uid, Clock::time_point now, Suppressed* report);
  // The keys whose dropping has ended by `now` (they may log again), or
  // every key with dropped lines when `all` (at shutdown); their counts
  // start again from 0.
  std::vector<Suppressed> TakeEnded(Clock::time_point now, bool all);
  size_t keys() const;

 private:
  struct Bucket {
    double tokens = 0;
    Clock::time_point refilled;
    uint64_t dropped = 0;
    Clock::time_point first_drop;
  };
  using Key = std::pair<std::string, uint32_t>;

  Bucket& BucketFor(std::string_view kind, uint32_t uid, Clock::time_point now, Key* key);
  void Refill(Bucket* b, Clock::time_point now) const;
  void EvictIdle(Clock::time_point now);
  static Suppressed TakeReport(const Key& key, Bucket* b, Clock::time_point now);

  const LogLimitOptions opts_;
  mutable std::mutex mu_;
  std::map<Key, Bucket, std::less<>> buckets_;
  Bucket overflow_;  // all new keys' once the map is full
  bool overflow_used_ = false;
};

}  // namespace ckptfs
