// libFuzzer entry for the pickle scanner alone: it is the most stateful
// parser and torch files reach it only behind a valid zip.
#include <cstdint>
#include <cstdlib>

#include "codec/formats/pickle_scan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = ckptfs::formats::ScanPickle(std::span<const uint8_t>(data, size));
  if (r.ok() && r->end > size) std::abort();
  return 0;
}
