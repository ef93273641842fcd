#include "codec/formats/forward_reader.h"

#include <algorithm>

#include "codec/formats/limits.h"

namespace ckptfs::formats {
namespace {

constexpr uint64_t kWindow = 64 * 1024;

}  // namespace

Result<uint8_t> ForwardReader::Byte() {
  if (pos_ >= end_) return Malformed("field past the end of its container");
  if (pos_ < win_off_ || pos_ >= win_off_ + win_.size()) {
    win_.resize(std::min<uint64_t>(kWindow, end_ - pos_));
    RETURN_IF_ERROR(src_.ReadAt(pos_, win_));
    win_off_ = pos_;
  }
  return win_[pos_++ - win_off_];
}

Result<uint64_t> ForwardReader::BigEndian(unsigned n) {
  uint64_t v = 0;
  for (unsigned i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(uint8_t b, Byte());
    v = (v << 8) | b;
  }
  return v;
}

Result<uint64_t> ForwardReader::LittleEndian(unsigned n) {
  uint64_t v = 0;
  for (unsigned i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(uint8_t b, Byte());
    v |= uint64_t{b} << (8 * i);
  }
  return v;
}

Result<std::string> ForwardReader::String(uint64_t n) {
  if (n > kMaxNameBytes) return Malformed("string field too long");
  if (n > left()) return Malformed("string past the end of its container");
  std::string s;
  s.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(uint8_t b, Byte());
    s.push_back(static_cast<char>(b));
  }
  return s;
}

Status ForwardReader::Skip(uint64_t n) {
  if (n > left()) return Malformed("field past the end of its container");
  pos_ += n;
  return Status::Ok();
}

}  // namespace ckptfs::formats
