// Keeping zip CRC-32s valid when lossy mode rewrites stored zip members
// (torch.save archives, npz, the torch zips inside DCP files): zip readers
// reject a member whose bytes no longer match the directory's CRC. The
// fields to patch come from FileLayout::zip_crcs.
//
// Every CRC field lies outside member data, but the local header's field
// precedes the data it covers, so a writer needs two passes: feed the new
// bytes to a ZipCrcTracker, then patch the fields chunk by chunk.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "codec/formats/layout.h"

namespace ckptfs::formats {

// Standard zip CRC-32, continued from `crc` so data can come in pieces:
// Crc32(b, Crc32(a)) == Crc32(a ++ b).
uint32_t Crc32(std::span<const uint8_t> data, uint32_t crc = 0);

// Writes crcs[i] (little-endian) into the bytes of fields[i]'s CRC fields
// that fall inside the chunk at `chunk_offset`; a field straddling chunk
// boundaries gets its remaining bytes from the neighbouring calls.
void PatchCrcFields(uint64_t chunk_offset, std::span<uint8_t> chunk, std::span<const ZipCrcField> fields,
                    std::span<const uint32_t> crcs);

// Computes each member's CRC from a file's bytes as they stream past.
// `fields` must be sorted by data offset and non-overlapping, as
// FileLayout::zip_crcs is. Bytes outside members are ignored; bytes fed
// twice count once.
class ZipCrcTracker {
 public:
  explicit ZipCrcTracker(std::span<const ZipCrcField> fields);

  // Call with increasing offsets. Skipping part of a member leaves it
  // incomplete for good.
  void Feed(uint64_t abs_offset, std::span<const uint8_t> bytes);
  // Every member's data was fed in full.
  bool Complete() const;
  // One per field, in order; only meaningful when Complete().
  std::vector<uint32_t> Crcs() const;

 private:
  struct Member {
    uint64_t begin = 0;
    uint64_t end = 0;
    uint64_t next = 0;  // first byte not folded in yet
    uint32_t crc = 0;
    bool gap = false;  // bytes were skipped: the CRC can never be right
  };
  static void Fold(Member* m, uint64_t abs_offset, std::span<const uint8_t> bytes);

  std::vector<Member> members_;
  size_t first_live_ = 0;  // members before it end before the bytes fed so far
};

}  // namespace ckptfs::formats
