#include "base/hash.h"

#if defined(__x86_64__) || defined(_M_X64)
// The library's runtime dispatch picks AVX2 or AVX-512 where the CPU has
// them; the plain entry point is built for baseline SSE2. Same values: a
// read verifies every stored and decoded byte, so this is on the hot path.
#include <xxh_x86dispatch.h>
#define CKPTFS_XXH3_64_SEEDED XXH3_64bits_withSeed_dispatch
#define CKPTFS_XXH3_128_UPDATE XXH3_128bits_update_dispatch
#else
#include <xxhash.h>
#define CKPTFS_XXH3_64_SEEDED XXH3_64bits_withSeed
#define CKPTFS_XXH3_128_UPDATE XXH3_128bits_update
#endif

#include <new>

namespace ckptfs {

uint64_t Checksum64(std::span<const uint8_t> bytes, uint64_t seed) {
  return CKPTFS_XXH3_64_SEEDED(bytes.data(), bytes.size(), seed);
}

Digest128Stream::Digest128Stream() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  XXH3_128bits_reset(state_);
}

Digest128Stream::~Digest128Stream() { XXH3_freeState(state_); }

void Digest128Stream::Update(std::span<const uint8_t> bytes) {
  CKPTFS_XXH3_128_UPDATE(state_, bytes.data(), bytes.size());
}

Digest128 Digest128Stream::Finish() const {
  const XXH128_hash_t h = XXH3_128bits_digest(state_);
  return {h.low64, h.high64};
}

}  // namespace ckptfs
