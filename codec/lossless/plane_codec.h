// Lossless tensor codec: splits elements into byte planes (floats rotated
// left by one bit first, so the exponent fills the top plane), then codes
// each plane with whichever of a constant, raw bytes, zstd with Huffman
// literals, or rANS is smallest. The plane below the exponent can also be
// split into sub-streams by the exponent byte of the same element, which
// codes it at its entropy *given* the exponent (a static order-1 model that
// needs no adaptive coder, so decoding stays table-driven and fast).
//
// Blob layout (little-endian, LEB128 varints), documented in docs/FORMAT.md:
//   u8      magic/version (kPlaneBlobMagicV2)
//   u8      dtype (DType value)
//   u8      transform (PlaneTransform)
//   varint  lane count
//   u8      tail length (bytes after the last whole lane, stored verbatim)
//   u8      plane count (== lane size)
//   per plane: u8 method (PlaneMethod), varint stored length
//   kRotl1Grid only: the predictor's terms (codec/lossless/grid.h)
//   plane payloads, in plane order
//   tail bytes
// A kSplit payload is: u8 bucket count B (2..64), 256 x u8 bucket of each
// context byte value, B x (u8 method, varint stored length), B payloads.
// Its context is the top plane, which is never itself split.
//
// A lane is one element, except for complex types, whose real and
// imaginary parts are coded as separate float lanes (they share statistics).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "codec/dtype.h"
#include "codec/lossless/grid.h"

namespace ckptfs {
class ComputeDevice;
}

namespace ckptfs::lossless {

inline constexpr uint8_t kPlaneBlobMagicV2 = 0xB2;

enum class PlaneTransform : uint8_t {
  kBytePlanes = 0,   // plane k = byte k of each little-endian lane
  kRotl1Planes = 1,  // lane rotated left by one bit first (floats)
  kRotl1Grid = 2,    // fp32 only: kRotl1Planes, then the top two planes hold
                     // the residual of a row/column predictor (grid.h)
};

enum class PlaneMethod : uint8_t {
  kConst = 0,  // one byte: every byte of the plane has this value
  kRaw = 1,
  kRans = 2,   // codec/lossless/rans.h blob
  kZstd = 3,   // one zstd frame
  kSplit = 4,  // sub-streams by the top plane's byte (see above)
};

const char* PlaneMethodName(PlaneMethod m);

struct PlaneCodecOptions {
  // zstd level for planes: a strongly negative level skips match search
  // quickly and Huffman-coded literals are forced on, so zstd acts as a
  // fast Huffman coder that still catches long runs.
  int zstd_level = -500;
  // For planes above 4.5 bits/byte, where level 1 finds no harmful matches
  // and runs faster.
  int dense_zstd_level = 1;
  bool allow_zstd = true;
  bool allow_rans = true;   // see rans_max_size
  bool allow_split = true;  // context split of the plane below the top
  // rANS decodes at about half the speed of zstd's Huffman coder, so it is
  // used only when the entropy promises at most this fraction of zstd's size.
  double rans_max_size = 0.92;
  // The split costs a gather per element on decode; it is used only when
  // the exponent context saves at least this many bits per byte. Since the
  // grid predictor took over what the exponent told about Adam's moments,
  // smaller gains come to under 0.1% of a checkpoint for a quarter of its
  // decode speed.
  double split_min_gain_bits = 1.0;
  bool allow_grid = true;  // row/column predictor for fp32 matrices (grid.h)
  // The predictor costs a pass each way; it is used when it saves at least
  // this many bits per element, after the bytes its terms take.
  double grid_min_gain_bits = 0.05;
  // Runs the lane split and its histograms (codec/compute_device.h); null:
  // inline on this thread. The stream is the same either way.
  const ComputeDevice* device = nullptr;
};

// What the encoder chose, for benches and tests.
struct PlaneStats {
  PlaneMethod method = PlaneMethod::kRaw;
  uint64_t raw_bytes = 0;
  uint64_t stored_bytes = 0;
  double entropy_bits = 0;  // order-0 entropy of the plane's bytes (estimate from a sample on big planes)
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
// The same, for elements that sit in a row-major matrix as `grid` says,
// which lets fp32 data use kRotl1Grid.
Status EncodeTensorBytes(DType t, std::span<const uint8_t> raw, GridHint grid, const PlaneCodecOptions& opts,
                         std::vector<uint8_t>* out, EncodeStats* stats = nullptr);

// Decodes a blob produced above into exactly raw_out.size() bytes. Any
// mismatch or malformed field is Corruption; never reads or writes out of bounds.
Status DecodeTensorBytes(std::span<const uint8_t> blob, std::span<uint8_t> raw_out);

}  // namespace ckptfs::lossless
