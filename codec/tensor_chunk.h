// Tensor-aware chunk coding (chunk codec kTensor): a chunk of a checkpoint
// file is cut into segments, tensor bytes go through the lossless plane
// codec with their element type, and everything else (pickles, headers,
// JSON, padding) through zstd. Each chunk stays independently decodable,
// so reads remain random-access.
//
// Payload (little-endian, LEB128 varints), documented in docs/FORMAT.md:
//   u8      version (kTensorChunkVersion)
//   varint  segment count
//   per segment: u8 kind (SegmentKind), varint raw length, varint stored length
//   segment payloads, in order; raw lengths sum to the chunk's length
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "codec/dtype.h"
#include "codec/formats/layout.h"
#include "codec/lossless/plane_codec.h"

namespace ckptfs {

inline constexpr uint8_t kTensorChunkVersion = 1;

enum class SegmentKind : uint8_t {
  kRawBytes = 0,
  kZstdBytes = 1,
  kTensor = 2,  // a lossless::EncodeTensorBytes blob
  kZero = 3,    // all bytes zero, nothing stored (untouched optimizer rows, padding)
};

// A run of elements of one type at an absolute file offset.
struct TensorRange {
  uint64_t offset = 0;
  uint64_t length = 0;
  DType dtype = DType::kU8;
  // Elements per row when the tensor is a matrix (the product of every
  // dimension but the first), which lets the plane codec predict fp32
  // magnitudes by row and column; 0 when it is not one or the shape is unknown.
  uint64_t row_length = 0;
  // A hash of what the file calls the tensor (TensorRegion::label), 0 when
  // unnamed: lineage pairs a tensor with its predecessor of the same name
  // when files split or order their tensors differently from save to save
  // (Orbax). Kept in memory only: a pack's meta block does not record it.
  uint64_t name = 0;
};

// The TensorRange::name of a label (never 0; 0 for an empty label).
uint64_t TensorNameHash(std::string_view label);

// The ranges of `layout` worth coding as tensors, sorted by offset.
std::vector<TensorRange> TensorRangesOf(const FileLayout& layout);

// The ranges that overlap [begin, end), found by binary search.
std::span<const TensorRange> RangesOverlapping(std::span<const TensorRange> sorted, uint64_t begin, uint64_t end);

// A chunk-relative byte range: tensor elements of `dtype` (starting on an
// element boundary of their tensor) or, for kUnknown, metadata bytes.
struct ChunkPiece {
  uint64_t begin = 0;
  uint64_t end = 0;
  DType dtype = DType::kUnknown;
  bool zero = false;  // a run of zero bytes inside a tensor (encoder only)
  uint64_t row_length = 0;  // see TensorRange
  uint64_t first_col = 0;   // column of the piece's first element when row_length > 0
};

// How the encoder cuts the chunk [chunk_offset, chunk_offset + len): pieces
// cover it in order; tensor pieces shorter than a few KiB count as metadata.
std::vector<ChunkPiece> CutChunk(uint64_t chunk_offset, uint64_t len, std::span<const TensorRange> ranges);

struct TensorChunkOptions {
  int zstd_level = 3;  // for the non-tensor bytes
  lossless::PlaneCodecOptions planes;
};

// Codes the chunk `raw`, which starts at file offset `chunk_offset`, given
// the tensor ranges overlapping it. Appends to `out`.
Status EncodeTensorChunk(std::span<const uint8_t> raw, uint64_t chunk_offset, std::span<const TensorRange> ranges,
                         const TensorChunkOptions& opts, std::vector<uint8_t>* out);

// Decodes into exactly raw_out.size() bytes; anything malformed is Corruption.
Status DecodeTensorChunk(std::span<const uint8_t> stored, std::span<uint8_t> raw_out);

}  // namespace ckptfs
