// Caps and overflow-safe arithmetic shared by the format parsers. Every
// length read from a file passes through these before it sizes an
// allocation or a loop.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "codec/formats/layout.h"

namespace ckptfs::formats {

inline constexpr uint64_t kMaxEntries = 1u << 20;          // tensors, zip entries, KV pairs
inline constexpr uint64_t kMaxMetadataBytes = 256u << 20;  // one header/pickle/directory read
inline constexpr uint64_t kMaxNameBytes = 1u << 16;        // one tensor or entry name
inline constexpr uint32_t kMaxDims = 16;
// What a parsed layout may hold in memory (its regions, names and shapes),
// and the longest single token of a streamed JSON header. A file past
// either takes the generic path, so a header's size never turns into
// unbounded memory (docs/ARCHITECTURE.md, "Memory").
inline constexpr uint64_t kMaxLayoutBytes = 64u << 20;
inline constexpr uint64_t kMaxJsonToken = 1u << 20;

inline std::optional<uint64_t> CheckedAdd(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<uint64_t> CheckedMul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
// [off, off+len) lies inside [0, size).
inline bool InRange(uint64_t off, uint64_t len, uint64_t size) { return off <= size && len <= size - off; }

// Product of dims, or nullopt on overflow.
std::optional<uint64_t> NumElements(const std::vector<uint64_t>& shape);

// Reads [off, off+len) into a new vector after checking it against the file
// size and kMaxMetadataBytes, so a forged length cannot force a huge
// allocation.
Result<std::vector<uint8_t>> ReadBounded(const ByteSource& src, uint64_t off, uint64_t len, const char* what);

inline Status Malformed(const std::string& msg) { return Status::Corruption(msg); }

// Sequential reader with a small buffer, for headers that are parsed field
// by field (GGUF) and may be long (tokenizer vocabularies).
class Cursor {
 public:
  Cursor(const ByteSource& src, uint64_t pos) : src_(src), pos_(pos) {}
  uint64_t pos() const { return pos_; }
  Result<uint8_t> U8();
  Result<uint32_t> U32();
  Result<uint64_t> U64();
  Status Skip(uint64_t n);
  Result<std::string> String(uint64_t len);  // len must be <= kMaxNameBytes

 private:
  Status Fill(std::span<uint8_t> out);
  const ByteSource& src_;
  uint64_t pos_;
  std::vector<uint8_t> buf_;
  uint64_t buf_off_ = 0;
};

}  // namespace ckptfs::formats
