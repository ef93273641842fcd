// TensorFlow tensor bundles. The .index file is a LevelDB-style SSTable,
// recognised by its footer magic; .data-* shards have no header and cannot
// be told apart from arbitrary bytes by content alone.
#pragma once

#include "codec/formats/layout.h"

namespace ckptfs::formats {

bool HasTfIndexFooter(const ByteSource& src);
// Whole file is metadata; lossy_allowed=false since TF checks CRC32C of
// every tensor it reads.
Result<FileLayout> ParseTfIndex(const ByteSource& src);

}  // namespace ckptfs::formats
