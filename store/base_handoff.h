// A lossy zip seal reads a chunk's predecessor bytes twice: in the CRC pass
// and again in the pack's pass, a member later. For a delta successor those
// bytes are a decode of the predecessor's lossy chunk (or a chain of them),
// so the CRC pass hands them over instead, within a budget: past it, the
// pack's pass decodes them again (the same bytes, more CPU).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <tuple>
#include <vector>

#include "store/object_id.h"

namespace ckptfs {

// Predecessor bytes handed over per seal: about the lag of the CRC pass
// over a member of 64 MiB, in 4 MiB chunks.
inline constexpr uint64_t kBaseHandoffBudget = 64ull << 20;

class BaseHandoff {
 public:
  explicit BaseHandoff(uint64_t budget = kBaseHandoffBudget) : budget_(budget) {}

  // Takes `bytes` (the predecessor's bytes at `pack`, `pack_offset` for the
  // chunk at `offset`) if the budget has room; `bytes` is then empty, or
  // holds a spare buffer of an earlier hand-over (no fresh pages).
  void Put(uint64_t offset, ObjectId pack, uint64_t pack_offset, std::vector<uint8_t>* bytes);
  // Swaps the bytes put for that chunk into `out`, if any (each once).
  bool Take(uint64_t offset, ObjectId pack, uint64_t pack_offset, std::vector<uint8_t>* out);
  uint64_t held() const;

 private:
  using Key = std::tuple<uint64_t, ObjectId, uint64_t>;
  const uint64_t budget_;
  mutable std::mutex mu_;
  std::map<Key, std::vector<uint8_t>> held_;
  uint64_t held_bytes_ = 0;
  std::vector<std::vector<uint8_t>> spare_;  // buffers handed back by Take
};

}  // namespace ckptfs
