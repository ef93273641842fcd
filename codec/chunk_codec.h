// Codec v0: each chunk of a file is stored zero-elided, zstd-compressed, or
// raw, whichever is smallest. Later codecs (tensor-aware) add ids here.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"

namespace ckptfs {

enum class ChunkCodec : uint8_t {
  kRaw = 0,
  kZstd = 1,
  kZero = 2,  // all bytes zero: nothing stored (sparse holes cost nothing)
};

const char* ChunkCodecName(ChunkCodec c);

struct ChunkEncoderOptions {
  int zstd_level = 3;
};

// Encodes `raw` into `out` (replacing its contents) and returns the codec used.
ChunkCodec EncodeChunk(std::span<const uint8_t> raw, const ChunkEncoderOptions& opts, std::vector<uint8_t>* out);

// Decodes `stored` into exactly raw_out.size() bytes. Any mismatch is Corruption.
Status DecodeChunk(ChunkCodec codec, std::span<const uint8_t> stored, std::span<uint8_t> raw_out);

}  // namespace ckptfs
