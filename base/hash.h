// Checksums for stored bytes: XXH3-64, seeded so that a block checksum
// cannot be mistaken for one computed over a different kind of record.
#pragma once

#include <cstdint>
#include <span>

namespace ckptfs {

uint64_t Checksum64(std::span<const uint8_t> bytes, uint64_t seed = 0);

}  // namespace ckptfs
