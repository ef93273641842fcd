// Minimal zip directory reader for torch.save archives, npz files and the
// torch archives embedded in DCP .distcp files. It reads the central
// directory (EOCD, zip64 EOCD + locator, zip64 extras) and each entry's
// local header, so data offsets honour the local extra field (torch's 'FB'
// padding) that the central directory does not repeat.
#pragma once

#include <cstdint>
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

}  // namespace ckptfs::formats
