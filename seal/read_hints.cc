#include "seal/read_hints.h"

#include "seal/torch_read_order.h"
#include "seal/ocdbt_data.h"

namespace ckptfs {

std::shared_ptr<const ReadOrder> LoaderReadOrder(const ByteSource& sealed) { return TorchReadOrder(sealed); }

// Orbax (TensorStore's OCDBT) is the one writer known to read a closed
// data file back before its save completes (seal/ocdbt_data.h says why).
std::optional<uint64_t> ReadableBeforeSealFrom(const ByteSource& staged) { return OcdbtTailReadableFrom(staged); }

bool PagesReadableBeforeSeal(const ByteSource& staged, uint64_t off, uint64_t length) {
  return OcdbtNodePagesCover(staged, off, length);
}

}  // namespace ckptfs
