#include "codec/lossless/plane_codec.h"

#include <cstring>
#include <string>

#include "codec/lossless/byte_io.h"
#include "codec/lossless/entropy.h"
#include "codec/lossless/lanes.h"
#include "codec/lossless/plane_format.h"
#include "codec/lossless/rans.h"
#include "codec/lossless/scratch.h"
#include "codec/zstd_contexts.h"

namespace ckptfs::lossless {
namespace {

// The names and limits the plane encoder and decoder share (plane_format.h).
using namespace plane;

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

// Plane k in its scratch slot, copied there if it was read in place.
std::span<uint8_t> Writable(std::span<uint8_t> scratch, unsigned k, size_t lanes, const uint8_t** ptr) {
  std::span<uint8_t> dst(scratch.data() + k * lanes, lanes);
  if (*ptr != dst.data() && lanes != 0) std::memcpy(dst.data(), *ptr, lanes);
  *ptr = dst.data();
  return dst;
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
