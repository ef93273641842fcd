// torch.load's order of reading a torch.save zip: the pickle names each
// storage by a counter (0, 1, 2, ...) and asks for them in that order, while
// the records `<archive>/data/<n>` are stored sorted by name as strings, so
// a restore jumps around the file before it sweeps through it. Decode-ahead
// follows this order (FileContent, through seal/read_hints.h) instead of
// the file's.
#pragma once

#include <memory>

#include "base/byte_source.h"
#include "cache/read_order.h"

namespace ckptfs {

// The records of the torch.save zip in `file`, in the order torch.load reads
// them, from the central directory only (the end of the file). Null when
// `file` is not such a zip or has fewer than two storage records.
std::shared_ptr<const ReadOrder> TorchReadOrder(const ByteSource& file);

}  // namespace ckptfs
