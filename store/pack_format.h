// On-disk layout of a pack: one sealed version of one file.
// Documented byte by byte in docs/FORMAT.md ("Pack"); all integers are
// little-endian. Every byte of a pack is covered by a checksum:
//   header (64 B, self-checksummed) | chunk payloads | meta block (version 3 on) |
//   chunk table (40 B per chunk) | footer (32 B)
#pragma once

#include <cstddef>
#include <cstdint>

#include "codec/chunk_codec.h"

namespace ckptfs {

inline constexpr char kPackMagic[8] = {'C', 'K', 'P', 'T', 'P', 'A', 'C', 'K'};
inline constexpr char kPackFooterMagic[8] = {'C', 'K', 'P', 'T', 'E', 'N', 'D', '1'};
// Version 2 added chunk codec kTensor; version 3 the meta block and the
// chunk codecs kRef and kDelta; version 4 the chunk codec kLossy and the
// meta block's lossy section; version 5 base windows that start before
// their base pack (BaseWindowLeads) and lossy chunks of version 2 (their
// lossless bytes coded as one run, optionally against the base). Versions
// 1 to 4 are still read.
inline constexpr uint32_t kPackFormatVersion = 5;
inline constexpr uint32_t kPackMinReadableVersion = 1;
inline constexpr uint32_t kPackLeadingBaseVersion = 5;
inline constexpr uint32_t kPackLossyChunkV2Version = 5;
// A pack with neither a leading base window nor a lossy chunk is written as
// version 4, so that builds from before version 5 still read every pack
// they could.
inline constexpr uint32_t kPackPlainVersion = 4;
inline constexpr uint32_t kPackHeaderSize = 64;
inline constexpr uint32_t kPackFooterSize = 32;
inline constexpr uint32_t kPackTableEntrySize = 40;
inline constexpr uint32_t kDefaultChunkSize = 4u << 20;
// The most chunks a pack holds: 16 TiB at the default chunk size (ext4's
// largest file). Its table and meta block, 49 bytes a chunk, are in memory
// while it is written and read, so a file's size, which any user chooses
// (`truncate -s 8E`), must not set them unbounded.
inline constexpr uint64_t kMaxPackChunks = uint64_t{1} << 22;
// Seeds keep checksums of different record kinds from colliding by design.
inline constexpr uint64_t kSeedHeader = 0x4845414452ull;
inline constexpr uint64_t kSeedTable = 0x5441424C45ull;
inline constexpr uint64_t kSeedChunkStored = 0x53544F5245ull;
inline constexpr uint64_t kSeedChunkRaw = 0x524157ull;

// A ref, delta or lossy chunk's base window is [offset, offset + raw length)
// of its base pack's logical bytes. From version 5 the offset is signed (two's
// complement): a window that starts before the base pack reads zeros there.
// A file whose header grew holds every tensor further in than its
// predecessor, so its first chunk's window, which follows the tensors,
// starts before the predecessor's first byte. The lead (how far before) is
// always shorter than the window.
inline bool BaseWindowLeads(uint64_t offset) { return static_cast<int64_t>(offset) < 0; }
inline uint64_t BaseWindowLead(uint64_t offset) { return BaseWindowLeads(offset) ? uint64_t{0} - offset : 0; }

// Header flag bit 0, *holes*: the pack's zero chunks carry raw checksum 0,
// which is not checked. A seal stores the holes of a sparse staging file as
// zero chunks without reading them (SEEK_DATA), so it never hashes their
// zeros: a terabyte hole costs a table entry per chunk, not a terabyte of
// hashing. A zero chunk's bytes follow from its table entry alone, which
// the table checksum covers. Builds from before the flag refuse such a
// pack ("unknown header flags"), as they refuse a version they do not know.
inline constexpr uint32_t kPackFlagHoles = 1;
inline constexpr uint32_t kPackKnownFlags = kPackFlagHoles;

struct PackHeader {
  uint32_t version = kPackPlainVersion;
  uint32_t flags = 0;  // kPackFlag*
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
  uint64_t raw_checksum = 0;     // Checksum64(decoded, kSeedChunkRaw ^ index); 0 for a zero chunk under kPackFlagHoles
};

// Where the fields sit in the header, a table entry and the footer: for the
// pack reader (pack.cc) and the pack writer (pack_writer.cc).
namespace pack_layout {

// Header (64 B): 0 magic[8] | 8 u32 version | 12 u32 header_size |
//   16 u32 chunk_size | 20 u32 flags | 24 u64 logical_size |
//   32 u64 chunk_count | 40 u64 meta_offset | 48 u32 meta_len | 52..55 reserved (0) |
//   56 u64 Checksum64(0..55, kSeedHeader). Versions 1 and 2 have 0 at 40..55.
inline constexpr size_t kHdrVersion = 8, kHdrHeaderSize = 12, kHdrChunkSize = 16, kHdrFlags = 20, kHdrLogical = 24,
                        kHdrCount = 32, kHdrMetaOffset = 40, kHdrMetaLen = 48, kHdrChecksum = 56;
// Table entry (40 B): 0 u64 offset | 8 u32 stored_len | 12 u32 raw_len |
//   16 u8 codec | 17..23 pad (0) | 24 u64 stored_checksum | 32 u64 raw_checksum
inline constexpr size_t kEntOffset = 0, kEntStoredLen = 8, kEntRawLen = 12, kEntCodec = 16, kEntStoredSum = 24,
                        kEntRawSum = 32;
// Footer (32 B): 0 u64 table_offset | 8 u64 chunk_count |
//   16 u64 Checksum64(table, kSeedTable) | 24 magic[8]
inline constexpr size_t kFtTableOffset = 0, kFtCount = 8, kFtTableSum = 16, kFtMagic = 24;

inline uint64_t ChunkCount(uint64_t logical, uint32_t chunk_size) {
  return logical / chunk_size + (logical % chunk_size != 0 ? 1 : 0);
}

}  // namespace pack_layout

}  // namespace ckptfs
