// Explicit little-endian field access for on-disk records. Formats are
// encoded byte by byte rather than by memcpy of structs, so the layout does
// not depend on the compiler's padding or the host's byte order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ckptfs::le {

inline void Put16(std::span<uint8_t> b, size_t off, uint16_t v) {
  for (size_t i = 0; i < 2; ++i) b[off + i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void Put32(std::span<uint8_t> b, size_t off, uint32_t v) {
  for (size_t i = 0; i < 4; ++i) b[off + i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void Put64(std::span<uint8_t> b, size_t off, uint64_t v) {
  for (size_t i = 0; i < 8; ++i) b[off + i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint16_t Get16(std::span<const uint8_t> b, size_t off) {
  return static_cast<uint16_t>(b[off] | (b[off + 1] << 8));
}
inline uint32_t Get32(std::span<const uint8_t> b, size_t off) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v |= static_cast<uint32_t>(b[off + i]) << (8 * i);
  return v;
}
inline uint64_t Get64(std::span<const uint8_t> b, size_t off) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b[off + i]) << (8 * i);
  return v;
}

}  // namespace ckptfs::le
