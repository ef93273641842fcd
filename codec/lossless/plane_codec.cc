#include "codec/lossless/plane_codec.h"

#include <zstd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "codec/lossless/byte_io.h"
#include "codec/lossless/entropy.h"
#include "codec/lossless/rans.h"
#include "codec/zstd_contexts.h"

namespace ckptfs::lossless {
namespace {

constexpr unsigned kMaxLane = 8;
constexpr uint8_t kMaxDType = static_cast<uint8_t>(DType::kC128);

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

template <typename U>
U LoadLe(const uint8_t* p) {
  U v = 0;
  for (size_t i = 0; i < sizeof(U); ++i) v |= static_cast<U>(static_cast<U>(p[i]) << (8 * i));
  return v;
}

template <typename U, bool kRotate>
void SplitLanes(const uint8_t* src, size_t lanes, uint8_t* const* planes) {
  constexpr unsigned W = sizeof(U);
  for (size_t i = 0; i < lanes; ++i) {
    U v = LoadLe<U>(src + i * W);
    if constexpr (kRotate) v = std::rotl(v, 1);
    for (unsigned k = 0; k < W; ++k) planes[k][i] = static_cast<uint8_t>(v >> (8 * k));
  }
}

template <typename U, bool kRotate>
void MergeLanes(const uint8_t* const* planes, size_t lanes, uint8_t* dst) {
  constexpr unsigned W = sizeof(U);
  for (size_t i = 0; i < lanes; ++i) {
    U v = 0;
    for (unsigned k = 0; k < W; ++k) v |= static_cast<U>(static_cast<U>(planes[k][i]) << (8 * k));
    if constexpr (kRotate) v = std::rotr(v, 1);
    for (unsigned k = 0; k < W; ++k) dst[i * W + k] = static_cast<uint8_t>(v >> (8 * k));
  }
}

template <bool kRotate>
void Split(unsigned w, const uint8_t* src, size_t lanes, uint8_t* const* planes) {
  if (lanes == 0) return;  // empty planes may have null data
  switch (w) {
    case 2:
      SplitLanes<uint16_t, kRotate>(src, lanes, planes);
      return;
    case 4:
      SplitLanes<uint32_t, kRotate>(src, lanes, planes);
      return;
    case 8:
      SplitLanes<uint64_t, kRotate>(src, lanes, planes);
      return;
    default:
      std::memcpy(planes[0], src, lanes);
      return;  // w == 1: never rotated
  }
}

template <bool kRotate>
void Merge(unsigned w, const uint8_t* const* planes, size_t lanes, uint8_t* dst) {
  if (lanes == 0) return;
  switch (w) {
    case 2:
      MergeLanes<uint16_t, kRotate>(planes, lanes, dst);
      return;
    case 4:
      MergeLanes<uint32_t, kRotate>(planes, lanes, dst);
      return;
    case 8:
      MergeLanes<uint64_t, kRotate>(planes, lanes, dst);
      return;
    default:
      std::memcpy(dst, planes[0], lanes);
      return;
  }
}

struct PlaneSet {
  std::vector<uint8_t> bytes;  // plane k at [k * lanes, (k + 1) * lanes)
  Histogram hist[kMaxLane];
  double entropy_bits[kMaxLane] = {};

  std::span<const uint8_t> Plane(unsigned k, size_t lanes) const { return {bytes.data() + k * lanes, lanes}; }
};

PlaneSet MakePlanes(PlaneTransform tr, unsigned w, std::span<const uint8_t> raw, size_t lanes) {
  PlaneSet ps;
  ps.bytes.resize(w * lanes);
  uint8_t* ptrs[kMaxLane] = {};
  for (unsigned k = 0; k < w; ++k) ptrs[k] = ps.bytes.data() + k * lanes;
  if (tr == PlaneTransform::kRotl1Planes) {
    Split<true>(w, raw.data(), lanes, ptrs);
  } else {
    Split<false>(w, raw.data(), lanes, ptrs);
  }
  for (unsigned k = 0; k < w; ++k) {
    ps.hist[k] = ByteHistogram(ps.Plane(k, lanes));
    ps.entropy_bits[k] = HistogramEntropyBits(ps.hist[k]);
  }
  return ps;
}

// What rANS would roughly cost, capped at raw: picks the transform without
// coding every plane twice. zstd can beat this on structured data, but
// both transforms see the same structure, so the estimate still ranks them.
double EstimatedBytes(const PlaneSet& ps, unsigned w, size_t lanes) {
  double total = 0;
  for (unsigned k = 0; k < w; ++k) total += std::min(ps.entropy_bits[k] / 8.0, static_cast<double>(lanes));
  return total;
}

struct CodedPlane {
  PlaneMethod method = PlaneMethod::kRaw;
  std::vector<uint8_t> bytes;  // empty for kRaw: the plane itself is copied
};

CodedPlane CodePlane(std::span<const uint8_t> plane, const Histogram& hist, double entropy_bits,
                     const PlaneCodecOptions& opts) {
  CodedPlane best;
  size_t best_size = plane.size();
  if (DistinctSymbols(hist) <= 1) {
    best.method = PlaneMethod::kConst;
    best.bytes.assign(1, plane.empty() ? 0 : plane[0]);
    return best;
  }
  // rANS cannot code below the order-0 entropy, so skip it when that
  // already matches raw (mantissa planes are usually like that).
  if (entropy_bits / 8.0 < static_cast<double>(plane.size())) {
    std::vector<uint8_t> r;
    RansEncode(plane, &r, &hist);
    if (r.size() < best_size) {
      best_size = r.size();
      best.method = PlaneMethod::kRans;
      best.bytes = std::move(r);
    }
  }
  if (opts.allow_zstd_fallback && ThreadZstdContexts().cctx != nullptr) {
    std::vector<uint8_t> z(ZSTD_compressBound(plane.size()));
    size_t n =
        ZSTD_compressCCtx(ThreadZstdContexts().cctx, z.data(), z.size(), plane.data(), plane.size(), opts.zstd_level);
    if (!ZSTD_isError(n) && n < best_size) {
      z.resize(n);
      best_size = n;
      best.method = PlaneMethod::kZstd;
      best.bytes = std::move(z);
    }
  }
  return best;
}

Status DecodePlane(PlaneMethod m, std::span<const uint8_t> stored, std::span<uint8_t> plane) {
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
    case PlaneMethod::kZstd: {
      ZSTD_DCtx* dctx = ThreadZstdContexts().dctx;
      if (dctx == nullptr) return Status::Error(ENOMEM, "cannot allocate a zstd decompression context");
      size_t n = ZSTD_decompressDCtx(dctx, plane.data(), plane.size(), stored.data(), stored.size());
      if (ZSTD_isError(n)) return Status::Corruption(std::string("zstd plane: ") + ZSTD_getErrorName(n));
      if (n != plane.size()) {
        return Status::Corruption("zstd plane decoded to " + std::to_string(n) + " bytes, expected " +
                                  std::to_string(plane.size()));
      }
      return Status::Ok();
    }
  }
  return Status::Corruption("unknown plane method " + std::to_string(static_cast<int>(m)));
}

struct Header {
  DType dtype = DType::kUnknown;
  PlaneTransform transform = PlaneTransform::kBytePlanes;
  unsigned lane = 1;
  uint64_t lanes = 0;
  uint8_t tail = 0;
  PlaneMethod method[kMaxLane] = {};
  uint64_t stored_len[kMaxLane] = {};
};

Status ReadHeader(ByteReader* r, size_t raw_size, Header* h) {
  uint8_t magic = 0, dtype = 0, transform = 0, planes = 0;
  RETURN_IF_ERROR(r->Byte(&magic, "magic"));
  if (magic != kPlaneBlobMagicV1) {
    return Status::Corruption("not a lossless tensor blob (magic " + std::to_string(magic) + ")");
  }
  RETURN_IF_ERROR(r->Byte(&dtype, "dtype"));
  if (dtype > kMaxDType) return Status::Corruption("unknown dtype " + std::to_string(dtype));
  h->dtype = static_cast<DType>(dtype);
  h->lane = LaneSize(h->dtype);
  RETURN_IF_ERROR(r->Byte(&transform, "transform"));
  if (transform > 1 || (transform == 1 && !RotationApplies(h->dtype))) {
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
    if (m > static_cast<uint8_t>(PlaneMethod::kZstd))
      return Status::Corruption("unknown plane method " + std::to_string(m));
    h->method[k] = static_cast<PlaneMethod>(m);
    RETURN_IF_ERROR(r->Varint(&h->stored_len[k], "plane length"));
  }
  return Status::Ok();
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
  }
  return "unknown";
}

Status EncodeTensorBytes(DType t, std::span<const uint8_t> raw, const PlaneCodecOptions& opts,
                         std::vector<uint8_t>* out, EncodeStats* stats) {
  if (static_cast<uint8_t>(t) > kMaxDType) {
    return Status::InvalidArgument("EncodeTensorBytes: unknown dtype value " + std::to_string(static_cast<int>(t)));
  }
  const unsigned w = LaneSize(t);
  const size_t lanes = raw.size() / w;
  const size_t tail = raw.size() - lanes * w;

  PlaneTransform tr = PlaneTransform::kBytePlanes;
  PlaneSet planes = MakePlanes(tr, w, raw, lanes);
  if (RotationApplies(t) && lanes > 0) {
    PlaneSet rotated = MakePlanes(PlaneTransform::kRotl1Planes, w, raw, lanes);
    if (EstimatedBytes(rotated, w, lanes) < EstimatedBytes(planes, w, lanes)) {
      tr = PlaneTransform::kRotl1Planes;
      planes = std::move(rotated);
    }
  }

  CodedPlane coded[kMaxLane];
  for (unsigned k = 0; k < w; ++k) {
    coded[k] = CodePlane(planes.Plane(k, lanes), planes.hist[k], planes.entropy_bits[k], opts);
  }

  PutByte(out, kPlaneBlobMagicV1);
  PutByte(out, static_cast<uint8_t>(t));
  PutByte(out, static_cast<uint8_t>(tr));
  PutVarint(out, lanes);
  PutByte(out, static_cast<uint8_t>(tail));
  PutByte(out, static_cast<uint8_t>(w));
  for (unsigned k = 0; k < w; ++k) {
    PutByte(out, static_cast<uint8_t>(coded[k].method));
    PutVarint(out, coded[k].method == PlaneMethod::kRaw ? lanes : coded[k].bytes.size());
  }
  for (unsigned k = 0; k < w; ++k) {
    std::span<const uint8_t> payload =
        coded[k].method == PlaneMethod::kRaw ? planes.Plane(k, lanes) : std::span<const uint8_t>(coded[k].bytes);
    out->insert(out->end(), payload.begin(), payload.end());
  }
  out->insert(out->end(), raw.end() - static_cast<ptrdiff_t>(tail), raw.end());

  if (stats != nullptr) {
    stats->transform = tr;
    stats->planes.clear();
    for (unsigned k = 0; k < w; ++k) {
      size_t stored = coded[k].method == PlaneMethod::kRaw ? lanes : coded[k].bytes.size();
      stats->planes.push_back({coded[k].method, lanes, stored, planes.entropy_bits[k]});
    }
  }
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
    RETURN_IF_ERROR(DecodePlane(h.method[0], stored[0], raw_out.first(lanes)));
  } else {
    std::vector<uint8_t> planes(h.lane * lanes);
    uint8_t* ptrs[kMaxLane] = {};
    for (unsigned k = 0; k < h.lane; ++k) {
      ptrs[k] = planes.data() + k * lanes;
      RETURN_IF_ERROR(DecodePlane(h.method[k], stored[k], {ptrs[k], lanes}).WithContext("plane " + std::to_string(k)));
    }
    if (h.transform == PlaneTransform::kRotl1Planes) {
      Merge<true>(h.lane, ptrs, lanes, raw_out.data());
    } else {
      Merge<false>(h.lane, ptrs, lanes, raw_out.data());
    }
  }
  if (!tail.empty()) std::memcpy(raw_out.data() + lanes * h.lane, tail.data(), tail.size());
  return Status::Ok();
}

}  // namespace ckptfs::lossless
