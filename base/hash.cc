#include "base/hash.h"

#include <xxhash.h>

namespace ckptfs {

uint64_t Checksum64(std::span<const uint8_t> bytes, uint64_t seed) {
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), seed);
}

}  // namespace ckptfs
