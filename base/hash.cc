#include "base/hash.h"

#if defined(__x86_64__) || defined(_M_X64)
// The library's runtime dispatch picks AVX2 or AVX-512 where the CPU has
// them; the plain entry point is built for baseline SSE2. Same values: a
// read verifies every stored and decoded byte, so this is on the hot path.
#include <xxh_x86dispatch.h>
#define CKPTFS_XXH3_64_SEEDED XXH3_64bits_withSeed_dispatch
#else
#include <xxhash.h>
#define CKPTFS_XXH3_64_SEEDED XXH3_64bits_withSeed
#endif

namespace ckptfs {

uint64_t Checksum64(std::span<const uint8_t> bytes, uint64_t seed) {
  return CKPTFS_XXH3_64_SEEDED(bytes.data(), bytes.size(), seed);
}

}  // namespace ckptfs
