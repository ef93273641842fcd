// Keeps a long sequential write (a pack being sealed: gigabytes) from
// filling the page cache with dirty pages. Left alone, the kernel holds
// every written page until writeback catches up and then until memory is
// needed, so each new page is a fresh allocation; on the 2-core VM the
// benches run on, writing 4 GiB that way cost 7-11 s of system CPU, and
// 1 s when the writer kept its footprint to a few windows, as PostgreSQL's
// *_flush_after and RocksDB's bytes_per_sync do. Every `window` bytes, the
// writer starts writeback of the window it just filled, waits for the one
// before, and drops that one's pages, so the pages are recycled.
// Advice only: a failed call changes nothing about what is written, and
// durability still comes from the caller's fdatasync alone.
#pragma once

#include <cstdint>

#include "base/env.h"

namespace ckptfs {

class WriteBehind {
 public:
  static constexpr uint64_t kDefaultWindow = 16 << 20;

  WriteBehind(Env* env, int fd, uint64_t window = kDefaultWindow) : env_(env), fd_(fd), window_(window) {}

  // Bytes [0, end) of the file are written (the writer appends in order).
  void Wrote(uint64_t end);

 private:
  Env* const env_;
  const int fd_;
  const uint64_t window_;
  uint64_t started_ = 0;  // writeback started for everything below
  uint64_t dropped_ = 0;  // written back and dropped below
};

}  // namespace ckptfs
