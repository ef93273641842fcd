#include <algorithm>
#include <string>
#include <vector>

#include "codec/delta_pieces.h"
#include "codec/lossless/byte_io.h"
#include "codec/lossy/lossy_chunk.h"

namespace ckptfs::lossy {
namespace {

using lossless::ByteReader;

Status Malformed(const std::string& what) { return Status::Corruption("lossy chunk: " + what); }

struct Seg {
  uint8_t kind = 0;
  uint64_t raw = 0, stored = 0;
};

Status ReadSegments(ByteReader& r, uint8_t version, uint64_t chunk_len, std::vector<Seg>* segs) {
  uint64_t count = 0;
  RETURN_IF_ERROR(r.Varint(&count, "segment count"));
  if (count > chunk_len + 1) return Malformed("more segments than bytes");
  segs->resize(count);
  uint64_t raw_total = 0;
  for (Seg& s : *segs) {
    RETURN_IF_ERROR(r.Byte(&s.kind, "segment kind"));
    RETURN_IF_ERROR(r.Varint(&s.raw, "segment length"));
    const bool own_payload = version == kLossyChunkVersionPerSegment || s.kind != 0;
    if (own_payload) RETURN_IF_ERROR(r.Varint(&s.stored, "segment stored length"));
    if (s.kind > 1 || s.raw > chunk_len - raw_total) return Malformed("bad segment header");
    raw_total += s.raw;
  }
  if (raw_total != chunk_len) return Malformed("segments do not add up to the chunk");
  return Status::Ok();
}

std::span<const uint8_t> BaseAt(std::span<const uint8_t> base, uint64_t pos, uint64_t len) {
  return base.size() >= pos + len ? base.subspan(pos, len) : std::span<const uint8_t>{};
}

// Version 2: the lossless segments' bytes come from one run, decoded
// first, XORed with the base bytes at their own positions under kXorBase.
Status DecodeLosslessRun(ByteReader& r, std::span<const Seg> segs, std::span<const uint8_t> base,
                         std::span<uint8_t> out) {
  uint8_t coding = 0;
  uint64_t stored = 0, run_len = 0;
  RETURN_IF_ERROR(r.Byte(&coding, "lossless coding"));
  RETURN_IF_ERROR(r.Varint(&stored, "lossless run length"));
  if (coding > static_cast<uint8_t>(LosslessCoding::kXorBase)) return Malformed("unknown lossless coding");
  const bool xor_base = coding == static_cast<uint8_t>(LosslessCoding::kXorBase);
  if (xor_base && base.size() != out.size()) return Malformed("lossless run coded against a base that is missing");
  for (const Seg& s : segs) run_len += s.kind == 0 ? s.raw : 0;
  std::span<const uint8_t> blob;
  RETURN_IF_ERROR(r.Bytes(stored, &blob, "lossless run"));
  if (run_len == 0) return stored == 0 ? Status::Ok() : Malformed("a lossless run without lossless segments");
  std::vector<uint8_t> run(run_len);
  RETURN_IF_ERROR(DecodeTensorChunk(blob, run));
  uint64_t pos = 0, at = 0;
  for (const Seg& s : segs) {
    if (s.kind == 0) {
      if (xor_base) {
        delta::XorBytes(run.data() + at, base.data() + pos, out.data() + pos, s.raw);
      } else {
        std::copy(run.begin() + at, run.begin() + at + s.raw, out.begin() + pos);
      }
      at += s.raw;
    }
    pos += s.raw;
  }
  return Status::Ok();
}

}  // namespace

Status DecodeLossyChunk(std::span<const uint8_t> stored, std::span<const uint8_t> base, std::span<uint8_t> out) {
  ByteReader r(stored);
  uint8_t version = 0;
  RETURN_IF_ERROR(r.Byte(&version, "version"));
  if (version != kLossyChunkVersion && version != kLossyChunkVersionPerSegment) {
    return Malformed("unknown version " + std::to_string(version));
  }
  std::vector<Seg> segs;
  RETURN_IF_ERROR(ReadSegments(r, version, out.size(), &segs));
  const bool per_segment = version == kLossyChunkVersionPerSegment;
  if (!per_segment) RETURN_IF_ERROR(DecodeLosslessRun(r, segs, base, out));
  uint64_t pos = 0;
  for (const Seg& s : segs) {
    if (!per_segment && s.kind == 0) {
      pos += s.raw;
      continue;
    }
    std::span<const uint8_t> blob;
    RETURN_IF_ERROR(r.Bytes(s.stored, &blob, "segment payload"));
    std::span<uint8_t> dst = out.subspan(pos, s.raw);
    if (s.kind == static_cast<uint8_t>(SegmentCoding::kLossless)) {
      RETURN_IF_ERROR(DecodeTensorChunk(blob, dst));
    } else {
      RETURN_IF_ERROR(DecodePiece(blob, BaseAt(base, pos, s.raw), dst));
    }
    pos += s.raw;
  }
  if (r.remaining() != 0) return Malformed("trailing bytes");
  return Status::Ok();
}

}  // namespace ckptfs::lossy
