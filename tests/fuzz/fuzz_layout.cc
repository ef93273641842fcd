// libFuzzer entry: arbitrary bytes through DetectLayout, asserting the
// promises made to callers (sorted, inside, non-overlapping regions).
#include <cstdint>
#include <cstdlib>

#include "codec/formats/layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptfs::SpanSource src(std::span<const uint8_t>(data, size));
  ckptfs::FileLayout l = ckptfs::DetectLayout(src);
  uint64_t end = 0;
  for (const auto& r : l.tensors) {
    if (r.length == 0 || r.offset < end || r.offset > size || r.length > size - r.offset) std::abort();
    end = r.offset + r.length;
  }
  if (l.format == "unknown" && !l.tensors.empty()) std::abort();
  return 0;
}
