#include "codec/tensor_chunk.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "base/hash.h"
#include "codec/lossless/byte_io.h"
#include "codec/zstd_contexts.h"

namespace ckptfs {
namespace {

using lossless::PutByte;
using lossless::PutVarint;

// Below this a tensor piece is cheaper to leave with the metadata: a plane
// blob has a header per plane and the entropy coders need a sample.
constexpr uint64_t kMinTensorPiece = 4096;

constexpr uint64_t kSeedName = 0x4E414D45ull;  // "NAME"

}  // namespace

std::vector<ChunkPiece> CutChunk(uint64_t chunk_offset, uint64_t len, std::span<const TensorRange> ranges) {
  std::vector<ChunkPiece> pieces;
  uint64_t pos = 0;
  for (const TensorRange& r : ranges) {
    const uint64_t w = std::max<uint64_t>(DTypeSize(r.dtype), 1);
    uint64_t rb = std::max(r.offset, chunk_offset);
    // Start at a whole element, so planes line up with the element's bytes.
    rb += (w - (rb - r.offset) % w) % w;
    const uint64_t re = std::min(r.offset + r.length, chunk_offset + len);
    if (rb >= re || re - rb < kMinTensorPiece) continue;
    const uint64_t b = rb - chunk_offset, e = re - chunk_offset;
    if (b < pos) continue;  // overlapping ranges: keep the first
    if (b > pos) pieces.push_back({pos, b, DType::kUnknown});
    ChunkPiece p{b, e, r.dtype};
    if (r.row_length > 0) {
      p.row_length = r.row_length;
      p.first_col = ((rb - r.offset) / w) % r.row_length;
    }
    pieces.push_back(p);
    pos = e;
  }
  if (pos < len) pieces.push_back({pos, len, DType::kUnknown});
  return pieces;
}

namespace {

// Long zero runs inside tensors (optimizer state of embedding rows no batch
// touched, zero-initialised tensors) cost nothing as their own segments,
// and keep them out of the plane statistics.
constexpr uint64_t kMinZeroRun = 64 << 10;

// Exits at the first non-zero 64 bytes: tensor data almost always fails at
// once, so the scan costs little outside the zero runs themselves.
bool IsZero(const uint8_t* p, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    uint64_t w[8];
    std::memcpy(w, p + i, sizeof(w));
    if ((w[0] | w[1] | w[2] | w[3] | w[4] | w[5] | w[6] | w[7]) != 0) return false;
  }
  for (; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// The part [begin, end) of a tensor piece, with its column moved along.
ChunkPiece SubPiece(const ChunkPiece& p, uint64_t begin, uint64_t end) {
  ChunkPiece s = p;
  s.begin = begin;
  s.end = end;
  if (p.row_length > 0) {
    const uint64_t w = std::max<uint64_t>(DTypeSize(p.dtype), 1);
    s.first_col = (p.first_col + (begin - p.begin) / w) % p.row_length;
  }
  return s;
}

lossless::GridHint HintOf(const ChunkPiece& p) { return {p.row_length, p.first_col}; }

// Splits a tensor piece around zero runs of at least kMinZeroRun bytes,
// found on a 4 KiB grid (a multiple of every element size).
void SplitZeroRuns(std::span<const uint8_t> chunk, const ChunkPiece& piece, std::vector<ChunkPiece>* out) {
  constexpr uint64_t kGrid = 4096;
  uint64_t pos = piece.begin;     // start of the not yet emitted part
  uint64_t run = 0, run_len = 0;  // current zero run on the grid
  auto flush = [&] {              // a long enough run: [pos, run) as tensor, the run as zeros
    if (run_len >= kMinZeroRun) {
      if (run > pos) out->push_back(SubPiece(piece, pos, run));
      out->push_back({run, run + run_len, DType::kUnknown, true});
      pos = run + run_len;
    }
    run_len = 0;
  };
  // Each probe is the first touch of a new page, which the hardware
  // prefetcher does not follow: fetching a few pages ahead overlaps the
  // misses instead of taking them one after another.
  constexpr uint64_t kAhead = 8 * kGrid;
  for (uint64_t b = piece.begin; b + kGrid <= piece.end; b += kGrid) {
    if (b + kAhead < piece.end) __builtin_prefetch(chunk.data() + b + kAhead);
    if (IsZero(chunk.data() + b, kGrid)) {
      if (run_len == 0) run = b;
      run_len += kGrid;
    } else {
      flush();
    }
  }
  flush();
  if (pos < piece.end) out->push_back(SubPiece(piece, pos, piece.end));
}

SegmentKind CodeMeta(std::span<const uint8_t> raw, int level, std::vector<uint8_t>* out) {
  ZstdContexts& ctx = ThreadZstdContexts();
  if (ctx.cctx != nullptr) {
    std::vector<uint8_t> z(ZSTD_compressBound(raw.size()));
    size_t n = ZSTD_compressCCtx(ctx.cctx, z.data(), z.size(), raw.data(), raw.size(), level);
    if (!ZSTD_isError(n) && n < raw.size()) {
      out->assign(z.begin(), z.begin() + static_cast<ptrdiff_t>(n));
      return SegmentKind::kZstdBytes;
    }
  }
  out->assign(raw.begin(), raw.end());
  return SegmentKind::kRawBytes;
}

}  // namespace

namespace {

uint64_t RowLengthOf(const TensorRegion& t) {
  if (t.shape.size() < 2 || t.shape[0] < 2) return 0;
  uint64_t n = 1;
  for (size_t k = 1; k < t.shape.size(); ++k) {
    if (t.shape[k] != 0 && n > UINT64_MAX / t.shape[k]) return 0;
    n *= t.shape[k];
  }
  // The shape must describe exactly the bytes, or rows would be misplaced.
  const uint64_t w = DTypeSize(t.dtype);
  if (n == 0 || w == 0 || t.length % w != 0 || (t.length / w) / n != t.shape[0] || (t.length / w) % n != 0) return 0;
  return n;
}

}  // namespace

uint64_t TensorNameHash(std::string_view label) {
  if (label.empty()) return 0;
  const uint64_t h =
      Checksum64(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(label.data()), label.size()), kSeedName);
  return h == 0 ? 1 : h;
}

std::vector<TensorRange> TensorRangesOf(const FileLayout& layout) {
  std::vector<TensorRange> out;
  for (const TensorRegion& t : layout.tensors) {
    if (t.dtype == DType::kUnknown || t.length < kMinTensorPiece) continue;
    out.push_back({t.offset, t.length, t.dtype, RowLengthOf(t), TensorNameHash(t.label)});
  }
  std::sort(out.begin(), out.end(), [](const TensorRange& a, const TensorRange& b) { return a.offset < b.offset; });
  return out;
}

std::span<const TensorRange> RangesOverlapping(std::span<const TensorRange> sorted, uint64_t begin, uint64_t end) {
  // Ranges do not overlap each other, so their ends are sorted too.
  auto first = std::partition_point(sorted.begin(), sorted.end(),
                                    [&](const TensorRange& r) { return r.offset + r.length <= begin; });
  auto last = std::partition_point(first, sorted.end(), [&](const TensorRange& r) { return r.offset < end; });
  return {first, last};
}

Status EncodeTensorChunk(std::span<const uint8_t> raw, uint64_t chunk_offset, std::span<const TensorRange> ranges,
                         const TensorChunkOptions& opts, std::vector<uint8_t>* out) {
  std::vector<ChunkPiece> pieces;
  for (const ChunkPiece& p : CutChunk(chunk_offset, raw.size(), ranges)) {
    if (p.dtype == DType::kUnknown) {
      pieces.push_back(p);
    } else {
      SplitZeroRuns(raw, p, &pieces);
    }
  }
  // Metadata pieces are small and coded first, aside; tensor pieces are
  // coded straight into `out` behind a padded stored length patched in
  // afterwards, which saves copying megabytes per chunk. Per-thread buffers
  // keep their capacity from chunk to chunk.
  thread_local std::vector<std::vector<uint8_t>> meta;
  if (meta.size() < pieces.size()) meta.resize(pieces.size());
  std::vector<SegmentKind> kinds(pieces.size(), SegmentKind::kTensor);
  for (size_t i = 0; i < pieces.size(); ++i) {
    meta[i].clear();
    if (pieces[i].zero) {
      kinds[i] = SegmentKind::kZero;
    } else if (pieces[i].dtype == DType::kUnknown) {
      kinds[i] = CodeMeta(raw.subspan(pieces[i].begin, pieces[i].end - pieces[i].begin), opts.zstd_level, &meta[i]);
    }
  }
  PutByte(out, kTensorChunkVersion);
  PutVarint(out, pieces.size());
  std::vector<size_t> length_at(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    PutByte(out, static_cast<uint8_t>(kinds[i]));
    PutVarint(out, pieces[i].end - pieces[i].begin);
    if (kinds[i] == SegmentKind::kTensor) {
      length_at[i] = out->size();
      out->resize(out->size() + 10);
    } else {
      PutVarint(out, meta[i].size());
    }
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (kinds[i] != SegmentKind::kTensor) {
      out->insert(out->end(), meta[i].begin(), meta[i].end());
      continue;
    }
    const size_t start = out->size();
    RETURN_IF_ERROR(lossless::EncodeTensorBytes(pieces[i].dtype,
                                                raw.subspan(pieces[i].begin, pieces[i].end - pieces[i].begin),
                                                HintOf(pieces[i]), opts.planes, out));
    lossless::PutVarint10At(out, length_at[i], out->size() - start);
  }
  return Status::Ok();
}

}  // namespace ckptfs
