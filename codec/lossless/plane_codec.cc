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
#include "codec/lossless/rans.h"
#include "codec/lossless/scratch.h"
#include "codec/zstd_contexts.h"

namespace ckptfs::lossless {
namespace {

constexpr unsigned kMaxLane = 8;
constexpr uint8_t kMaxDType = static_cast<uint8_t>(DType::kC128);
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
constexpr unsigned kMaxBuckets = 64;
// Grid predictor: rows shorter than this are vectors in disguise (biases,
// norms stacked), and the terms must stay a small share of the data.
constexpr uint64_t kMinGridRowLength = 16;
constexpr uint64_t kMinGridRows = 8;
constexpr uint64_t kLanesPerGridTerm = 16;
constexpr uint64_t kGridProbeRows = 32;
constexpr uint64_t kGridFitRows = 256;

// Complex numbers are pairs of floats whose parts share statistics, so
// they are coded as float lanes. Unknown data is coded as bytes.
unsigned LaneSize(DType t) {
  switch (t) {
    case DType::kC64:
      return 4;
    case DType::kC128:
      return 8;
    case DType::kUnknown:
      return 1;
    default:
      return DTypeSize(t);
  }
}

// The exponent regrouping only helps multi-byte IEEE-style floats; for fp8
// any bit permutation within the byte leaves order-0 statistics unchanged.
bool RotationApplies(DType t) { return DTypeIsFloat(t) && LaneSize(t) >= 2; }

// The predictor works on exponent plus 8 mantissa bits, which only fp32's
// rotated top two planes hold without the sign mixed in.
bool GridApplies(DType t) { return t == DType::kF32; }

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

Status DecodeBytes(PlaneMethod m, std::span<const uint8_t> stored, std::span<uint8_t> plane) {
  switch (m) {
    case PlaneMethod::kConst:
      if (stored.size() != 1)
        return Status::Corruption("constant plane stores " + std::to_string(stored.size()) + " bytes");
      if (!plane.empty()) std::memset(plane.data(), stored[0], plane.size());
      return Status::Ok();
    case PlaneMethod::kRaw:
      if (stored.size() != plane.size()) {
        return Status::Corruption("raw plane stores " + std::to_string(stored.size()) + " bytes, expected " +
                                  std::to_string(plane.size()));
      }
      if (!plane.empty()) std::memcpy(plane.data(), stored.data(), plane.size());
      return Status::Ok();
    case PlaneMethod::kRans:
      return RansDecode(stored, plane);
    case PlaneMethod::kZstd:
      return ZstdDecompressExact(stored, plane, "zstd plane");
    case PlaneMethod::kSplit:
      break;
  }
  return Status::Corruption("plane method " + std::to_string(static_cast<int>(m)) + " not valid here");
}

// ---- context split -----------------------------------------------------------

struct BucketMap {
  unsigned count = 1;
  std::array<uint8_t, 256> of{};  // context byte -> bucket; bucket 0 pools the rare ones
};

BucketMap MakeBuckets(const Histogram& ctx_hist, size_t lanes) {
  BucketMap m;
  const uint64_t min_size = std::max<uint64_t>(kMinBucket, lanes / kMaxBuckets);
  for (unsigned c = 0; c < 256 && m.count < kMaxBuckets; ++c) {
    if (ctx_hist[c] >= min_size) m.of[c] = static_cast<uint8_t>(m.count++);
  }
  return m;
}

std::array<size_t, kMaxBuckets + 1> BucketStarts(const BucketMap& m, const Histogram& ctx_hist) {
  std::array<size_t, kMaxBuckets + 1> start{};
  for (unsigned c = 0; c < 256; ++c) start[m.of[c] + 1] += ctx_hist[c];
  for (unsigned b = 0; b < m.count; ++b) start[b + 1] += start[b];
  return start;
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

Status DecodeSplit(std::span<const uint8_t> stored, std::span<const uint8_t> ctx, std::span<uint8_t> plane) {
  ByteReader r(stored);
  uint8_t count = 0;
  RETURN_IF_ERROR(r.Byte(&count, "bucket count"));
  if (count < 2 || count > kMaxBuckets) return Status::Corruption("bucket count " + std::to_string(count));
  std::span<const uint8_t> of_bytes;
  RETURN_IF_ERROR(r.Bytes(256, &of_bytes, "bucket map"));
  BucketMap map;
  map.count = count;
  for (unsigned c = 0; c < 256; ++c) {
    if (of_bytes[c] >= count) return Status::Corruption("bucket map names bucket " + std::to_string(of_bytes[c]));
    map.of[c] = of_bytes[c];
  }
  PlaneMethod method[kMaxBuckets];
  uint64_t len[kMaxBuckets];
  for (unsigned b = 0; b < count; ++b) {
    uint8_t m = 0;
    RETURN_IF_ERROR(r.Byte(&m, "bucket method"));
    if (m >= static_cast<uint8_t>(PlaneMethod::kSplit)) return Status::Corruption("bucket method " + std::to_string(m));
    method[b] = static_cast<PlaneMethod>(m);
    RETURN_IF_ERROR(r.Varint(&len[b], "bucket length"));
  }
  auto start = BucketStarts(map, ByteHistogram(ctx));
  std::span<uint8_t> sorted = Scratch(ScratchSlot::kSplit, plane.size());
  for (unsigned b = 0; b < count; ++b) {
    std::span<const uint8_t> payload;
    RETURN_IF_ERROR(r.Bytes(len[b], &payload, "bucket payload"));
    std::span<uint8_t> dst(sorted.data() + start[b], start[b + 1] - start[b]);
    RETURN_IF_ERROR(DecodeBytes(method[b], payload, dst).WithContext("bucket " + std::to_string(b)));
  }
  if (r.remaining() != 0) return Status::Corruption("bytes left after the last bucket");
  auto cursor = start;
  for (size_t i = 0; i < plane.size(); ++i) plane[i] = sorted[cursor[map.of[ctx[i]]]++];
  return Status::Ok();
}

// ---- blob header ---------------------------------------------------------------

struct Header {
  DType dtype = DType::kUnknown;
  PlaneTransform transform = PlaneTransform::kBytePlanes;
  unsigned lane = 1;
  uint64_t lanes = 0;
  uint8_t tail = 0;
  PlaneMethod method[kMaxLane] = {};
  uint64_t stored_len[kMaxLane] = {};
  GridModel grid;  // kRotl1Grid only
};

Status ReadHeader(ByteReader* r, size_t raw_size, Header* h) {
  uint8_t magic = 0, dtype = 0, transform = 0, planes = 0;
  RETURN_IF_ERROR(r->Byte(&magic, "magic"));
  if (magic != kPlaneBlobMagicV2) {
    return Status::Corruption("not a lossless tensor blob (magic " + std::to_string(magic) + ")");
  }
  RETURN_IF_ERROR(r->Byte(&dtype, "dtype"));
  if (dtype > kMaxDType) return Status::Corruption("unknown dtype " + std::to_string(dtype));
  h->dtype = static_cast<DType>(dtype);
  h->lane = LaneSize(h->dtype);
  RETURN_IF_ERROR(r->Byte(&transform, "transform"));
  if (transform > 2 || (transform >= 1 && !RotationApplies(h->dtype)) || (transform == 2 && !GridApplies(h->dtype))) {
    return Status::Corruption("transform " + std::to_string(transform) + " invalid for dtype " +
                              std::string(DTypeName(h->dtype)));
  }
  h->transform = static_cast<PlaneTransform>(transform);
  RETURN_IF_ERROR(r->Varint(&h->lanes, "lane count"));
  RETURN_IF_ERROR(r->Byte(&h->tail, "tail length"));
  if (h->tail >= h->lane) return Status::Corruption("tail of " + std::to_string(h->tail) + " bytes is a whole lane");
  if (h->lanes > raw_size / h->lane || h->lanes * h->lane + h->tail != raw_size) {
    return Status::Corruption("blob holds " + std::to_string(h->lanes) + " lanes of " + std::to_string(h->lane) +
                              " bytes + " + std::to_string(h->tail) + ", expected " + std::to_string(raw_size) +
                              " bytes");
  }
  RETURN_IF_ERROR(r->Byte(&planes, "plane count"));
  if (planes != h->lane) return Status::Corruption("plane count " + std::to_string(planes) + " != lane size");
  for (unsigned k = 0; k < h->lane; ++k) {
    uint8_t m = 0;
    RETURN_IF_ERROR(r->Byte(&m, "plane method"));
    if (m > static_cast<uint8_t>(PlaneMethod::kSplit) ||
        (m == static_cast<uint8_t>(PlaneMethod::kSplit) && k + 1 >= h->lane)) {
      return Status::Corruption("plane method " + std::to_string(m) + " invalid for plane " + std::to_string(k));
    }
    h->method[k] = static_cast<PlaneMethod>(m);
    RETURN_IF_ERROR(r->Varint(&h->stored_len[k], "plane length"));
  }
  if (h->transform == PlaneTransform::kRotl1Grid) return ReadGrid(r, h->lanes, &h->grid);
  return Status::Ok();
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

// Plane k in its scratch slot, copied there if it was read in place.
std::span<uint8_t> Writable(std::span<uint8_t> scratch, unsigned k, size_t lanes, const uint8_t** ptr) {
  std::span<uint8_t> dst(scratch.data() + k * lanes, lanes);
  if (*ptr != dst.data() && lanes != 0) std::memcpy(dst.data(), *ptr, lanes);
  *ptr = dst.data();
  return dst;
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

const char* PlaneMethodName(PlaneMethod m) {
  switch (m) {
    case PlaneMethod::kConst:
      return "const";
    case PlaneMethod::kRaw:
      return "raw";
    case PlaneMethod::kRans:
      return "rans";
    case PlaneMethod::kZstd:
      return "zstd";
    case PlaneMethod::kSplit:
      return "split";
  }
  return "unknown";
}

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

Status DecodeTensorBytes(std::span<const uint8_t> blob, std::span<uint8_t> raw_out) {
  ByteReader r(blob);
  Header h;
  RETURN_IF_ERROR(ReadHeader(&r, raw_out.size(), &h));
  std::span<const uint8_t> stored[kMaxLane];
  for (unsigned k = 0; k < h.lane; ++k) RETURN_IF_ERROR(r.Bytes(h.stored_len[k], &stored[k], "plane payload"));
  std::span<const uint8_t> tail;
  RETURN_IF_ERROR(r.Bytes(h.tail, &tail, "tail bytes"));
  if (r.remaining() != 0)
    return Status::Corruption(std::to_string(r.remaining()) + " trailing bytes after tensor blob");

  const size_t lanes = h.lanes;
  if (h.lane == 1) {
    RETURN_IF_ERROR(DecodeBytes(h.method[0], stored[0], raw_out.first(lanes)));
  } else {
    // Raw planes are read in place; the rest are decoded into scratch.
    std::span<uint8_t> scratch = Scratch(ScratchSlot::kPlanes, h.lane * lanes);
    const uint8_t* ptrs[kMaxLane] = {};
    for (int k = static_cast<int>(h.lane) - 1; k >= 0; --k) {
      if (h.method[k] == PlaneMethod::kRaw) {
        if (stored[k].size() != lanes) return Status::Corruption("raw plane " + std::to_string(k) + " has wrong size");
        ptrs[k] = stored[k].data();
        continue;
      }
      std::span<uint8_t> dst(scratch.data() + k * lanes, lanes);
      Status s = h.method[k] == PlaneMethod::kSplit ? DecodeSplit(stored[k], {ptrs[h.lane - 1], lanes}, dst)
                                                    : DecodeBytes(h.method[k], stored[k], dst);
      RETURN_IF_ERROR(s.WithContext("plane " + std::to_string(k)));
      ptrs[k] = dst.data();
    }
    if (h.transform == PlaneTransform::kRotl1Grid) {
      std::span<uint8_t> top = Writable(scratch, h.lane - 1, lanes, &ptrs[h.lane - 1]);
      std::span<uint8_t> below = Writable(scratch, h.lane - 2, lanes, &ptrs[h.lane - 2]);
      ApplyGrid(h.grid, top, below, /*forward=*/false);
    }
    MergeLanes(h.lane, h.transform != PlaneTransform::kBytePlanes, ptrs, lanes, raw_out.data());
  }
  if (!tail.empty()) std::memcpy(raw_out.data() + lanes * h.lane, tail.data(), tail.size());
  return Status::Ok();
}

}  // namespace ckptfs::lossless
