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
#include <map>
#include <mutex>
#include <optional>
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

// Computes each member's CRC from a file's bytes, fed in pieces in any
// order and from several threads at once: each piece's CRC is computed on
// its own and the pieces of a member are joined with crc32_combine, so the
// CRC pass can run on every sealing worker. `fields` must be sorted by data
// offset and non-overlapping, as FileLayout::zip_crcs is. Bytes outside
// members are ignored; bytes fed twice count once.
class ZipCrcTracker {
 public:
  explicit ZipCrcTracker(std::span<const ZipCrcField> fields);

  void Feed(uint64_t abs_offset, std::span<const uint8_t> bytes);
  // Every member's data was fed in full.
  bool Complete() const;
  // One per field, in order; only meaningful when Complete().
  std::vector<uint32_t> Crcs() const;
  // Member `i`'s CRC once its data was fed in full (the pack's pass patches
  // a chunk's fields as soon as their members are done, not the file's).
  std::optional<uint32_t> Crc(size_t i) const;

 private:
  struct Piece {
    uint64_t end = 0;
    uint32_t crc = 0;
  };
  struct Member {
    uint64_t begin = 0;
    uint64_t end = 0;
    std::map<uint64_t, Piece> pieces;  // by first byte; disjoint
    bool gap = false;                  // a range past 2^64: the CRC can never be right
  };
  static bool Covered(const Member& m);
  static uint32_t Combined(const Member& m);
  void Fold(Member* m, uint64_t abs_offset, std::span<const uint8_t> bytes);
  static void AddUncovered(Member* m, uint64_t lo, uint64_t hi, uint64_t abs_offset, std::span<const uint8_t> bytes);

  mutable std::mutex mu_;  // guards every member's pieces
  std::vector<Member> members_;
};

}  // namespace ckptfs::formats
