// Checksums for stored bytes: XXH3-64, seeded so that a block checksum
// cannot be mistaken for one computed over a different kind of record.
#pragma once

#include <cstdint>
#include <span>

namespace ckptfs {

uint64_t Checksum64(std::span<const uint8_t> bytes, uint64_t seed = 0);

// Whether a stored checksum matches. Fuzzing builds accept every value, so
// that mutated inputs reach the parsing behind the checksum (which must
// hold up on its own); production builds never do.
inline bool ChecksumMatches(uint64_t computed, uint64_t stored) {
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  (void)computed, (void)stored;
  return true;
#else
  return computed == stored;
#endif
}

}  // namespace ckptfs
