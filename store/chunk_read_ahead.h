// Reads of a pack's stored chunks started before they are needed. A delta
// seal reads its predecessor's chunks about in file order, one for each
// chunk it codes, and a direct read (store/direct_read.h) leaves the kernel
// nothing to read ahead: each would cost its worker a wait for the disk.
// On the benches' VM, the workers of a 1 GiB delta successor's seal spent
// 1.2-1.6 s reading and decoding its predecessor's chunks without reading
// ahead, 0.76-0.81 s with it, and the seal took 1.74-1.81 s instead of
// 1.93-2.35 s. Each read ahead runs on a thread of its own, into a buffer
// kept for the next.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "base/status.h"
#include "store/pack_bytes.h"

namespace ckptfs {

class ChunkReadAhead {
 public:
  // Reads held at once (in flight or waiting to be taken), at most.
  static constexpr size_t kMaxHeld = 4;
  // A read held for a chunk this far behind one taken is dropped: its
  // chunk was not wanted after all (a dedup hit needs no base).
  static constexpr uint64_t kStale = 2 * kMaxHeld;

  // `source` outlives this; `chunks` is the pack's chunk count.
  ChunkReadAhead(const PackBytes* source, uint64_t chunks) : source_(source), seen_(chunks, false) {}
  ~ChunkReadAhead();  // waits for the reads in flight
  ChunkReadAhead(const ChunkReadAhead&) = delete;
  ChunkReadAhead& operator=(const ChunkReadAhead&) = delete;

  // Starts reading chunk `index`'s stored bytes, [off, off + len), unless
  // that chunk was asked for already (read ahead or read), or kMaxHeld
  // reads are held.
  void Start(uint64_t index, uint64_t off, size_t len);

  // Copies chunk `index`'s bytes read ahead into `out` (its stored size),
  // waiting for them if the read is in flight; false when none were
  // started or the read failed: the caller then reads the chunk itself, and
  // meets any failure there. Reads held for chunks kStale or more before
  // it are dropped. Either way, `index` is not read ahead after this.
  bool TakeInto(uint64_t index, std::span<uint8_t> out);

 private:
  // One read's buffer and outcome (reused: a fresh buffer per chunk would
  // cost page faults for every page the read lands in).
  struct Early {
    AlignedBuffer room;
    Status status;
    std::span<const uint8_t> bytes;
  };
  struct Held {
    uint64_t index;
    std::unique_ptr<Early> early;
    std::future<void> done;
  };
  std::unique_ptr<Early> SpareEarly();  // with mu_ held

  const PackBytes* const source_;
  std::mutex mu_;
  std::vector<bool> seen_;  // asked for: read ahead, or read
  std::vector<Held> held_;
  std::vector<std::unique_ptr<Early>> spare_;  // buffers of reads taken, while others are held
};

}  // namespace ckptfs
