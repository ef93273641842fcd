#include "codec/chunk_codec.h"

#include <cstring>
#include <string>

#include "codec/zstd_contexts.h"

namespace ckptfs {

const char* ChunkCodecName(ChunkCodec c) {
  switch (c) {
    case ChunkCodec::kRaw:
      return "raw";
    case ChunkCodec::kZstd:
      return "zstd";
    case ChunkCodec::kZero:
      return "zero";
    case ChunkCodec::kTensor:
      return "tensor";
    case ChunkCodec::kRef:
      return "ref";
    case ChunkCodec::kDelta:
      return "delta";
    case ChunkCodec::kLossy:
      return "lossy";
  }
  return "unknown";
}

Status DecodeChunk(ChunkCodec codec, std::span<const uint8_t> stored, std::span<uint8_t> raw_out) {
  switch (codec) {
    case ChunkCodec::kZero:
      if (!stored.empty()) {
        return Status::Corruption("zero chunk has " + std::to_string(stored.size()) + " stored bytes");
      }
      std::memset(raw_out.data(), 0, raw_out.size());
      return Status::Ok();
    case ChunkCodec::kRaw:
      if (stored.size() != raw_out.size()) {
        return Status::Corruption("raw chunk has " + std::to_string(stored.size()) + " bytes, expected " +
                                  std::to_string(raw_out.size()));
      }
      if (!stored.empty()) std::memcpy(raw_out.data(), stored.data(), stored.size());
      return Status::Ok();
    case ChunkCodec::kZstd:
      return ZstdDecompressExact(stored, raw_out, "zstd chunk");
    case ChunkCodec::kTensor:
      return DecodeTensorChunk(stored, raw_out);
    case ChunkCodec::kRef:
    case ChunkCodec::kDelta:
    case ChunkCodec::kLossy:
      return Status::Corruption(std::string(ChunkCodecName(codec)) + " chunk needs its base pack to decode");
  }
  return Status::Corruption("unknown chunk codec " + std::to_string(static_cast<int>(codec)));
}

}  // namespace ckptfs
