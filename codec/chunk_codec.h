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
  // Chunks that need bytes of another pack (pack format >= 3); PackReader
  // decodes them, DecodeChunk refuses them. Payload starts with
  // u64 base pack id | u64 offset in that pack's logical bytes.
  kRef = 4,    // identical to the base bytes: nothing else stored (dedup)
  kDelta = 5,  // a codec/delta_chunk.h payload against the base bytes follows
  // Lossy mode (pack format >= 4): a codec/lossy/lossy_chunk.h payload whose
  // pieces are predicted from the base bytes; base pack 0 means none (a
  // keyframe, decodable on its own).
  kLossy = 6,
};
inline constexpr size_t kBaseRefSize = 16;
// Whether a chunk's payload starts with a base reference (PackReader decodes it).
inline bool StoredAgainstBase(ChunkCodec c) {
  return c == ChunkCodec::kRef || c == ChunkCodec::kDelta || c == ChunkCodec::kLossy;
}

const char* ChunkCodecName(ChunkCodec c);

// Whether every byte is zero (such chunks are stored as kZero, for free).
bool IsAllZero(std::span<const uint8_t> b);

struct ChunkEncoderOptions {
  int zstd_level = 3;
  bool tensor_codec = true;  // use kTensor where the file's layout names tensors
  lossless::PlaneCodecOptions planes{};
};

// Encodes `raw` into `out` (replacing its contents) and returns the codec
// used. `tensors` are the tensor ranges (absolute offsets) overlapping this
// chunk, which starts at file offset `chunk_offset`.
ChunkCodec EncodeChunk(std::span<const uint8_t> raw, const ChunkEncoderOptions& opts, std::vector<uint8_t>* out,
                       uint64_t chunk_offset = 0, std::span<const TensorRange> tensors = {});

// Decodes `stored` into exactly raw_out.size() bytes. Any mismatch is Corruption.
Status DecodeChunk(ChunkCodec codec, std::span<const uint8_t> stored, std::span<uint8_t> raw_out);

}  // namespace ckptfs
