// One zstd compression and one decompression context per thread, shared
// by every codec: creating a ZSTD_CCtx costs more than compressing a small
// chunk or plane, and contexts are not thread-safe, so sharing one across
// threads would need a lock on the hot path.
#pragma once

#include <zstd.h>

#include <cerrno>
#include <cstdint>
#include <span>
#include <string>

#include "base/status.h"

namespace ckptfs {

struct ZstdContexts {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_DCtx* dctx = ZSTD_createDCtx();
  ZstdContexts() = default;
  ZstdContexts(const ZstdContexts&) = delete;
  ZstdContexts& operator=(const ZstdContexts&) = delete;
  ~ZstdContexts() {
    ZSTD_freeCCtx(cctx);
    ZSTD_freeDCtx(dctx);
  }
};

inline ZstdContexts& ThreadZstdContexts() {
  thread_local ZstdContexts ctx;
  return ctx;
}

// Decompresses one zstd frame into exactly out.size() bytes with the
// thread's context; any error or other length is Corruption naming `what`.
inline Status ZstdDecompressExact(std::span<const uint8_t> stored, std::span<uint8_t> out, const char* what) {
  ZSTD_DCtx* dctx = ThreadZstdContexts().dctx;
  if (dctx == nullptr) return Status::Error(ENOMEM, "cannot allocate a zstd decompression context");
  size_t n = ZSTD_decompressDCtx(dctx, out.data(), out.size(), stored.data(), stored.size());
  if (ZSTD_isError(n)) return Status::Corruption(std::string(what) + ": " + ZSTD_getErrorName(n));
  if (n != out.size()) {
    return Status::Corruption(std::string(what) + " decoded to " + std::to_string(n) + " bytes, expected " +
                              std::to_string(out.size()));
  }
  return Status::Ok();
}

}  // namespace ckptfs
