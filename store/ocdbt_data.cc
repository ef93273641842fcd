#include "store/ocdbt_data.h"

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "codec/formats/ocdbt.h"

namespace ckptfs {
namespace {

// Manifests larger than this are not OCDBT's (a few hundred bytes).
constexpr uint64_t kMaxManifestBytes = 16u << 20;

// A source the caller owns, handed out as a shared_ptr that does not own it.
std::shared_ptr<const ByteSource> Borrowed(const ByteSource& src) {
  return std::shared_ptr<const ByteSource>(&src, [](const ByteSource*) {});
}

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

class Lookup {
 public:
  Lookup(const ByteSource& file, const std::string& own, SiblingSource& siblings)
      : file_(file), self_("d/" + own), siblings_(siblings) {
    for (const std::string& c : siblings_.Candidates()) {
      if (formats::LooksLikeOcdbtDataName(Basename(c))) by_name_.emplace(Basename(c), c);
    }
    open_ = [this](const std::string& path) -> Result<std::shared_ptr<const ByteSource>> {
      if (path == self_) return Borrowed(file_);
      auto it = path.starts_with("d/") ? by_name_.find(path.substr(2)) : by_name_.end();
      if (it == by_name_.end()) return Status::Error(ENOENT, path + " is not beside the data file");
      return siblings_.Open(it->second);
    };
  }

  // The file's layout from the tree under `root`.
  Result<FileLayout> From(const formats::OcdbtRoot& root) {
    ASSIGN_OR_RETURN(std::vector<formats::OcdbtEntry> keys, formats::ListOcdbt(root, open_));
    return formats::OcdbtDataLayout(keys, self_, file_.size(), open_);
  }

  // A commit writes its values, then the new tree nodes after them, in this
  // file or a sibling; the manifest comes last.
  Result<FileLayout> Once() {
    if (Result<formats::OcdbtRoot> r = formats::OcdbtTailNode(file_, self_); r.ok()) {
      if (Result<FileLayout> l = From(*r); l.ok()) return l;
    }
    for (const auto& [name, candidate] : by_name_) {
      Result<std::shared_ptr<const ByteSource>> src = siblings_.Open(candidate);
      if (!src.ok()) continue;
      Result<formats::OcdbtRoot> r = formats::OcdbtTailNode(**src, "d/" + name);
      if (!r.ok()) continue;
      if (Result<FileLayout> l = From(*r); l.ok()) return l;
    }
    ASSIGN_OR_RETURN(std::shared_ptr<const ByteSource> manifest, siblings_.OpenInParent("manifest.ocdbt"));
    if (manifest->size() > kMaxManifestBytes) return Status::Error(EFBIG, "manifest.ocdbt too large");
    ASSIGN_OR_RETURN(formats::OcdbtRoot root, formats::ReadOcdbtManifest(*manifest));
    return From(root);
  }

 private:
  const ByteSource& file_;
  const std::string self_;
  SiblingSource& siblings_;
  std::map<std::string, std::string> by_name_;  // data file name -> candidate
  formats::OcdbtOpener open_;
};

}  // namespace

std::optional<FileLayout> OcdbtDataLayoutFromSiblings(const ByteSource& file, SiblingSource& siblings,
                                                      std::chrono::milliseconds wait) {
  const std::string own = Basename(siblings.OwnName());
  if (!formats::LooksLikeOcdbtDataName(own) || formats::StartsWithOcdbtNode(file)) return std::nullopt;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (true) {
    Result<FileLayout> l = Lookup(file, own, siblings).Once();
    if (l.ok()) return std::move(l).value();
    if (std::chrono::steady_clock::now() >= deadline || !siblings.WaitForMore()) {
      spdlog::debug("{}: not read as an OCDBT data file: {}", own, l.status().message());
      return std::nullopt;
    }
  }
}

}  // namespace ckptfs
