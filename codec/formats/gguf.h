// GGUF v2/v3 (llama.cpp): header, typed KV metadata, tensor infos, then an
// aligned data section holding the tensors at the listed offsets.
#pragma once

#include "codec/formats/layout.h"

namespace ckptfs::formats {

Result<FileLayout> ParseGguf(const ByteSource& src);

}  // namespace ckptfs::formats
