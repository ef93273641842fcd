// Checksums for stored bytes: XXH3-64, seeded so that a block checksum
// cannot be mistaken for one computed over a different kind of record.
#pragma once

#include <cstdint>
#include <span>

struct XXH3_state_s;  // <xxhash.h>, kept out of this header

namespace ckptfs {

uint64_t Checksum64(std::span<const uint8_t> bytes, uint64_t seed = 0);

// XXH3-128 (seed 0) of a stream of bytes, fed in pieces: what a lossy seal
// recognises a file's identical input by (store/same_input.h), in bounded
// memory however big the file.
struct Digest128 {
  uint64_t low = 0, high = 0;
  bool operator==(const Digest128&) const = default;
};
class Digest128Stream {
 public:
  Digest128Stream();
  ~Digest128Stream();
  Digest128Stream(const Digest128Stream&) = delete;
  Digest128Stream& operator=(const Digest128Stream&) = delete;
  void Update(std::span<const uint8_t> bytes);
  Digest128 Finish() const;

 private:
  ::XXH3_state_s* state_;
};

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
