#include <algorithm>

#include "codec/delta_chunk.h"
#include "codec/delta_pieces.h"
#include "codec/lossless/byte_io.h"
#include "codec/lossy/lossy_chunk.h"

namespace ckptfs::lossy {
namespace {

using lossless::PutByte;
using lossless::PutVarint;

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

// The lossless segments' bytes back to back, and the tensor ranges
// (file-relative in `ranges`) moved to where their bytes land in that run.
// A range cut by a segment's start keeps whole elements only; its grid
// rows are dropped when the cut moves its first column.
struct LosslessRun {
  std::vector<uint8_t> bytes;
  std::vector<TensorRange> ranges;
};

LosslessRun GatherLossless(std::span<const uint8_t> raw, uint64_t chunk_offset, std::span<const TensorRange> ranges,
                           std::span<const ChunkSegment> segments, std::span<const SegmentCoding> kinds) {
  LosslessRun run;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (kinds[i] != SegmentCoding::kLossless) continue;
    const uint64_t fb = chunk_offset + segments[i].begin, fe = chunk_offset + segments[i].end;
    const uint64_t at = run.bytes.size();
    run.bytes.insert(run.bytes.end(), raw.begin() + segments[i].begin, raw.begin() + segments[i].end);
    for (const TensorRange& r : RangesOverlapping(ranges, fb, fe)) {
      const uint64_t es = DTypeSize(r.dtype);
      if (es == 0) continue;
      const uint64_t lo = r.offset + (std::max(r.offset, fb) - r.offset + es - 1) / es * es;
      const uint64_t hi = std::min(r.offset + r.length, fe);
      if (hi <= lo) continue;
      TensorRange moved = r;
      moved.offset = at + (lo - fb), moved.length = hi - lo;
      if (r.row_length != 0 && (lo - r.offset) % (r.row_length * es) != 0) moved.row_length = 0;
      run.ranges.push_back(moved);
    }
  }
  return run;
}

// XOR residuals are bit noise, not numbers: coded as the delta codec codes
// its residuals (unsigned lanes), and without grid rows.
std::vector<TensorRange> XorResidualRanges(std::span<const TensorRange> ranges) {
  std::vector<TensorRange> out = ResidualRanges(ranges);
  for (TensorRange& r : out) r.row_length = 0;
  return out;
}

// Codes the lossless bytes alone, and against the base where every
// lossless byte has one, keeping the smaller (alone on a tie: no base
// needed). Metadata between tensors (zip headers, pickle, central
// directory) barely changes from one checkpoint to the next, while coded
// alone it costs tens of bytes per tensor. Returns whether the base was used.
Result<bool> EncodeLosslessRun(const LosslessRun& run, std::span<const uint8_t> base, uint64_t chunk_offset,
                               std::span<const ChunkSegment> segments, std::span<const SegmentCoding> kinds,
                               const TensorChunkOptions& opts, std::vector<uint8_t>* blob) {
  if (run.bytes.empty()) return false;
  RETURN_IF_ERROR(EncodeTensorChunk(run.bytes, 0, run.ranges, opts, blob));
  if (base.empty()) return false;
  std::vector<uint8_t> residual(run.bytes.size());
  uint64_t at = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (kinds[i] != SegmentCoding::kLossless) continue;
    const uint64_t n = segments[i].end - segments[i].begin;
    delta::XorBytes(run.bytes.data() + at, base.data() + segments[i].begin, residual.data() + at, n);
    at += n;
  }
  std::vector<uint8_t> alt;
  RETURN_IF_ERROR(EncodeTensorChunk(residual, 0, XorResidualRanges(run.ranges), opts, &alt));
  if (alt.size() >= blob->size()) return false;
  *blob = std::move(alt);
  return true;
}

}  // namespace

Status EncodeLossyChunk(std::span<uint8_t> raw, std::span<const uint8_t> base, uint64_t chunk_offset,
                        std::span<const TensorRange> ranges, std::span<ChunkSegment> segments,
                        const TensorChunkOptions& opts, std::vector<uint8_t>* out, PieceScratch* scratch,
                        bool* lossless_against_base) {
  if (lossless_against_base != nullptr) *lossless_against_base = false;
  std::vector<std::vector<uint8_t>> blobs(segments.size());
  std::vector<SegmentCoding> kinds(segments.size(), SegmentCoding::kLossless);
  uint64_t pos = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    ChunkSegment& s = segments[i];
    if (s.begin != pos || s.end < s.begin || s.end > raw.size()) {
      return Status::InvalidArgument("lossy chunk: segments must cover the chunk in order");
    }
    pos = s.end;
    if (!s.lossy) continue;
    std::span<uint8_t> bytes = raw.subspan(s.begin, s.end - s.begin);
    s.coded_lossy = false;
    const std::span<const uint8_t> piece_base =
        base.size() >= s.end ? base.subspan(s.begin, bytes.size()) : std::span<const uint8_t>{};
    Result<PieceOutcome> r = s.coded != nullptr
                                 ? DecodeCoded(*s.coded, piece_base, bytes)
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
  if (pos != raw.size()) return Status::InvalidArgument("lossy chunk: segments do not cover the chunk");
  if (out == nullptr) return Status::Ok();
  const LosslessRun run = GatherLossless(raw, chunk_offset, ranges, segments, kinds);
  std::vector<uint8_t> lossless;
  const std::span<const uint8_t> whole_base = base.size() == raw.size() ? base : std::span<const uint8_t>{};
  ASSIGN_OR_RETURN(const bool against_base,
                   EncodeLosslessRun(run, whole_base, chunk_offset, segments, kinds, opts, &lossless));
  if (lossless_against_base != nullptr) *lossless_against_base = against_base;
  // Exact pieces are coded within the lossless run: each is given its share
  // of it by raw length, so that the statistics keep them with their role.
  for (size_t i = 0; i < segments.size(); ++i) {
    const ChunkSegment& s = segments[i];
    segments[i].stored = kinds[i] == SegmentCoding::kLossy ? blobs[i].size()
                         : s.lossy                         ? lossless.size() * (s.end - s.begin) / run.bytes.size()
                                                           : 0;
  }
  PutByte(out, kLossyChunkVersion);
  PutVarint(out, segments.size());
  for (size_t i = 0; i < segments.size(); ++i) {
    PutByte(out, static_cast<uint8_t>(kinds[i]));
    PutVarint(out, segments[i].end - segments[i].begin);
    if (kinds[i] == SegmentCoding::kLossy) PutVarint(out, blobs[i].size());
  }
  PutByte(out, static_cast<uint8_t>(against_base ? LosslessCoding::kXorBase : LosslessCoding::kAlone));
  PutVarint(out, lossless.size());
  out->insert(out->end(), lossless.begin(), lossless.end());
  for (const auto& b : blobs) out->insert(out->end(), b.begin(), b.end());
  return Status::Ok();
}

}  // namespace ckptfs::lossy
