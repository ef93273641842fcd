// The meta block of a pack (format version 3): what the pack refers to and
// what it holds, so that the store's in-memory indexes (pack references,
// lineage, dedup) can be rebuilt from the packs alone. It is a cache's
// source of truth, never a second one: the chunk table still decides what
// the bytes are.
//
// Layout (little-endian), documented in docs/FORMAT.md ("Pack meta block"):
//   0  magic "CKPTMETA"
//   8  u64 sealed_ns      CLOCK_REALTIME when the pack was written
//  16  u32 base_count     B
//  20  u32 tensor_count   T
//  24  u64 chunk_count    C (equals the header's)
//  32  B x u64            distinct packs referenced by kRef/kDelta chunks
//      T x (u64 offset, u64 length, u8 dtype)   tensor ranges (lineage signature)
//      C x u64            XXH3-64 (seed 0) of each chunk's raw bytes
//      C x u8             delta depth of each chunk (0: decodes on its own)
//      [lossy section, packs sealed under a lossy policy (format version 4):
//       "LOSY" | u32 version (1 or 2) | f32 fidelity | u64 exact float elements |
//       3 x (f32 target, f32 max error, u64 elements, u64 stored bytes)
//       for weights, first moments and second moments |
//       version 2 only: u8 scope | u8 sensitivity rule | u8 budget measure
//       (0 relative, 1 one-step; 0 in packs written before it existed) | u8 zero]
//      [input section, packs sealed under a lossy policy since it exists:
//       "INPT" | u32 version (1) | u64 digest low | u64 digest high | u64 copy_of]
//      u64                Checksum64(everything above, kSeedMeta)
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "base/hash.h"
#include "base/status.h"
#include "codec/lossy/lossy_info.h"
#include "codec/tensor_chunk.h"
#include "store/object_id.h"

namespace ckptfs {

inline constexpr uint64_t kSeedMeta = 0x4D455441ull;  // "META"
// Caps keep a corrupt count from turning into a huge allocation.
inline constexpr uint32_t kMaxMetaBases = 1u << 20;
inline constexpr uint32_t kMaxMetaTensors = 1u << 22;

// What a pack sealed under a lossy policy was coded from: identical input
// under the same policy is stored once (store/same_input.h).
struct InputDigest {
  Digest128 digest;     // XXH3-128 of the policy text and the file's raw bytes
  ObjectId copy_of = 0;  // not 0: every chunk is a ref to this pack's at the same offset
  bool operator==(const InputDigest&) const = default;
};

struct PackMeta {
  uint64_t sealed_ns = 0;
  std::optional<LossyInfo> lossy;
  std::optional<InputDigest> input;
  std::vector<ObjectId> bases;
  std::vector<TensorRange> tensors;
  std::vector<uint64_t> chunk_hash;
  std::vector<uint8_t> chunk_depth;

  uint8_t max_depth() const;
};

std::vector<uint8_t> EncodePackMeta(const PackMeta& m);
// Corruption on any inconsistency; `chunk_count` is the header's.
Result<PackMeta> DecodePackMeta(std::span<const uint8_t> bytes, uint64_t chunk_count);

// The content hash the meta block records for a chunk's raw bytes.
uint64_t ChunkContentHash(std::span<const uint8_t> raw);

}  // namespace ckptfs
