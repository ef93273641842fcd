// How one chunk of a file is stored: zero-elided, zstd-compressed, raw, or,
// for chunks holding tensors of a recognised checkpoint format, tensor-aware
// (codec/tensor_chunk.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "codec/tensor_chunk.h"

namespace ckptfs {

enum class ChunkCodec : uint8_t {
  kRaw = 0,
  kZstd = 1,
  kZero = 2,    // all bytes zero: nothing stored (sparse holes cost nothing)
  kTensor = 3,  // segments, tensor bytes through the lossless plane codec (pack format >= 2)
};

const char* ChunkCodecName(ChunkCodec c);

struct ChunkEncoderOptions {
  int zstd_level = 3;
  bool tensor_codec = true;  // use kTensor where the file's layout names tensors
  lossless::PlaneCodecOptions planes;
};

// Encodes `raw` into `out` (replacing its contents) and returns the codec
// used. `tensors` are the tensor ranges (absolute offsets) overlapping this
// chunk, which starts at file offset `chunk_offset`.
ChunkCodec EncodeChunk(std::span<const uint8_t> raw, const ChunkEncoderOptions& opts, std::vector<uint8_t>* out,
                       uint64_t chunk_offset = 0, std::span<const TensorRange> tensors = {});

// Decodes `stored` into exactly raw_out.size() bytes. Any mismatch is Corruption.
Status DecodeChunk(ChunkCodec codec, std::span<const uint8_t> stored, std::span<uint8_t> raw_out);

}  // namespace ckptfs
