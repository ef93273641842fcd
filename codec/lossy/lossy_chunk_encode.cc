#include "codec/lossy/lossy_chunk.h"

#include <algorithm>

#include "codec/lossless/byte_io.h"

namespace ckptfs::lossy {
namespace {

using lossless::PutByte;
using lossless::PutVarint;

Status EncodeLossless(std::span<const uint8_t> raw, uint64_t offset, std::span<const TensorRange> ranges,
                      const TensorChunkOptions& opts, std::vector<uint8_t>* blob) {
  return EncodeTensorChunk(raw, offset, RangesOverlapping(ranges, offset, offset + raw.size()), opts, blob);
}

// Codes one lossy segment's elements in place; the blob goes to `blob`
// (null: to s.blob when the caller keeps it, else nowhere).
Result<PieceOutcome> CodePiece(ChunkSegment& s, std::span<const uint8_t> base, std::span<uint8_t> bytes,
                               std::vector<uint8_t>* blob, const TensorChunkOptions& opts, PieceScratch* scratch) {
  PieceInput in{bytes, base, s.weight, opts.planes.device, s.choice, scratch};
  std::vector<uint8_t> own;
  const std::span<uint8_t> recon = ScratchSpan(scratch != nullptr ? scratch->recon : own, bytes.size());
  s.blob.clear();
  if (blob == nullptr && s.keep_blob) blob = &s.blob;
  ASSIGN_OR_RETURN(PieceOutcome outcome, EncodePiece(s.spec, in, blob, recon));
  std::copy(recon.begin(), recon.end(), bytes.begin());
  return outcome;
}

// An earlier coding of the same piece: its blob decodes to the same
// reconstruction that coding gave, so the elements are rewritten from it.
Result<PieceOutcome> DecodeCoded(const CodedPiece& c, std::span<const uint8_t> base, std::span<uint8_t> bytes) {
  if (c.outcome.choice.exact) return Status::Error(EFBIG, "lossy piece: no configuration meets the error target");
  RETURN_IF_ERROR(DecodePiece(c.blob, base, bytes).WithContext("decoding a lossy piece coded in the CRC pass"));
  return c.outcome;
}

}  // namespace

Status EncodeLossyChunk(std::span<uint8_t> raw, std::span<const uint8_t> base, uint64_t chunk_offset,
                        std::span<const TensorRange> ranges, std::span<ChunkSegment> segments,
                        const TensorChunkOptions& opts, std::vector<uint8_t>* out, PieceScratch* scratch) {
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
      const std::span<const uint8_t> piece_base =
          base.size() >= s.end ? base.subspan(s.begin, bytes.size()) : std::span<const uint8_t>{};
      Result<PieceOutcome> r =
          s.coded != nullptr ? DecodeCoded(*s.coded, piece_base, bytes)
                             : CodePiece(s, piece_base, bytes, out != nullptr ? &blobs[i] : nullptr, opts, scratch);
      if (r.ok()) {
        if (s.coded != nullptr && out != nullptr) blobs[i] = s.coded->blob;
        s.outcome = *r;
        s.coded_lossy = true;
        kinds[i] = SegmentCoding::kLossy;
        continue;
      }
      if (r.status().code() != EFBIG) return r.status();
      blobs[i].clear();  // no lossy code meets the target: keep it exact
      s.blob.clear();
      s.outcome.choice.exact = true;
    }
    if (out != nullptr) RETURN_IF_ERROR(EncodeLossless(bytes, chunk_offset + s.begin, ranges, opts, &blobs[i]));
  }
  if (pos != raw.size()) return Status::InvalidArgument("lossy chunk: segments do not cover the chunk");
  if (out == nullptr) return Status::Ok();
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

}  // namespace ckptfs::lossy
