#include "codec/tensor_chunk.h"

#include <cstring>
#include <string>

#include "codec/lossless/byte_io.h"
#include "codec/zstd_contexts.h"

namespace ckptfs {
namespace {

using lossless::ByteReader;

Status DecodeSegment(SegmentKind kind, std::span<const uint8_t> stored, std::span<uint8_t> raw) {
  switch (kind) {
    case SegmentKind::kRawBytes:
      if (stored.size() != raw.size()) return Status::Corruption("raw segment length mismatch");
      if (!raw.empty()) std::memcpy(raw.data(), stored.data(), raw.size());
      return Status::Ok();
    case SegmentKind::kZstdBytes:
      return ZstdDecompressExact(stored, raw, "zstd segment");
    case SegmentKind::kTensor:
      return lossless::DecodeTensorBytes(stored, raw);
    case SegmentKind::kZero:
      if (!stored.empty()) return Status::Corruption("zero segment stores bytes");
      if (!raw.empty()) std::memset(raw.data(), 0, raw.size());
      return Status::Ok();
  }
  return Status::Corruption("unknown segment kind " + std::to_string(static_cast<int>(kind)));
}

}  // namespace

Status DecodeTensorChunk(std::span<const uint8_t> stored, std::span<uint8_t> raw_out) {
  ByteReader r(stored);
  uint8_t version = 0;
  RETURN_IF_ERROR(r.Byte(&version, "tensor chunk version"));
  if (version != kTensorChunkVersion) {
    return Status::Corruption("tensor chunk version " + std::to_string(version) + " is not supported");
  }
  uint64_t count = 0;
  RETURN_IF_ERROR(r.Varint(&count, "segment count"));
  // Every segment has a 3-byte descriptor at least, which bounds the count.
  if (count > r.remaining() / 3 || count > raw_out.size()) return Status::Corruption("segment count too large");
  std::vector<uint64_t> raw_len(count), stored_len(count);
  std::vector<SegmentKind> kind(count);
  uint64_t total = 0;
  for (uint64_t i = 0; i < count; ++i) {
    uint8_t k = 0;
    RETURN_IF_ERROR(r.Byte(&k, "segment kind"));
    if (k > static_cast<uint8_t>(SegmentKind::kZero)) return Status::Corruption("segment kind " + std::to_string(k));
    kind[i] = static_cast<SegmentKind>(k);
    RETURN_IF_ERROR(r.Varint(&raw_len[i], "segment raw length"));
    RETURN_IF_ERROR(r.Varint(&stored_len[i], "segment stored length"));
    if (raw_len[i] > raw_out.size() - total) return Status::Corruption("segments exceed the chunk");
    total += raw_len[i];
  }
  if (total != raw_out.size()) return Status::Corruption("segments do not cover the chunk");
  uint64_t pos = 0;
  for (uint64_t i = 0; i < count; ++i) {
    std::span<const uint8_t> payload;
    RETURN_IF_ERROR(r.Bytes(stored_len[i], &payload, "segment payload"));
    RETURN_IF_ERROR(DecodeSegment(kind[i], payload, raw_out.subspan(pos, raw_len[i]))
                        .WithContext("segment " + std::to_string(i) + " at chunk byte " + std::to_string(pos)));
    pos += raw_len[i];
  }
  if (r.remaining() != 0) return Status::Corruption("bytes left after the last segment");
  return Status::Ok();
}

}  // namespace ckptfs
