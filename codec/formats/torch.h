// PyTorch checkpoints: torch.save zip archives (>= 1.6), the legacy
// concatenated-pickle format, and torch.distributed.checkpoint .distcp
// files (raw BYTE_IO items followed by complete torch zip archives).
#pragma once

#include <span>

#include "codec/formats/layout.h"
#include "codec/formats/zip.h"

namespace ckptfs::formats {

// Has an "<archive>/data.pkl" entry.
bool IsTorchArchive(const ZipArchive& z);
// `z` must start at offset 0 of `src`.
Result<FileLayout> ParseTorchZip(const ByteSource& src, const ZipArchive& z);
// Walks the archives backwards from the end of the file.
Result<FileLayout> ParseDcp(const ByteSource& src);

// First pickle is the LONG1 magic number 0x1950a86a20f9469cfc6c.
bool LooksLikeLegacyTorch(std::span<const uint8_t> head);
Result<FileLayout> ParseTorchLegacy(const ByteSource& src);

}  // namespace ckptfs::formats
