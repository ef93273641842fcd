// On-disk layout of a pack: one sealed version of one file.
// Documented byte by byte in docs/FORMAT.md ("Pack"); all integers are
// little-endian. Every byte of a pack is covered by a checksum:
//   header (64 B, self-checksummed) | chunk payloads | meta block (version 3 on) |
//   chunk table (40 B per chunk) | footer (32 B)
#pragma once

#include <cstdint>

#include "codec/chunk_codec.h"

namespace ckptfs {

inline constexpr char kPackMagic[8] = {'C', 'K', 'P', 'T', 'P', 'A', 'C', 'K'};
inline constexpr char kPackFooterMagic[8] = {'C', 'K', 'P', 'T', 'E', 'N', 'D', '1'};
// Version 2 added chunk codec kTensor; version 3 the meta block and the
// chunk codecs kRef and kDelta; version 4 the chunk codec kLossy and the
// meta block's lossy section. Versions 1 to 3 are still read.
inline constexpr uint32_t kPackFormatVersion = 4;
inline constexpr uint32_t kPackMinReadableVersion = 1;
inline constexpr uint32_t kPackHeaderSize = 64;
inline constexpr uint32_t kPackFooterSize = 32;
inline constexpr uint32_t kPackTableEntrySize = 40;
inline constexpr uint32_t kDefaultChunkSize = 4u << 20;
// Seeds keep checksums of different record kinds from colliding by design.
inline constexpr uint64_t kSeedHeader = 0x4845414452ull;
inline constexpr uint64_t kSeedTable = 0x5441424C45ull;
inline constexpr uint64_t kSeedChunkStored = 0x53544F5245ull;
inline constexpr uint64_t kSeedChunkRaw = 0x524157ull;

struct PackHeader {
  uint32_t version = kPackFormatVersion;
  uint32_t chunk_size = kDefaultChunkSize;
  uint64_t logical_size = 0;
  uint64_t chunk_count = 0;
  uint64_t meta_offset = 0;  // version 3: the meta block (store/pack_meta.h) sits
  uint32_t meta_len = 0;     // between the payloads and the chunk table
};

struct ChunkEntry {
  uint64_t offset = 0;  // of the stored payload within the pack
  uint32_t stored_len = 0;
  uint32_t raw_len = 0;
  ChunkCodec codec = ChunkCodec::kRaw;
  uint64_t stored_checksum = 0;  // Checksum64(payload, kSeedChunkStored ^ index)
  uint64_t raw_checksum = 0;     // Checksum64(decoded, kSeedChunkRaw ^ index)
};

}  // namespace ckptfs
