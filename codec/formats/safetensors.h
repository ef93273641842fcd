// safetensors: u64 LE header length N, N bytes of JSON, then the tensor
// buffer; data_offsets are relative to the buffer.
#pragma once

#include <span>

#include "codec/formats/layout.h"

namespace ckptfs::formats {

// Plausible header length and a '{' right after it.
bool LooksLikeSafetensors(std::span<const uint8_t> head, uint64_t file_size);
Result<FileLayout> ParseSafetensors(const ByteSource& src);

}  // namespace ckptfs::formats
