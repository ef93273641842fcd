#include "seal/onnx_external.h"

#include <array>
#include <vector>

#include "codec/formats/onnx.h"

namespace ckptfs {
namespace {

constexpr size_t kMaxModelCandidates = 64;

// The first sibling model (named *.onnx: every large unknown file looks, so
// opening every sibling would cost each seal a pass over the directory) that
// places tensors in `file`. A model still being written does not parse, and
// is looked at again next round.
std::optional<FileLayout> LayoutFromModels(const ByteSource& file, const std::string& own, SiblingSource& siblings) {
  std::vector<std::string> names;
  for (std::string& name : siblings.Candidates()) {
    if (name.ends_with(".onnx") && names.size() < kMaxModelCandidates) names.push_back(std::move(name));
  }
  for (const std::string& name : names) {
    Result<std::shared_ptr<const ByteSource>> src = siblings.Open(name);
    if (!src.ok() || (*src)->size() > kMaxOnnxModelBytes || (*src)->size() < 2) continue;
    std::array<uint8_t, 2> head{};
    if (!(*src)->ReadAt(0, head).ok() || !formats::LooksLikeOnnx(head)) continue;
    Result<std::vector<formats::OnnxExternalTensor>> refs = formats::ReadOnnxExternalTensors(**src);
    if (!refs.ok()) continue;
    if (std::optional<FileLayout> l = formats::OnnxExternalLayout(*refs, own, file.size())) {
      l->note = "from " + name + ": " + l->note;
      return l;
    }
  }
  return std::nullopt;
}

}  // namespace

bool LooksLikeOnnxDataName(const std::string& name) {
  for (const char* end : {".data", "_data"}) {
    if (name.ends_with(end)) return true;
  }
  return name.find(".onnx") != std::string::npos;
}

std::optional<FileLayout> OnnxExternalLayoutFromSiblings(const ByteSource& file, SiblingSource& siblings,
                                                         std::chrono::milliseconds wait) {
  const std::string own = siblings.OwnName();
  if (own.empty() || file.size() == 0) return std::nullopt;
  const auto deadline = siblings.WaitingSince() + wait;  // a seal tried again waits no longer in all
  const bool expect_model = LooksLikeOnnxDataName(own);
  if (!expect_model && file.size() < kMinUnnamedOnnxDataBytes) return std::nullopt;
  while (true) {
    if (std::optional<FileLayout> l = LayoutFromModels(file, own, siblings)) return l;
    if (!expect_model || std::chrono::steady_clock::now() >= deadline || !siblings.WaitForMore()) return std::nullopt;
  }
}

}  // namespace ckptfs
