// One zstd compression and one decompression context per thread, shared
// by every codec: creating a ZSTD_CCtx costs more than compressing a small
// chunk or plane, and contexts are not thread-safe, so sharing one across
// threads would need a lock on the hot path.
#pragma once

#include <zstd.h>

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

}  // namespace ckptfs
