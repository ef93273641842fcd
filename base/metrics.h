// The daemon's live figures (issue 19, `-o metrics` and `ckptfs top`):
// counters and a histogram bumped where the events happen (store/ seals,
// fuse/ reads and error replies, codec/ lossy pieces), as relaxed atomics so
// that counting costs a few nanoseconds and no lock. One registry per
// process, as Prometheus client libraries keep one by default: a daemon
// serves one mount, and the unit tests compare before and after.
// Gauges (bytes in the store, the seal queue, the chunk cache) are not
// kept here: they are read from their owners when a sample is taken
// (fuse/ Filesystem::SampleMetrics), and the text format of a sample is
// base/metrics_text.h's.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace ckptfs {

class Counter {
 public:
  void Add(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

// Cumulative buckets with fixed upper bounds, as Prometheus histograms are.
class ErrorHistogram {
 public:
  // Relative errors, from well below the tightest fidelity to 1 (+Inf last).
  static constexpr std::array<double, 10> kBounds = {1e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0};
  void Observe(double v);
  struct Snapshot {
    std::array<uint64_t, kBounds.size() + 1> cumulative{};  // <= each bound, then +Inf (= count)
    double sum = 0;
    uint64_t count() const { return cumulative.back(); }
  };
  Snapshot Take() const;

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> buckets_{};  // not cumulative
  std::atomic<double> sum_{0};
};

struct Metrics {
  Counter sealed_files;       // packs published by seals (recovery's too)
  Counter sealed_bytes;       // their logical bytes
  Counter sealed_pack_bytes;  // the bytes those packs take
  Counter seal_nanoseconds;   // time spent coding and publishing them
  Counter read_bytes;         // bytes replied to reads through the mount
  Counter read_requests;      // FUSE read requests answered
  Counter chunk_decodes;      // chunks decoded (a file's or a delta base's), whoever asked
  Counter chunk_decoded_bytes;  // their decoded bytes: over read_bytes, the decode work per byte read
  Counter chunk_decodes_ahead;  // of those, decoded by decode-ahead's pool rather than for a waiting read
  Counter read_nanoseconds;     // from a FUSE read's arrival to its reply: over read_requests, the latency
  Counter pages_pushed_bytes;   // unread bytes of evicted chunks stored into the kernel's page cache
  Counter pages_push_dropped;   // evicted chunks with unread bytes that could not be pushed (queue full)
  Counter eio_errors;         // requests answered EIO: a checksum or the backing store failed
  Counter enospc_errors;      // requests answered ENOSPC or EDQUOT
  Counter seal_failures;      // seals that failed and wait for a retry
  // The relative error of each lossy-coded piece of a tensor, as the coder
  // measured it against the bound it was given.
  ErrorHistogram lossy_error;
};

Metrics& GlobalMetrics();

}  // namespace ckptfs
