#include "codec/lossy/lossy_chunk.h"

#include <string>

#include "codec/lossless/byte_io.h"

namespace ckptfs::lossy {
namespace {

using lossless::ByteReader;

Status Malformed(const std::string& what) { return Status::Corruption("lossy chunk: " + what); }

}  // namespace

Status DecodeLossyChunk(std::span<const uint8_t> stored, std::span<const uint8_t> base, std::span<uint8_t> out) {
  ByteReader r(stored);
  uint8_t version = 0;
  RETURN_IF_ERROR(r.Byte(&version, "version"));
  if (version != kLossyChunkVersion) return Malformed("unknown version " + std::to_string(version));
  uint64_t count = 0;
  RETURN_IF_ERROR(r.Varint(&count, "segment count"));
  if (count > out.size() + 1) return Malformed("more segments than bytes");
  struct Seg {
    uint8_t kind;
    uint64_t raw, stored;
  };
  std::vector<Seg> segs(count);
  uint64_t raw_total = 0;
  for (Seg& s : segs) {
    RETURN_IF_ERROR(r.Byte(&s.kind, "segment kind"));
    RETURN_IF_ERROR(r.Varint(&s.raw, "segment length"));
    RETURN_IF_ERROR(r.Varint(&s.stored, "segment stored length"));
    if (s.kind > 1 || s.raw > out.size() - raw_total) return Malformed("bad segment header");
    raw_total += s.raw;
  }
  if (raw_total != out.size()) return Malformed("segments do not add up to the chunk");
  uint64_t pos = 0;
  for (const Seg& s : segs) {
    std::span<const uint8_t> blob;
    RETURN_IF_ERROR(r.Bytes(s.stored, &blob, "segment payload"));
    std::span<uint8_t> dst = out.subspan(pos, s.raw);
    if (s.kind == static_cast<uint8_t>(SegmentCoding::kLossless)) {
      RETURN_IF_ERROR(DecodeTensorChunk(blob, dst));
    } else {
      std::span<const uint8_t> b = base.size() >= pos + s.raw ? base.subspan(pos, s.raw) : std::span<const uint8_t>{};
      RETURN_IF_ERROR(DecodePiece(blob, b, dst));
    }
    pos += s.raw;
  }
  if (r.remaining() != 0) return Malformed("trailing bytes");
  return Status::Ok();
}

}  // namespace ckptfs::lossy
