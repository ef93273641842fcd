#include "codec/lossless/plane_codec.h"

#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_c_literalCompressionMode
#include <zstd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "codec/compute_device.h"
#include "codec/lossless/byte_io.h"
#include "codec/lossless/entropy.h"
#include "codec/lossless/lanes.h"
#include "codec/lossless/plane_format.h"
#include "codec/lossless/rans.h"
#include "codec/lossless/scratch.h"

namespace ckptfs::lossless {
namespace {

// The names and limits the plane encoder and decoder share (plane_format.h).
using namespace plane;

// Planes above this many bytes are judged from every kSampleStride-th byte:
// 1/16 of a 1 MiB plane still pins the entropy within ~0.02 bit/byte.
constexpr size_t kSampleAbove = 64 << 10;
constexpr size_t kSampleStride = 16;
// A plane this close to 8 bits/byte cannot pay for an entropy coder's table.
constexpr double kRawAboveBitsPerByte = 7.95;
constexpr double kDenseBitsPerByte = 4.5;
// Context split: only for planes big enough to carry B code tables, only
// when the exponent saves this much, and only for contexts this common.
constexpr size_t kSplitMinLanes = 32 << 10;
constexpr size_t kMinBucket = 4096;
// Grid predictor: rows shorter than this are vectors in disguise (biases,
// norms stacked), and the terms must stay a small share of the data.
constexpr uint64_t kMinGridRowLength = 16;
constexpr uint64_t kMinGridRows = 8;
constexpr uint64_t kLanesPerGridTerm = 16;
constexpr uint64_t kGridProbeRows = 32;
constexpr uint64_t kGridFitRows = 256;

size_t StrideFor(size_t n) { return n > kSampleAbove ? kSampleStride : 1; }

Histogram SampledHistogram(std::span<const uint8_t> b) {
  const size_t stride = StrideFor(b.size());
  if (stride == 1) return ByteHistogram(b);
  Histogram h{};
  for (size_t i = 0; i < b.size(); i += stride) ++h[b[i]];
  return h;
}

uint64_t Total(const Histogram& h) {
  uint64_t t = 0;
  for (uint64_t c : h) t += c;
  return t;
}

double BitsPerByte(const Histogram& h) {
  uint64_t t = Total(h);
  return t == 0 ? 0 : HistogramEntropyBits(h) / static_cast<double>(t);
}

bool AllEqual(std::span<const uint8_t> b) {
  return b.empty() || std::all_of(b.begin(), b.end(), [&](uint8_t x) { return x == b[0]; });
}

// Plane coding has its own compression context: its parameters (forced
// Huffman literals) must not leak into the chunk codec's shared context.
struct PlaneZstd {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  int level = 0;
  bool configured = false;
  ~PlaneZstd() { ZSTD_freeCCtx(cctx); }
};

// Two contexts per thread, as planes alternate between two levels.
ZSTD_CCtx* PlaneCCtx(int level) {
  thread_local PlaneZstd ctx[2];
  PlaneZstd& z = ctx[level > 0 ? 1 : 0];
  if (z.cctx == nullptr) return nullptr;
  if (!z.configured || z.level != level) {
    ZSTD_CCtx_reset(z.cctx, ZSTD_reset_parameters);
    ZSTD_CCtx_setParameter(z.cctx, ZSTD_c_compressionLevel, level);
    ZSTD_CCtx_setParameter(z.cctx, ZSTD_c_literalCompressionMode, ZSTD_ps_enable);
    ZSTD_CCtx_setParameter(z.cctx, ZSTD_c_contentSizeFlag, 0);
    // Short matches in float planes are coincidences that cost more than
    // the literals they replace; only long runs are worth a sequence.
    ZSTD_CCtx_setParameter(z.cctx, ZSTD_c_minMatch, 7);
    ZSTD_CCtx_setParameter(z.cctx, ZSTD_c_checksumFlag, 0);
    z.level = level;
    z.configured = true;
  }
  return z.cctx;
}

// The coded bytes are the first `len` of `bytes`, whose size only grows:
// zstd then codes straight into it, where shrinking and regrowing a vector
// would zero-fill it again for every plane.
struct CodedPlane {
  PlaneMethod method = PlaneMethod::kRaw;
  std::vector<uint8_t> bytes;  // unused for kRaw: the plane itself is copied
  size_t len = 0;
  size_t StoredSize(size_t raw) const { return method == PlaneMethod::kRaw ? raw : len; }
  std::span<const uint8_t> Coded() const { return {bytes.data(), len}; }
  uint8_t* Room(size_t n) {
    if (bytes.size() < n) bytes.resize(n);
    return bytes.data();
  }
};

// Takes `b`'s buffer when it is smaller than the best so far; `b` gets the
// old buffer back, so both keep their capacity.
void KeepIfSmaller(CodedPlane* best, size_t* best_size, PlaneMethod m, std::vector<uint8_t>* b) {
  if (b->size() < *best_size) {
    *best_size = b->size();
    best->method = m;
    best->len = b->size();
    best->bytes.swap(*b);
  }
}

// Coded planes outlive the coding of the next plane, so each lane position
// has its own per-thread buffer (the daemon maps every large allocation
// fresh, which would cost page faults per chunk).
std::vector<uint8_t>& PlanePool(unsigned k) {
  thread_local std::vector<uint8_t> pool[kMaxLane];
  return pool[k];
}

// Codes one byte stream given its (possibly sampled) histogram into *best,
// whose byte buffer is reused.
void CodeBytes(std::span<const uint8_t> plane, const Histogram& hist, const PlaneCodecOptions& opts, CodedPlane* best) {
  best->method = PlaneMethod::kRaw;
  best->len = 0;
  if (plane.empty()) return;
  if (DistinctSymbols(hist) <= 1 && AllEqual(plane)) {
    best->method = PlaneMethod::kConst;
    best->Room(1)[0] = plane[0];
    best->len = 1;
    return;
  }
  const double bpb = BitsPerByte(hist);
  if (bpb > kRawAboveBitsPerByte) return;
  size_t best_size = plane.size();
  if (opts.allow_zstd) {
    // Dense planes (fp16's exponent and top mantissa bits) rarely repeat:
    // zstd's level-1 path codes them as fast Huffman literals, faster than
    // the negative levels, which suit the skewed exponent planes.
    const int level = bpb >= kDenseBitsPerByte ? opts.dense_zstd_level : opts.zstd_level;
    if (ZSTD_CCtx* cctx = PlaneCCtx(level)) {
      const size_t bound = ZSTD_compressBound(plane.size());
      size_t n = ZSTD_compress2(cctx, best->Room(bound), bound, plane.data(), plane.size());
      if (!ZSTD_isError(n) && n < best_size) {
        best_size = n;
        best->method = PlaneMethod::kZstd;
        best->len = n;
      }
    }
  }
  // rANS reaches the entropy where Huffman cannot (it spends a whole bit on
  // a symbol of probability 0.9), but decodes at half zstd's speed: only
  // worth it when the entropy promises a clearly smaller plane.
  const double rans_estimate = bpb / 8 * static_cast<double>(plane.size()) + 64;
  if (opts.allow_rans && (!opts.allow_zstd || rans_estimate < opts.rans_max_size * static_cast<double>(best_size))) {
    thread_local std::vector<uint8_t> r;
    r.clear();
    RansEncode(plane, &r);
    KeepIfSmaller(best, &best_size, PlaneMethod::kRans, &r);
  }
}

// ---- context split -----------------------------------------------------------

BucketMap MakeBuckets(const Histogram& ctx_hist, size_t lanes) {
  BucketMap m;
  const uint64_t min_size = std::max<uint64_t>(kMinBucket, lanes / kMaxBuckets);
  for (unsigned c = 0; c < 256 && m.count < kMaxBuckets; ++c) {
    if (ctx_hist[c] >= min_size) m.of[c] = static_cast<uint8_t>(m.count++);
  }
  return m;
}

// Estimated bits per byte of `plane` once its bucket (by the context byte
// of the same lane) is known: the order-0 entropy of each bucket, from a
// sample, which is what coding the buckets separately can reach.
double SplitBitsPerByte(std::span<const uint8_t> plane, std::span<const uint8_t> ctx, const BucketMap& map) {
  // 64 histograms are 128 KiB: a fresh allocation would be mapped and
  // zeroed by the kernel on every call.
  thread_local std::vector<Histogram> hist;
  hist.assign(map.count, Histogram{});
  const size_t stride = StrideFor(plane.size());
  uint64_t n = 0;
  for (size_t i = 0; i < plane.size(); i += stride, ++n) ++hist[map.of[ctx[i]]][plane[i]];
  double bits = 0;
  for (const Histogram& h : hist) bits += HistogramEntropyBits(h);
  return n == 0 ? 0 : bits / static_cast<double>(n);
}

// Returns false (and leaves *out alone) when the split would not pay.
bool CodeSplit(std::span<const uint8_t> plane, std::span<const uint8_t> ctx, const BucketMap& map,
               const Histogram& ctx_hist, size_t best_so_far, const PlaneCodecOptions& opts, CodedPlane* out) {
  auto start = BucketStarts(map, ctx_hist);
  std::span<uint8_t> sorted = Scratch(ScratchSlot::kSplit, plane.size());
  auto cursor = start;
  for (size_t i = 0; i < plane.size(); ++i) sorted[cursor[map.of[ctx[i]]]++] = plane[i];

  // Per-thread, swapped with the caller's pooled buffer on success, so both
  // keep their capacity.
  thread_local std::vector<uint8_t> blob;
  blob.clear();
  blob.reserve(plane.size() + 4 * kMaxBuckets + 512);
  PutByte(&blob, static_cast<uint8_t>(map.count));
  blob.insert(blob.end(), map.of.begin(), map.of.end());
  // Per-thread too: a fresh buffer per bucket would fault in its pages on
  // every chunk.
  thread_local std::vector<CodedPlane> coded(kMaxBuckets);
  for (unsigned b = 0; b < map.count; ++b) {
    std::span<const uint8_t> bucket(sorted.data() + start[b], start[b + 1] - start[b]);
    CodeBytes(bucket, SampledHistogram(bucket), opts, &coded[b]);
    PutByte(&blob, static_cast<uint8_t>(coded[b].method));
    PutVarint(&blob, coded[b].StoredSize(bucket.size()));
  }
  for (unsigned b = 0; b < map.count; ++b) {
    if (coded[b].method == PlaneMethod::kRaw) {
      blob.insert(blob.end(), sorted.begin() + start[b], sorted.begin() + start[b + 1]);
    } else {
      blob.insert(blob.end(), coded[b].Coded().begin(), coded[b].Coded().end());
    }
    if (blob.size() >= best_so_far) return false;
  }
  out->method = PlaneMethod::kSplit;
  out->len = blob.size();
  out->bytes.swap(blob);
  return true;
}

// Estimated bits per lane the grid saves, net of its terms.
double GridGain(const GridEstimate& e, uint64_t terms, uint64_t lanes) {
  // About two bytes per term once delta-coded.
  const double term_bits = 16.0 * static_cast<double>(terms) / static_cast<double>(lanes);
  return e.plain_bits - std::min(e.folded_bits, e.biased_bits) - term_bits;
}

// Fits the grid predictor to the top two planes and, when it pays, replaces
// them by its residual. Returns whether it did. A probe of a few rows turns
// down most tensors it does not suit (weights) at a small cost; the column
// terms are then fitted on more rows, and the row terms on every row.
bool TryGrid(GridHint hint, std::span<uint8_t> hi, std::span<uint8_t> lo, const PlaneCodecOptions& opts,
             GridModel* model) {
  const uint64_t lanes = hi.size();
  if (!opts.allow_grid || hint.row_length < kMinGridRowLength || hint.first_col >= hint.row_length) return false;
  const uint64_t rows = GridRows(hint.row_length, hint.first_col, lanes);
  if (rows < kMinGridRows || (rows + hint.row_length) * kLanesPerGridTerm > lanes) return false;
  const uint64_t probe = GridSampleStep(rows, kGridProbeRows);
  *model = FitGridSample(hi, lo, hint, probe);
  GridEstimate e = EstimateGrid(*model, hi, lo, probe);
  if (GridGain(e, rows + hint.row_length, lanes) < opts.grid_min_gain_bits) return false;
  const uint64_t step = GridSampleStep(rows, kGridFitRows);
  if (step < probe) {
    *model = FitGridSample(hi, lo, hint, step);
    e = EstimateGrid(*model, hi, lo, step);
    if (GridGain(e, rows + hint.row_length, lanes) < opts.grid_min_gain_bits) return false;
  }
  model->fold = e.folded_bits < e.biased_bits;
  FitGridRows(model, hi, lo);
  ApplyGrid(*model, hi, lo, /*forward=*/true);
  return true;
}

// Splits `src` into the planes, on `device` when it takes jobs this big.
// Returns whether `hist` holds the planes' sampled histograms (the device
// computes them in the same pass); a failed device job falls back to this
// thread, since the bytes are the same either way.
bool SplitPlanes(unsigned w, bool rotate, std::span<const uint8_t> src, uint8_t* const* planes,
                 const ComputeDevice* device, Histogram* hist) {
  if (Offload(device, src.size())) {
    const size_t lanes = src.size() / w;
    SplitJob job{w, rotate, src, {planes, w}, StrideFor(lanes), {hist, w}};
    if (device->Split(job).ok()) return true;
  }
  SplitLanes(w, rotate, src.data(), src.size() / w, planes);
  return false;
}

}  // namespace

Status EncodeTensorBytes(DType t, std::span<const uint8_t> raw, const PlaneCodecOptions& opts,
                         std::vector<uint8_t>* out, EncodeStats* stats) {
  return EncodeTensorBytes(t, raw, GridHint{}, opts, out, stats);
}

Status EncodeTensorBytes(DType t, std::span<const uint8_t> raw, GridHint grid, const PlaneCodecOptions& opts,
                         std::vector<uint8_t>* out, EncodeStats* stats) {
  if (static_cast<uint8_t>(t) > kMaxDType) {
    return Status::InvalidArgument("EncodeTensorBytes: unknown dtype value " + std::to_string(static_cast<int>(t)));
  }
  const unsigned w = LaneSize(t);
  const size_t lanes = raw.size() / w;
  const size_t tail = raw.size() - lanes * w;
  PlaneTransform tr = RotationApplies(t) ? PlaneTransform::kRotl1Planes : PlaneTransform::kBytePlanes;

  // A single plane is the input itself; only multi-byte lanes need copying.
  std::span<uint8_t> split;
  std::span<const uint8_t> plane[kMaxLane];
  Histogram hist[kMaxLane];
  bool have_hist = false;
  GridModel model;
  if (w == 1) {
    plane[0] = raw.first(lanes);
  } else {
    split = Scratch(ScratchSlot::kPlanes, w * lanes);
    uint8_t* ptrs[kMaxLane] = {};
    for (unsigned k = 0; k < w; ++k) ptrs[k] = split.data() + k * lanes;
    have_hist = SplitPlanes(w, tr == PlaneTransform::kRotl1Planes, raw.first(w * lanes), ptrs, opts.device, hist);
    for (unsigned k = 0; k < w; ++k) plane[k] = {ptrs[k], lanes};
    if (GridApplies(t) && TryGrid(grid, {ptrs[w - 1], lanes}, {ptrs[w - 2], lanes}, opts, &model)) {
      tr = PlaneTransform::kRotl1Grid;
      hist[w - 1] = SampledHistogram(plane[w - 1]);  // the grid rewrote the top two planes
      hist[w - 2] = SampledHistogram(plane[w - 2]);
    }
  }

  CodedPlane coded[kMaxLane];
  for (unsigned k = 0; k < w; ++k) {
    coded[k].bytes.swap(PlanePool(k));
    if (!have_hist) hist[k] = SampledHistogram(plane[k]);
    CodeBytes(plane[k], hist[k], opts, &coded[k]);
  }
  out->reserve(out->size() + raw.size() + 16 * w + 32);
  if (opts.allow_split && w >= 2 && lanes >= kSplitMinLanes) {
    const unsigned k = w - 2, top = w - 1;
    // Buckets from the sampled histogram: the full one is only needed (for
    // exact bucket sizes) once the estimate says the split pays.
    Histogram scaled = hist[top];
    for (uint64_t& c : scaled) c *= StrideFor(lanes);
    const BucketMap map = MakeBuckets(scaled, lanes);
    if (map.count >= 2 &&
        BitsPerByte(hist[k]) - SplitBitsPerByte(plane[k], plane[top], map) >= opts.split_min_gain_bits) {
      CodeSplit(plane[k], plane[top], map, ByteHistogram(plane[top]), coded[k].StoredSize(lanes), opts, &coded[k]);
    }
  }

  PutByte(out, kPlaneBlobMagicV2);
  PutByte(out, static_cast<uint8_t>(t));
  PutByte(out, static_cast<uint8_t>(tr));
  PutVarint(out, lanes);
  PutByte(out, static_cast<uint8_t>(tail));
  PutByte(out, static_cast<uint8_t>(w));
  for (unsigned k = 0; k < w; ++k) {
    PutByte(out, static_cast<uint8_t>(coded[k].method));
    PutVarint(out, coded[k].StoredSize(lanes));
  }
  if (tr == PlaneTransform::kRotl1Grid) PutGrid(model, out);
  for (unsigned k = 0; k < w; ++k) {
    std::span<const uint8_t> payload = coded[k].method == PlaneMethod::kRaw ? plane[k] : coded[k].Coded();
    out->insert(out->end(), payload.begin(), payload.end());
  }
  out->insert(out->end(), raw.end() - static_cast<ptrdiff_t>(tail), raw.end());

  if (stats != nullptr) {
    stats->transform = tr;
    stats->planes.clear();
    for (unsigned k = 0; k < w; ++k) {
      stats->planes.push_back({coded[k].method, lanes, coded[k].StoredSize(lanes), BitsPerByte(hist[k]) * lanes});
    }
  }
  for (unsigned k = 0; k < w; ++k) coded[k].bytes.swap(PlanePool(k));
  return Status::Ok();
}

}  // namespace ckptfs::lossless
