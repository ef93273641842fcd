// Minimal zip directory reader for torch.save archives, npz files and the
// torch archives embedded in DCP .distcp files. It reads the central
// directory (EOCD, zip64 EOCD + locator, zip64 extras) and each entry's
// local header, so data offsets honour the local extra field (torch's 'FB'
// padding) that the central directory does not repeat.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "codec/formats/layout.h"

namespace ckptfs::formats {

struct ZipEntry {
  std::string name;
  uint16_t method = 0;  // 0 stored, 8 deflated
  uint16_t flags = 0;
  uint64_t data_offset = 0;  // absolute in the source
  uint64_t comp_size = 0;    // bytes on disk (from the central directory)
  uint64_t uncomp_size = 0;
  uint32_t crc32 = 0;                 // as the central directory states it
  uint64_t local_header_offset = 0;   // absolute
  uint64_t central_entry_offset = 0;  // absolute
  // Flag bit 3: the data descriptor's CRC field, when the descriptor
  // repeats the central directory's CRC (with or without its signature).
  std::optional<uint64_t> descriptor_crc_offset;
};

struct ZipArchive {
  uint64_t base = 0;  // absolute offset of the archive's first byte
  uint64_t end = 0;   // one past its EOCD
  std::vector<ZipEntry> entries;
};

// True if an EOCD record ends exactly at `end` (no comment). Cheap probe
// used to walk DCP files backwards.
bool HasEocdEndingAt(const ByteSource& src, uint64_t end);

// Reads the archive whose EOCD ends at `end`. The archive may start after
// offset 0 (DCP); its base is derived from where the central directory
// really is. With `allow_comment`, the EOCD is searched for within the last
// 64 KiB as general zip writers may append a comment.
Result<ZipArchive> ReadZip(const ByteSource& src, uint64_t end, bool allow_comment);

// The central directory alone (no comment allowed): reads only the end of
// the archive, not each entry's local header, so each entry's data_offset
// is its local header's offset and descriptor_crc_offset stays empty. For
// telling where the members lie without reading the whole file.
Result<ZipArchive> ReadZipDirectory(const ByteSource& src, uint64_t end);

// Adds the CRC fields of each stored member of `z` whose data holds the
// start of one of `tensors`, so lossy rewrites can keep the CRCs valid.
void AppendZipCrcFields(const ZipArchive& z, std::span<const TensorRegion> tensors, std::vector<ZipCrcField>* out);
// Sorts by data offset; duplicate central entries for one member merge, and
// a member overlapping an earlier one (only in hostile files) is dropped.
void SortZipCrcFields(std::vector<ZipCrcField>* fields);

}  // namespace ckptfs::formats
