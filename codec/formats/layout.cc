#include "codec/formats/layout.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "codec/formats/gguf.h"
#include "codec/formats/hdf5.h"
#include "codec/formats/limits.h"
#include "codec/formats/msgpack.h"
#include "codec/formats/numpy.h"
#include "codec/formats/onnx.h"
#include "codec/formats/safetensors.h"
#include "codec/formats/tf_bundle.h"
#include "codec/formats/torch.h"
#include "codec/formats/zip.h"

namespace ckptfs {

namespace formats {
namespace {

constexpr uint8_t kZipMagic[] = {'P', 'K', 3, 4};
constexpr uint8_t kNpyMagic[] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
constexpr uint8_t kGgufMagic[] = {'G', 'G', 'U', 'F'};
constexpr uint8_t kHdf5Magic[] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

bool StartsWith(std::span<const uint8_t> head, std::span<const uint8_t> magic) {
  return head.size() >= magic.size() && std::equal(magic.begin(), magic.end(), head.begin());
}

FileLayout Unknown(std::string note) {
  FileLayout l;
  l.note = std::move(note);
  return l;
}

// A zip is a torch archive when it has <archive>/data.pkl, an npz when it
// holds .npy members; anything else is not ours to interpret.
Result<FileLayout> ParseZipFile(const ByteSource& src) {
  ASSIGN_OR_RETURN(ZipArchive z, ReadZip(src, src.size(), /*allow_comment=*/true));
  if (IsTorchArchive(z)) {
    if (z.base != 0) return ParseDcp(src);
    return ParseTorchZip(src, z);
  }
  if (IsNpzArchive(z)) return ParseNpz(src, z);
  if (HoldsHdf5Member(src, z)) return ParseZippedHdf5(src, z);
  return Malformed("zip holds neither data.pkl, .npy nor HDF5 members");
}

Result<FileLayout> Dispatch(const ByteSource& src) {
  std::array<uint8_t, 16> head{};
  uint64_t n = std::min<uint64_t>(head.size(), src.size());
  RETURN_IF_ERROR(src.ReadAt(0, std::span(head).first(n)));
  auto h = std::span<const uint8_t>(head).first(n);
  if (StartsWith(h, kZipMagic)) return ParseZipFile(src);
  if (StartsWith(h, kNpyMagic)) return ParseNpy(src);
  if (StartsWith(h, kGgufMagic)) return ParseGguf(src);
  if (StartsWith(h, kHdf5Magic)) return ParseHdf5(src);
  if (LooksLikeLegacyTorch(h)) return ParseTorchLegacy(src);
  if (LooksLikeSafetensors(h, src.size())) return ParseSafetensors(src);
  if (HasTfIndexFooter(src)) return ParseTfIndex(src);
  // No magic: only a file that parses as a whole ModelProto is ONNX, and
  // only one msgpack map to the last byte, holding ndarrays, is Flax's.
  if (LooksLikeOnnx(h)) {
    if (Result<FileLayout> onnx = ParseOnnx(src); onnx.ok()) return onnx;
  }
  if (LooksLikeMsgpackMap(h)) {
    if (Result<FileLayout> flax = ParseFlaxMsgpack(src); flax.ok()) return flax;
  }
  // DCP files start with raw BYTE_IO items, so only the trailing zip shows.
  if (HasEocdEndingAt(src, src.size())) return ParseDcp(src);
  // An HDF5 file with a user block has its signature at 512, 1024, ...
  if (FindHdf5Superblock(src)) return ParseHdf5(src);
  return Malformed("no known magic");
}

// Last line of defence: whatever a parser produced, the result handed out
// is sorted, inside the file and non-overlapping. Parsers validate already,
// so dropping here means a parser bug or a hostile file; it is noted.
void Normalize(FileLayout* l, uint64_t file_size) {
  auto& t = l->tensors;
  size_t before = t.size();
  std::erase_if(t, [&](const TensorRegion& r) { return r.length == 0 || !InRange(r.offset, r.length, file_size); });
  std::stable_sort(t.begin(), t.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  std::vector<TensorRegion> kept;
  kept.reserve(t.size());
  uint64_t end = 0;
  for (auto& r : t) {
    if (!kept.empty() && r.offset < end) continue;
    end = r.offset + r.length;
    kept.push_back(std::move(r));
  }
  t = std::move(kept);
  if (t.size() != before) {
    if (!l->note.empty()) l->note += "; ";
    l->note += "dropped " + std::to_string(before - t.size()) + " empty, out-of-range or overlapping regions";
  }
}

}  // namespace
}  // namespace formats

FileLayout DetectLayout(const ByteSource& src) {
  if (src.size() < 8) return formats::Unknown("file too small");
  Result<FileLayout> r = formats::Dispatch(src);
  if (!r.ok()) return formats::Unknown(r.status().message());
  FileLayout l = std::move(r).value();
  formats::Normalize(&l, src.size());
  return l;
}

}  // namespace ckptfs
