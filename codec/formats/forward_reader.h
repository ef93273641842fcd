// Forward reads of a ByteSource through a window, for formats walked field
// by field (protobuf, msgpack): thousands of small fields cost a few reads,
// and skipping a large field costs none.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codec/formats/layout.h"

namespace ckptfs::formats {

class ForwardReader {
 public:
  // Reads [pos, end) of `src`; `end` must be within the source.
  ForwardReader(const ByteSource& src, uint64_t pos, uint64_t end) : src_(src), pos_(pos), end_(end) {}
  uint64_t pos() const { return pos_; }
  uint64_t end() const { return end_; }
  uint64_t left() const { return end_ - pos_; }
  bool done() const { return pos_ >= end_; }

  Result<uint8_t> Byte();
  // n bytes, big-endian (msgpack lengths and integers).
  Result<uint64_t> BigEndian(unsigned n);
  // n bytes, little-endian (protobuf fixed fields).
  Result<uint64_t> LittleEndian(unsigned n);
  // A string field of at most kMaxNameBytes.
  Result<std::string> String(uint64_t n);
  Status Skip(uint64_t n);

 private:
  const ByteSource& src_;
  uint64_t pos_, end_;
  std::vector<uint8_t> win_;
  uint64_t win_off_ = 0;
};

}  // namespace ckptfs::formats
