// A pass over a file's chunks that must run ahead of the pack's pass, but
// only as far as the pack's pass needs it: the lossy zip seal's CRC pass
// (codec/lossy/file_coder.h), whose chunk i must be done before any chunk
// holding the CRC field of a member that i belongs to is coded for the
// pack. Whatever the leading pass keeps for the pack's pass (the pieces'
// blobs) then lives for about a member's worth of chunks, not a file's.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>

#include "base/status.h"

namespace ckptfs {

class LeadingPass {
 public:
  // `run(offset, len)` does the pass's work on one chunk; any thread may
  // call it, for any chunk, once each.
  using ChunkFn = std::function<Status(uint64_t offset, uint64_t len)>;

  LeadingPass(uint64_t size, uint32_t chunk_size);

  // Returns once every chunk starting before `end` has been run. The
  // calling thread runs chunks (with its own `run`) while any that some
  // caller asked for are left, before waiting: a worker whose own chunk is
  // ready still helps with a member another worker waits on, as the pack
  // appends in file order anyway. The first failure is every later
  // caller's answer.
  Status RunThrough(uint64_t end, const ChunkFn& run);

 private:
  void MarkDone(uint64_t chunk);  // with mu_ held

  const uint64_t size_;
  const uint32_t chunk_size_;
  const uint64_t chunks_;
  std::mutex mu_;
  std::condition_variable done_cv_;
  uint64_t next_ = 0;          // the next chunk to hand out
  uint64_t wanted_ = 0;        // chunks [0, wanted_) were asked for
  uint64_t done_through_ = 0;  // chunks [0, done_through_) are done
  std::set<uint64_t> done_;    // done ones past done_through_
  Status failure_;
};

}  // namespace ckptfs
