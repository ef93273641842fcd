#include "codec/formats/tf_bundle.h"

#include "store/le.h"

namespace ckptfs::formats {
namespace {
constexpr uint64_t kFooterSize = 48;
constexpr uint64_t kTableMagic = 0xdb4775248b80fb57ull;
}  // namespace

bool HasTfIndexFooter(const ByteSource& src) {
  if (src.size() < kFooterSize) return false;
  uint8_t magic[8];
  return src.ReadAt(src.size() - 8, magic).ok() && le::Get64(magic, 0) == kTableMagic;
}

Result<FileLayout> ParseTfIndex(const ByteSource& src) {
  FileLayout l;
  l.format = "tf-bundle-index";
  l.lossy_allowed = false;
  return l;
}

}  // namespace ckptfs::formats
