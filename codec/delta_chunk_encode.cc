#include "codec/delta_chunk.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "codec/compute_device.h"
#include "codec/delta_pieces.h"
#include "codec/element_ops.h"
#include "codec/lossless/byte_io.h"

namespace ckptfs {
namespace {

using delta::DeltaPiece;
using delta::XorBytes;
using lossless::PutByte;
using lossless::PutVarint;

// The sample that picks the kind: slices spread over the chunk, since a
// chunk can hold a frozen tensor next to a trained one.
constexpr uint64_t kSampleSlice = 64 << 10;
constexpr uint64_t kSampleSlices = 4;

// Complex parts are floats of their own; a lane spanning both would let the
// borrow of the real part's difference spill into the imaginary part's.
unsigned LaneSize(DType t) {
  if (t == DType::kC64) return 4;
  if (t == DType::kC128) return 8;
  return DTypeSize(t);
}

DType UnsignedOfSize(unsigned w) {
  switch (w) {
    case 1:
      return DType::kU8;
    case 2:
      return DType::kU16;
    case 4:
      return DType::kU32;
    case 8:
      return DType::kU64;
    default:
      return DType::kUnknown;
  }
}

// The tensor pieces the tensor chunk codec will cut from the residual, less
// 1-byte lanes (nothing to carry) and a trailing partial element.
std::vector<DeltaPiece> IntDiffPieces(uint64_t chunk_offset, uint64_t len, std::span<const TensorRange> residual) {
  std::vector<DeltaPiece> out;
  for (const ChunkPiece& p : CutChunk(chunk_offset, len, residual)) {
    const unsigned w = DTypeSize(p.dtype);
    if (w != 2 && w != 4 && w != 8) continue;
    const uint64_t end = p.begin + (p.end - p.begin) / w * w;
    if (end > p.begin) out.push_back({p.begin, end, w});
  }
  return out;
}

// The lane arithmetic is codec/element_ops.h's, which the GPU shares.
template <typename U>
void DiffLanes(const uint8_t* raw, const uint8_t* base, uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; i += sizeof(U)) {
    U a, b;
    std::memcpy(&a, raw + i, sizeof(U));
    std::memcpy(&b, base + i, sizeof(U));
    const U z = ops::ZigZagDiff<U>(a, b);
    std::memcpy(out + i, &z, sizeof(U));
  }
}

void Diff(unsigned w, const uint8_t* raw, const uint8_t* base, uint8_t* out, size_t n) {
  if (w == 2) DiffLanes<uint16_t>(raw, base, out, n);
  if (w == 4) DiffLanes<uint32_t>(raw, base, out, n);
  if (w == 8) DiffLanes<uint64_t>(raw, base, out, n);
}

// What every encoding step needs about one chunk.
struct DeltaInput {
  std::span<const uint8_t> raw;
  std::span<const uint8_t> base;
  uint64_t chunk_offset = 0;
  std::span<const TensorRange> ranges;       // retyped (ResidualRanges)
  std::span<const TensorRange> file_ranges;  // as the caller gave them
  std::span<const DeltaPiece> pieces;        // IntDiffPieces
  const TensorChunkOptions* opts = nullptr;
};

// The residual of chunk bytes [begin, end) into out[0, end - begin). A lane
// cut by the window's edge is XOR'ed; only sample windows have such edges,
// and the sample needs no exact residual.
void MakeResidual(DeltaKind kind, const DeltaInput& in, uint64_t begin, uint64_t end, uint8_t* out) {
  const uint8_t* raw = in.raw.data();
  const uint8_t* base = in.base.data();
  uint64_t pos = begin;
  if (kind == DeltaKind::kIntDiff) {
    for (const DeltaPiece& p : in.pieces) {
      if (p.begin >= end) break;
      const uint64_t w = p.width;
      const uint64_t b = p.begin + (std::max(begin, p.begin) - p.begin + w - 1) / w * w;
      const uint64_t e = p.begin + (std::max(std::min(end, p.end), p.begin) - p.begin) / w * w;
      if (b >= e) continue;
      XorBytes(raw + pos, base + pos, out + (pos - begin), b - pos);
      Diff(p.width, raw + b, base + b, out + (b - begin), e - b);
      pos = e;
    }
  }
  XorBytes(raw + pos, base + pos, out + (pos - begin), end - pos);
}

// One buffer per thread for the residual: a fresh chunk-sized vector per
// call would cost page faults and zeroing comparable to the XOR itself.
std::span<uint8_t> ResidualScratch(size_t n) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < n) buf.resize(n);
  return {buf.data(), n};
}

// The whole chunk's residual, on the options' device when it takes jobs
// this big (same bytes as MakeResidual; a failed job falls back to it).
void WholeResidual(DeltaKind kind, const DeltaInput& in, std::span<uint8_t> residual) {
  const ComputeDevice* device = in.opts->planes.device;
  if (Offload(device, in.raw.size())) {
    std::vector<LaneRun> runs;
    if (kind == DeltaKind::kIntDiff) {
      runs.reserve(in.pieces.size());
      for (const DeltaPiece& p : in.pieces) runs.push_back({p.begin, p.end, p.width});
    }
    if (device->Residual({in.raw, in.base, runs, residual}).ok()) return;
  }
  MakeResidual(kind, in, 0, in.raw.size(), residual.data());
}

Status EncodeKind(DeltaKind kind, const DeltaInput& in, std::vector<uint8_t>* out) {
  std::span<uint8_t> residual = ResidualScratch(in.raw.size());
  WholeResidual(kind, in, residual);
  const size_t start = out->size();
  PutByte(out, kDeltaChunkVersion);
  PutByte(out, static_cast<uint8_t>(kind));
  if (kind == DeltaKind::kIntDiff) {
    PutVarint(out, in.pieces.size());
    for (const DeltaPiece& p : in.pieces) {
      PutVarint(out, p.begin);
      PutVarint(out, p.end);
      PutByte(out, static_cast<uint8_t>(p.width));
    }
  }
  Status s = EncodeTensorChunk(residual, in.chunk_offset, in.ranges, *in.opts, out);
  if (!s.ok()) out->resize(start);  // leave `out` as the caller gave it
  return s;
}

uint64_t SliceStart(uint64_t len, uint64_t i) { return (len - kSampleSlice) * i / (kSampleSlices - 1); }

// Coded size of `kind`'s residual over the sample slices.
Result<uint64_t> SampleSize(DeltaKind kind, const DeltaInput& in) {
  thread_local std::vector<uint8_t> coded;
  const uint64_t len = in.raw.size();
  std::span<uint8_t> residual = ResidualScratch(len);
  uint64_t total = 0;
  for (uint64_t i = 0; i < kSampleSlices; ++i) {
    const uint64_t b = SliceStart(len, i);
    const uint64_t e = b + kSampleSlice;
    MakeResidual(kind, in, b, e, residual.data() + b);
    coded.clear();
    RETURN_IF_ERROR(EncodeTensorChunk(residual.subspan(b, e - b), in.chunk_offset + b, in.ranges, *in.opts, &coded));
    total += coded.size();
  }
  return total;
}

// Coded size of the chunk's own bytes over the sample slices, as
// EncodeChunk would code them (0 where the tensor codec refuses them).
uint64_t SampleStandaloneSize(const DeltaInput& in) {
  thread_local std::vector<uint8_t> coded;
  uint64_t total = 0;
  for (uint64_t i = 0; i < kSampleSlices; ++i) {
    const uint64_t b = SliceStart(in.raw.size(), i);
    coded.clear();
    if (!EncodeTensorChunk(in.raw.subspan(b, kSampleSlice), in.chunk_offset + b, in.file_ranges, *in.opts, &coded)
             .ok()) {
      return 0;
    }
    total += coded.size();
  }
  return total;
}

// A chunk no bigger than the sample: coding it both ways costs no more than
// sampling would, and the choice is then exact.
Status EncodeSmaller(const DeltaInput& in, std::vector<uint8_t>* out) {
  const size_t start = out->size();
  RETURN_IF_ERROR(EncodeKind(DeltaKind::kIntDiff, in, out));
  thread_local std::vector<uint8_t> alt;
  alt.clear();
  RETURN_IF_ERROR(EncodeKind(DeltaKind::kXor, in, &alt));
  if (alt.size() <= out->size() - start) {  // XOR on a tie: it decodes faster
    out->resize(start);
    out->insert(out->end(), alt.begin(), alt.end());
  }
  return Status::Ok();
}

// The sample's verdict on a chunk bigger than the sample.
struct SampleVerdict {
  DeltaKind kind = DeltaKind::kXor;
  double delta = 0;       // predicted payload size of that kind
  double standalone = 0;  // predicted size of the chunk coded on its own; 0: not sampled
};

// Coding the chunk on its own costs as much as coding the delta, so a delta
// the sample puts far under the limit is coded and kept without it. On
// tensor bytes the sample predicts both sizes within a few percent; these
// margins leave room for several times that, and past them the exact limit
// decides as before.
constexpr double kSureShare = 0.85;  // predicted delta under this share of the predicted limit: code it
constexpr double kSureKeep = 0.9;    // ... and keep it if it came in under this share of it
// A delta predicted this far over the limit is not coded at all.
constexpr double kGiveUpMargin = 1.15;

Result<SampleVerdict> SampleKinds(const DeltaInput& in, double share) {
  ASSIGN_OR_RETURN(const uint64_t xor_size, SampleSize(DeltaKind::kXor, in));
  ASSIGN_OR_RETURN(const uint64_t diff_size, SampleSize(DeltaKind::kIntDiff, in));
  // The sample is a few slices of a chunk whose statistics are even (tensor
  // bytes): scaled up, it predicts the whole chunk.
  const double scale = static_cast<double>(in.raw.size()) / static_cast<double>(kSampleSlices * kSampleSlice);
  SampleVerdict v;
  v.kind = diff_size < xor_size ? DeltaKind::kIntDiff : DeltaKind::kXor;
  v.delta = static_cast<double>(std::min(xor_size, diff_size)) * scale;
  // A chunk never codes bigger than itself: sample it only where it could
  // make the verdict sure.
  if (share > 0 && v.delta < kSureShare * share * static_cast<double>(in.raw.size())) {
    v.standalone = static_cast<double>(SampleStandaloneSize(in)) * scale;
  }
  return v;
}

Status NotUnder(size_t size, size_t limit, const char* what) {
  return Status::Error(EFBIG, std::string("delta ") + what + " " + std::to_string(size) + " bytes, not under the " +
                                  std::to_string(limit) + " it must beat");
}

Status EncodeUnderLimit(const DeltaInput& in, const DeltaLimit& limit, std::vector<uint8_t>* out) {
  const size_t start = out->size();
  if (in.pieces.empty() || in.raw.size() <= kSampleSlices * kSampleSlice) {
    // Without int-diff pieces both residuals are the same bytes.
    RETURN_IF_ERROR(in.pieces.empty() ? EncodeKind(DeltaKind::kXor, in, out) : EncodeSmaller(in, out));
    const size_t exact = limit.Bytes();
    return out->size() - start < exact ? Status::Ok() : NotUnder(out->size() - start, exact, "of");
  }
  ASSIGN_OR_RETURN(const SampleVerdict v, SampleKinds(in, limit.share));
  const double sure_limit = limit.share * v.standalone;
  const bool sure = v.delta < kSureShare * sure_limit;
  size_t exact = sure ? SIZE_MAX : limit.Bytes();
  if (exact != SIZE_MAX && v.delta > kGiveUpMargin * static_cast<double>(exact)) {
    return NotUnder(static_cast<size_t>(v.delta), exact, "predicted at");
  }
  RETURN_IF_ERROR(EncodeKind(v.kind, in, out));
  const size_t size = out->size() - start;
  if (sure && static_cast<double>(size) < kSureKeep * sure_limit) return Status::Ok();
  if (sure) exact = limit.Bytes();
  return size < exact ? Status::Ok() : NotUnder(size, exact, "of");
}

}  // namespace

// Residuals are small integers and XOR noise, not floats: the plane codec's
// float rotation would move each lane's top bit into the bottom plane and
// smear the low bytes across planes, so the residual is coded as unsigned.
std::vector<TensorRange> ResidualRanges(std::span<const TensorRange> ranges) {
  std::vector<TensorRange> out(ranges.begin(), ranges.end());
  for (TensorRange& r : out) r.dtype = UnsignedOfSize(LaneSize(r.dtype));
  return out;
}

size_t DeltaLimit::Bytes() const {
  if (share <= 0 || standalone == nullptr) return SIZE_MAX;
  return static_cast<size_t>(share * static_cast<double>((*standalone)()));
}

Status EncodeDeltaChunk(std::span<const uint8_t> raw, std::span<const uint8_t> base, uint64_t chunk_offset,
                        std::span<const TensorRange> ranges, const TensorChunkOptions& opts, std::vector<uint8_t>* out,
                        const DeltaLimit& limit) {
  if (raw.size() != base.size()) {
    return Status::InvalidArgument("delta chunk of " + std::to_string(raw.size()) + " bytes against a base of " +
                                   std::to_string(base.size()));
  }
  const std::vector<TensorRange> residual_ranges = ResidualRanges(ranges);
  const std::vector<DeltaPiece> pieces = IntDiffPieces(chunk_offset, raw.size(), residual_ranges);
  const DeltaInput in{raw, base, chunk_offset, residual_ranges, ranges, pieces, &opts};
  const size_t start = out->size();
  Status s = EncodeUnderLimit(in, limit, out);
  if (!s.ok()) out->resize(start);
  return s;
}

}  // namespace ckptfs
