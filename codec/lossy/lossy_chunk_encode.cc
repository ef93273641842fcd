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
      PieceInput in{bytes, base.size() >= s.end ? base.subspan(s.begin, bytes.size()) : std::span<const uint8_t>{},
                    s.weight, opts.planes.device, s.choice, scratch};
      std::vector<uint8_t> own;
      const std::span<uint8_t> recon = ScratchSpan(scratch != nullptr ? scratch->recon : own, bytes.size());
      Result<PieceOutcome> r = EncodePiece(s.spec, in, out != nullptr ? &blobs[i] : nullptr, recon);
      if (r.ok()) {
        std::copy(recon.begin(), recon.end(), bytes.begin());
        s.outcome = *r;
        s.coded_lossy = true;
        kinds[i] = SegmentCoding::kLossy;
        continue;
      }
      if (r.status().code() != EFBIG) return r.status();
      blobs[i].clear();  // no lossy code meets the target: keep it exact
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
