#include "codec/formats/limits.h"

#include <algorithm>

#include "base/le.h"

namespace ckptfs::formats {

std::optional<uint64_t> NumElements(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) {
    auto m = CheckedMul(n, d);
    if (!m) return std::nullopt;
    n = *m;
  }
  return n;
}

Result<std::vector<uint8_t>> ReadBounded(const ByteSource& src, uint64_t off, uint64_t len, const char* what) {
  if (!InRange(off, len, src.size())) return Malformed(std::string(what) + " extends past end of file");
  if (len > kMaxMetadataBytes) return Malformed(std::string(what) + " too large");
  std::vector<uint8_t> out(len);
  RETURN_IF_ERROR(src.ReadAt(off, out));
  return out;
}

Status Cursor::Fill(std::span<uint8_t> out) {
  constexpr uint64_t kBuf = 64 << 10;
  size_t done = 0;
  while (done < out.size()) {
    if (pos_ < buf_off_ || pos_ >= buf_off_ + buf_.size()) {
      if (pos_ >= src_.size()) return Malformed("unexpected end of file");
      buf_.resize(std::min<uint64_t>(kBuf, src_.size() - pos_));
      buf_off_ = pos_;
      RETURN_IF_ERROR(src_.ReadAt(pos_, buf_));
    }
    size_t from = pos_ - buf_off_;
    size_t n = std::min<size_t>(out.size() - done, buf_.size() - from);
    std::copy_n(buf_.begin() + from, n, out.begin() + done);
    done += n;
    pos_ += n;
  }
  return Status::Ok();
}

Result<uint8_t> Cursor::U8() {
  uint8_t b[1];
  RETURN_IF_ERROR(Fill(b));
  return b[0];
}
Result<uint32_t> Cursor::U32() {
  uint8_t b[4];
  RETURN_IF_ERROR(Fill(b));
  return le::Get32(b, 0);
}
Result<uint64_t> Cursor::U64() {
  uint8_t b[8];
  RETURN_IF_ERROR(Fill(b));
  return le::Get64(b, 0);
}
Status Cursor::Skip(uint64_t n) {
  if (!InRange(pos_, n, src_.size())) return Malformed("skip past end of file");
  pos_ += n;
  return Status::Ok();
}
Result<std::string> Cursor::String(uint64_t len) {
  if (len > kMaxNameBytes) return Malformed("string too long");
  if (!InRange(pos_, len, src_.size())) return Malformed("string past end of file");
  std::string s(len, '\0');
  RETURN_IF_ERROR(Fill(std::span<uint8_t>(reinterpret_cast<uint8_t*>(s.data()), len)));
  return s;
}

}  // namespace ckptfs::formats
