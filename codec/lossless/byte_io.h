// Bounds-checked little-endian readers and writers for the lossless codec's
// headers. Every read is checked so that a truncated or corrupted blob ends
// in Status::Corruption instead of an out-of-bounds access.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace ckptfs::lossless {

inline void PutByte(std::vector<uint8_t>* out, uint8_t v) { out->push_back(v); }

inline void PutU32(std::vector<uint8_t>* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// LEB128: lengths and counts are usually small, and a fixed 8-byte field per
// plane would be a visible share of the blob for small tensors.
inline void PutVarint(std::vector<uint8_t>* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<uint8_t>(v));
}

// A varint padded to exactly 10 bytes (redundant continuation groups), so a
// length can be patched in after the bytes it describes were appended.
// Readers decode it like any other varint.
inline void PutVarint10At(std::vector<uint8_t>* out, size_t at, uint64_t v) {
  for (int i = 0; i < 9; ++i) {
    (*out)[at + i] = static_cast<uint8_t>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  (*out)[at + 9] = static_cast<uint8_t>(v & 0x7F);
}

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> b) : b_(b) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return b_.size() - pos_; }
  std::span<const uint8_t> Rest() const { return b_.subspan(pos_); }

  Status Byte(uint8_t* v, const char* what) {
    if (remaining() < 1) return Truncated(what);
    *v = b_[pos_++];
    return Status::Ok();
  }

  Status U32(uint32_t* v, const char* what) {
    if (remaining() < 4) return Truncated(what);
    uint32_t x = 0;
    for (int i = 0; i < 4; ++i) x |= static_cast<uint32_t>(b_[pos_ + i]) << (8 * i);
    pos_ += 4;
    *v = x;
    return Status::Ok();
  }

  Status Varint(uint64_t* v, const char* what) {
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (remaining() < 1) return Truncated(what);
      uint8_t byte = b_[pos_++];
      // The 10th byte may only contribute the top bit of a 64-bit value.
      if (shift == 63 && byte > 1) break;
      x |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) {
        *v = x;
        return Status::Ok();
      }
    }
    return Status::Corruption(std::string("varint overflow in ") + what + " at offset " + std::to_string(pos_));
  }

  Status Bytes(size_t n, std::span<const uint8_t>* v, const char* what) {
    if (remaining() < n) return Truncated(what);
    *v = b_.subspan(pos_, n);
    pos_ += n;
    return Status::Ok();
  }

 private:
  Status Truncated(const char* what) const {
    return Status::Corruption(std::string("lossless blob truncated reading ") + what + " at offset " +
                              std::to_string(pos_) + " of " + std::to_string(b_.size()));
  }

  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

}  // namespace ckptfs::lossless
