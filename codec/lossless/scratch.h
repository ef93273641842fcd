// Per-thread reusable buffers for the codec's hot paths. A fresh multi-MiB
// vector per chunk costs page faults and kernel zeroing that rival the
// coding itself; these grow once per thread and are never zero-filled again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ckptfs::lossless {

// Distinct slots for buffers that are alive at the same time.
// kLossySymbols: a lossy piece's symbols while it decodes (codec/lossy).
enum class ScratchSlot : int { kPlanes = 0, kSplit, kRans, kLossySymbols, kCount };

inline std::span<uint8_t> Scratch(ScratchSlot slot, size_t n) {
  thread_local std::vector<uint8_t> bufs[static_cast<int>(ScratchSlot::kCount)];
  std::vector<uint8_t>& b = bufs[static_cast<int>(slot)];
  if (b.size() < n) b.resize(n);
  return {b.data(), n};
}

}  // namespace ckptfs::lossless
