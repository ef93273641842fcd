// NumPy .npy (format v1/v2/v3) and .npz (a zip of .npy members).
#pragma once

#include "codec/formats/layout.h"
#include "codec/formats/zip.h"

namespace ckptfs::formats {

Result<FileLayout> ParseNpy(const ByteSource& src);
// Has at least one "*.npy" member.
bool IsNpzArchive(const ZipArchive& z);
Result<FileLayout> ParseNpz(const ByteSource& src, const ZipArchive& z);

}  // namespace ckptfs::formats
