// PackReader on arbitrary bytes: a pack file from a damaged disk (or a
// malicious store) must give Corruption, never a crash, a hang or an
// out-of-bounds access. Every chunk of a pack that opens is decoded, ref and
// delta chunks against a base that serves deterministic bytes (or an error).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "base/unique_fd.h"
#include "store/pack.h"

namespace {

class FakeBases : public ckptfs::BaseSource {
 public:
  ckptfs::Status ReadPackRange(ckptfs::ObjectId pack, uint64_t offset, std::span<uint8_t> out) override {
    if (pack % 3 == 0) return ckptfs::Status::Corruption("fake base missing");
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>((offset + i) * 131 + pack);
    return ckptfs::Status::Ok();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = ::memfd_create("pack", 0);
  if (fd < 0) return 0;
  ckptfs::UniqueFd owned(fd);
  if (size > 0 && ::write(fd, data, size) != static_cast<ssize_t>(size)) return 0;
  auto reader = ckptfs::PackReader::Open(ckptfs::Env::Default(), std::move(owned), "fuzz");
  if (!reader.ok()) return 0;
  // A valid header can still claim a huge chunk size: decode only what a
  // small input could plausibly hold.
  if ((*reader)->header().chunk_size > (8u << 20)) return 0;
  FakeBases bases;
  std::vector<uint8_t> out;
  for (uint64_t i = 0; i < (*reader)->chunks().size() && i < 64; ++i) (void)(*reader)->ReadChunk(i, &out, &bases);
  return 0;
}
