// Read hints: what a read can learn from a file's content, for a mount that
// knows no format. The order a file's usual loader reads it in (so
// decode-ahead can follow it), and which bytes of a closed file still
// waiting for its lossy seal may be served before the seal (a writer that
// reads its own file back must not wait for a seal that waits for it).
// Which formats give which hints is this layer's knowledge, not fuse/'s.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "base/byte_source.h"
#include "cache/read_order.h"

namespace ckptfs {

// The order the file's loader reads its records in, when the format has
// one that differs from the file's (torch.save zips, seal/torch_read_order.h).
// Null when the loader reads the file front to back or the format is unknown.
std::shared_ptr<const ReadOrder> LoaderReadOrder(const ByteSource& sealed);

// From where on a closed file waiting for its lossy seal may be read before
// the seal (the seal keeps those bytes exact); nullopt where nowhere.
std::optional<uint64_t> ReadableBeforeSealFrom(const ByteSource& staged);

// Whether every page of [off, off + length) holds bytes the lossy seal
// keeps exact, so a read of them need not wait for it.
bool PagesReadableBeforeSeal(const ByteSource& staged, uint64_t off, uint64_t length);

}  // namespace ckptfs
