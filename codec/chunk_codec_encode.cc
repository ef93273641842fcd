#include "codec/chunk_codec.h"

#include <zstd.h>

#include <cstring>

#include "codec/zstd_contexts.h"

namespace ckptfs {

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

}  // namespace ckptfs
