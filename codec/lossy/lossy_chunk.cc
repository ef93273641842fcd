#include "codec/lossy/lossy_chunk.h"

#include "codec/lossless/byte_io.h"

namespace ckptfs::lossy {
namespace {

using lossless::ByteReader;
using lossless::PutByte;
using lossless::PutVarint;

enum class SegmentCoding : uint8_t { kLossless = 0, kLossy = 1 };

Status Malformed(const std::string& what) { return Status::Corruption("lossy chunk: " + what); }

Status EncodeLossless(std::span<const uint8_t> raw, uint64_t offset, std::span<const TensorRange> ranges,
                      const TensorChunkOptions& opts, std::vector<uint8_t>* blob) {
  return EncodeTensorChunk(raw, offset, RangesOverlapping(ranges, offset, offset + raw.size()), opts, blob);
}

}  // namespace

Status EncodeLossyChunk(std::span<uint8_t> raw, std::span<const uint8_t> base, uint64_t chunk_offset,
                        std::span<const TensorRange> ranges, std::span<ChunkSegment> segments,
                        const TensorChunkOptions& opts, std::vector<uint8_t>* out) {
  std::vector<std::vector<uint8_t>> blobs(segments.size());
  std::vector<SegmentCoding> kinds(segments.size(), SegmentCoding::kLossless);
  uint64_t pos = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    ChunkSegment& s = segments[i];
    if (s.begin != pos || s.end < s.begin || s.end > raw.size()) {
      return Status::InvalidArgument("lossy chunk: segments must cover the chunk in order");
    }
    pos = s.end;
    std::span<uint8_t> bytes = raw.subspan(s.begin, s.end - s.begin);
    s.coded_lossy = false;
    if (s.lossy) {
      PieceInput in{bytes, base.size() >= s.end ? base.subspan(s.begin, bytes.size()) : std::span<const uint8_t>{},
                    s.weight, opts.planes.device};
      std::vector<uint8_t> recon(bytes.size());
      Result<PieceOutcome> r = EncodePiece(s.spec, in, &blobs[i], recon);
      if (r.ok()) {
        std::copy(recon.begin(), recon.end(), bytes.begin());
        s.outcome = *r;
        s.coded_lossy = true;
        kinds[i] = SegmentCoding::kLossy;
        continue;
      }
      if (r.status().code() != EFBIG) return r.status();
      blobs[i].clear();  // no lossy code meets the target: keep it exact
    }
    RETURN_IF_ERROR(EncodeLossless(bytes, chunk_offset + s.begin, ranges, opts, &blobs[i]));
  }
  if (pos != raw.size()) return Status::InvalidArgument("lossy chunk: segments do not cover the chunk");
  for (size_t i = 0; i < segments.size(); ++i) segments[i].stored = blobs[i].size();
  PutByte(out, kLossyChunkVersion);
  PutVarint(out, segments.size());
  for (size_t i = 0; i < segments.size(); ++i) {
    PutByte(out, static_cast<uint8_t>(kinds[i]));
    PutVarint(out, segments[i].end - segments[i].begin);
    PutVarint(out, blobs[i].size());
  }
  for (const auto& b : blobs) out->insert(out->end(), b.begin(), b.end());
  return Status::Ok();
}

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
