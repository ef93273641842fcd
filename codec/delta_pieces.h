// What the delta chunk encoder and decoder (delta_chunk_encode.cc,
// delta_chunk_decode.cc) share: the int-diff piece table's entry and the XOR
// of the bytes outside the pieces.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace ckptfs::delta {

static_assert(std::endian::native == std::endian::little, "lanes are loaded as little-endian integers by memcpy");

// Whole lanes [begin, end) of the chunk coded as integer differences.
struct DeltaPiece {
  uint64_t begin = 0;
  uint64_t end = 0;
  unsigned width = 0;
};

// `out` may be `a` (the decoder XORs in place).
inline void XorBytes(const uint8_t* a, const uint8_t* b, uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] ^ b[i];
}

}  // namespace ckptfs::delta
