#include "codec/chunk_codec.h"

#include <zstd.h>

#include <cstring>
#include <string>

#include "codec/zstd_contexts.h"

namespace ckptfs {
namespace {}  // namespace

// Word-at-a-time scan with early exit: most non-zero chunks fail within the
// first few words, and all-zero chunks run at memory bandwidth.
bool IsAllZero(std::span<const uint8_t> b) {
  const uint8_t* p = b.data();
  size_t n = b.size();
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    if (*p != 0) return false;
    ++p;
    --n;
  }
  while (n >= 64) {
    uint64_t w[8];
    std::memcpy(w, p, sizeof(w));
    if ((w[0] | w[1] | w[2] | w[3] | w[4] | w[5] | w[6] | w[7]) != 0) return false;
    p += 64;
    n -= 64;
  }
  while (n > 0) {
    if (*p != 0) return false;
    ++p;
    --n;
  }
  return true;
}

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

ChunkCodec EncodeChunk(std::span<const uint8_t> raw, const ChunkEncoderOptions& opts, std::vector<uint8_t>* out,
                       uint64_t chunk_offset, std::span<const TensorRange> tensors) {
  if (IsAllZero(raw)) {
    out->clear();
    return ChunkCodec::kZero;
  }
  if (opts.tensor_codec && !tensors.empty()) {
    out->clear();
    TensorChunkOptions topts{opts.zstd_level, opts.planes};
    if (EncodeTensorChunk(raw, chunk_offset, tensors, topts, out).ok() && out->size() < raw.size()) {
      return ChunkCodec::kTensor;
    }
  }
  ZstdContexts& ctx = ThreadZstdContexts();
  if (ctx.cctx != nullptr) {
    out->resize(ZSTD_compressBound(raw.size()));
    size_t n = ZSTD_compressCCtx(ctx.cctx, out->data(), out->size(), raw.data(), raw.size(), opts.zstd_level);
    if (!ZSTD_isError(n) && n < raw.size()) {
      out->resize(n);
      return ChunkCodec::kZstd;
    }
  }
  // Incompressible (or zstd failed): raw is never worse than the input.
  out->assign(raw.begin(), raw.end());
  return ChunkCodec::kRaw;
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
