// Lossless tensor codec: splits elements into byte planes (optionally after
// moving each float's whole exponent into one byte), then codes each plane
// with whichever of rANS order-0, zstd, raw or a constant run is smallest.
//
// Blob layout (all integers little-endian / LEB128 varints):
//   u8      magic/version (kPlaneBlobMagicV1)
//   u8      dtype (DType value)
//   u8      transform (PlaneTransform)
//   varint  lane count
//   u8      tail length (bytes after the last whole lane, stored verbatim)
//   u8      plane count (== lane size)
//   per plane: u8 method (PlaneMethod), varint stored length
//   plane payloads, in plane order
//   tail bytes
//
// A lane is one element, except for complex types, whose real and
// imaginary parts are coded as separate float lanes (they share statistics).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "codec/dtype.h"

namespace ckptfs::lossless {

inline constexpr uint8_t kPlaneBlobMagicV1 = 0xB1;

enum class PlaneTransform : uint8_t {
  kBytePlanes = 0,  // plane k = byte k of each little-endian lane
  // Lane rotated left by one bit first: the sign moves to the bottom and
  // the exponent becomes the top bits (bf16: byte 1 = whole exponent).
  kRotl1Planes = 1,
};

enum class PlaneMethod : uint8_t {
  kConst = 0,  // one byte: every byte of the plane has this value
  kRaw = 1,
  kRans = 2,
  kZstd = 3,
};

const char* PlaneMethodName(PlaneMethod m);

struct PlaneCodecOptions {
  bool allow_zstd_fallback = true;
  int zstd_level = 3;
};

// What the encoder chose, for benches and tests.
struct PlaneStats {
  PlaneMethod method = PlaneMethod::kRaw;
  uint64_t raw_bytes = 0;
  uint64_t stored_bytes = 0;
  double entropy_bits = 0;  // order-0 entropy of the plane's bytes
};
struct EncodeStats {
  PlaneTransform transform = PlaneTransform::kBytePlanes;
  std::vector<PlaneStats> planes;
};

// Encodes `raw` (elements of dtype `t`; a trailing partial element is
// stored verbatim) into a self-describing blob appended to `out`.
// kUnknown is coded as bytes.
Status EncodeTensorBytes(DType t, std::span<const uint8_t> raw, const PlaneCodecOptions& opts,
                         std::vector<uint8_t>* out, EncodeStats* stats = nullptr);

// Decodes a blob produced above into exactly raw_out.size() bytes. Any
// mismatch or malformed field is Corruption; never reads or writes out of bounds.
Status DecodeTensorBytes(std::span<const uint8_t> blob, std::span<uint8_t> raw_out);

}  // namespace ckptfs::lossless
