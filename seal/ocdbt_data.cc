#include "seal/ocdbt_data.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "base/log.h"
#include "codec/formats/ocdbt.h"

namespace ckptfs {
namespace {

// Manifests larger than this are not OCDBT's (a few hundred bytes).
constexpr uint64_t kMaxManifestBytes = 16u << 20;

// A tree whose keys point to all but this many of the bytes before the
// file's own node describes it completely (the rest are inner nodes).
constexpr uint64_t kOcdbtUndescribedSlack = 64u << 10;

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

  // The file's layout from the tree under `root`, and how many of its
  // bytes that tree's keys point to (values, compressed or not).
  struct Found {
    FileLayout layout;
    uint64_t described = 0;
  };
  Result<Found> From(const formats::OcdbtRoot& root) {
    ASSIGN_OR_RETURN(std::vector<formats::OcdbtEntry> keys, formats::ListOcdbt(root, open_));
    ASSIGN_OR_RETURN(FileLayout layout, formats::OcdbtDataLayout(keys, self_, file_.size(), open_));
    uint64_t described = 0;
    for (const formats::OcdbtEntry& e : keys) {
      if (e.ref && e.ref->path == self_) described += e.ref->length;
    }
    return Found{std::move(layout), described};
  }

  // A commit writes its values, then the new tree nodes after them, in this
  // file or a sibling; the manifest comes last. A node ending this file may
  // belong to an older version than its values (TensorStore's next commit
  // appends its values to the file first), so every tree is asked and the
  // one describing most of the file wins.
  Result<Found> Once() {
    std::optional<Found> best;
    Status last = Status::Error(ENOENT, "no B+tree beside the data file");
    std::string seen;
    auto consider = [&](const std::string& where, Result<Found> f) {
      seen += " " + where + "=" + (f.ok() ? std::to_string(f->described) : f.status().message());
      if (!f.ok()) return void(last = f.status());
      if (!best || f->described > best->described) best = std::move(f).value();
    };
    if (Result<formats::OcdbtRoot> r = formats::OcdbtTailNode(file_, self_); r.ok()) {
      consider("self", From(*r));
    } else if (Result<formats::OcdbtRoot> mid = formats::OcdbtLastNode(file_, self_); mid.ok()) {
      // The next commit's values after this commit's node (OcdbtLastNode).
      consider("self@" + std::to_string(mid->node.offset), From(*mid));
    }
    for (const auto& [name, candidate] : by_name_) {
      Result<std::shared_ptr<const ByteSource>> src = siblings_.Open(candidate);
      if (!src.ok()) {
        seen += " " + name.substr(0, 6) + ": " + src.status().message();
        continue;
      }
      Result<formats::OcdbtRoot> r = formats::OcdbtTailNode(**src, "d/" + name);
      if (r.ok()) consider(name.substr(0, 6) + "@" + std::to_string((*src)->size()), From(*r));
      if (!r.ok()) seen += " " + name.substr(0, 6) + "@" + std::to_string((*src)->size()) + "=no tail node";
    }
    consider("manifest", FromManifest());
    spdlog::debug("{}: {} bytes, trees tried (where=bytes described):{}", LogSafe(self_), file_.size(), LogSafe(seen));
    if (best) return std::move(*best);
    return last;
  }

 private:
  Result<Found> FromManifest() {
    ASSIGN_OR_RETURN(std::shared_ptr<const ByteSource> manifest, siblings_.OpenInParent("manifest.ocdbt"));
    if (manifest->size() > kMaxManifestBytes) return Status::Error(EFBIG, "manifest.ocdbt too large");
    ASSIGN_OR_RETURN(formats::OcdbtRoot root, formats::ReadOcdbtManifest(*manifest));
    return From(root);
  }

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
  // Values end where the file's own node begins (or its padding).
  const uint64_t values_end = OcdbtTailNodeStart(file).value_or(file.size());
  const auto started = siblings.WaitingSince();  // a seal tried again waits no longer in all
  const auto deadline = started + wait;
  auto waited_ms = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
  };
  std::optional<FileLayout> partial;
  while (true) {
    Result<Lookup::Found> f = Lookup(file, own, siblings).Once();
    spdlog::debug("{}: values end at {}, the best tree describes {} bytes, {} ms into the wait", LogSafe(own),
                  values_end, f.ok() ? f->described : 0, waited_ms());
    if (f.ok() && f->described + kOcdbtUndescribedSlack >= values_end) return std::move(f->layout);
    if (f.ok()) partial = std::move(f->layout);
    if (std::chrono::steady_clock::now() >= deadline || !siblings.WaitForMore()) {
      // Named like a data file, yet no tree described it while we could wait (the
      // wait ends at the deadline or when no more siblings can come): it is
      // sealed as generic bytes, with no base, which an admin may want to know.
      if (!partial && !siblings.Postponed())
        spdlog::info("{}: no OCDBT tree described it in {} ms of waiting, sealed without its layout: {}", LogSafe(own),
                     waited_ms(), LogSafe(f.status().message()));
      return partial;
    }
  }
}

std::optional<uint64_t> OcdbtTailNodeStart(const ByteSource& file) {
  Result<formats::OcdbtRoot> node = formats::OcdbtTailNode(file, "");
  if (!node.ok()) return std::nullopt;
  return node->node.offset;
}

std::optional<uint64_t> OcdbtTailReadableFrom(const ByteSource& file) {
  std::optional<uint64_t> start = OcdbtTailNodeStart(file);
  if (!start) {
    Result<formats::OcdbtRoot> mid = formats::OcdbtLastNode(file, "");
    if (mid.ok()) start = mid->node.offset;
  }
  if (!start) return std::nullopt;
  return *start / kOcdbtTailPage * kOcdbtTailPage;
}

size_t KeepOcdbtTailExact(const ByteSource& file, FileLayout* layout) {
  const std::optional<uint64_t> start = OcdbtTailReadableFrom(file);
  if (!start) return 0;
  const size_t before = layout->tensors.size();
  std::erase_if(layout->tensors, [&](const TensorRegion& t) { return t.offset + t.length > *start; });
  return before - layout->tensors.size();
}

namespace {

struct PageRange {
  uint64_t begin = 0;
  uint64_t end = 0;
};

// The pages holding each node of `nodes`, merged where they touch, in order.
std::vector<PageRange> PagesOf(const std::vector<formats::OcdbtRef>& nodes) {
  std::vector<PageRange> pages;
  for (const formats::OcdbtRef& n : nodes) {
    PageRange r{n.offset / kOcdbtTailPage * kOcdbtTailPage,
                (n.offset + n.length + kOcdbtTailPage - 1) / kOcdbtTailPage * kOcdbtTailPage};
    pages.push_back(r);
  }
  std::sort(pages.begin(), pages.end(), [](const PageRange& a, const PageRange& b) { return a.begin < b.begin; });
  std::vector<PageRange> merged;
  for (const PageRange& r : pages) {
    if (!merged.empty() && r.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, r.end);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

// Whether [begin, end) meets one of `pages` (sorted, disjoint).
bool Meets(const std::vector<PageRange>& pages, uint64_t begin, uint64_t end) {
  auto it =
      std::upper_bound(pages.begin(), pages.end(), begin, [](uint64_t v, const PageRange& r) { return v < r.end; });
  return it != pages.end() && it->begin < end;
}

}  // namespace

bool OcdbtNodePagesCover(const ByteSource& file, uint64_t off, uint64_t length) {
  if (length == 0 || off >= file.size()) return false;
  length = std::min(length, file.size() - off);  // the kernel asks for whole pages, or more
  const uint64_t page = off / kOcdbtTailPage * kOcdbtTailPage;
  const uint64_t from = page > kOcdbtReadableNodeBytes ? page - kOcdbtReadableNodeBytes : 0;
  Result<std::vector<formats::OcdbtRef>> nodes =
      formats::FindOcdbtNodes(file, from, off + length, kOcdbtReadableNodeBytes);
  if (!nodes.ok()) return false;
  uint64_t covered = off;
  for (const PageRange& r : PagesOf(*nodes)) {
    if (r.begin <= covered && r.end > covered) covered = r.end;
  }
  return covered >= off + length;
}

Result<size_t> KeepOcdbtNodePagesExact(const ByteSource& file, FileLayout* layout) {
  std::vector<PageRange> tensors;
  for (const TensorRegion& t : layout->tensors) tensors.push_back({t.offset, t.offset + t.length});
  std::sort(tensors.begin(), tensors.end(), [](const PageRange& a, const PageRange& b) { return a.begin < b.begin; });
  std::vector<formats::OcdbtRef> nodes;
  uint64_t gap = 0;  // where the bytes no tensor covers begin
  auto scan = [&](uint64_t end) -> Status {
    if (end <= gap) return Status::Ok();
    ASSIGN_OR_RETURN(std::vector<formats::OcdbtRef> found,
                     formats::FindOcdbtNodes(file, gap, end, kOcdbtReadableNodeBytes));
    nodes.insert(nodes.end(), found.begin(), found.end());
    return Status::Ok();
  };
  for (const PageRange& t : tensors) {
    RETURN_IF_ERROR(scan(t.begin));
    gap = std::max(gap, t.end);
  }
  RETURN_IF_ERROR(scan(file.size()));
  if (nodes.empty()) return size_t{0};
  const std::vector<PageRange> pages = PagesOf(nodes);
  const size_t before = layout->tensors.size();
  std::erase_if(layout->tensors, [&](const TensorRegion& t) { return Meets(pages, t.offset, t.offset + t.length); });
  return before - layout->tensors.size();
}

uint32_t PackChunkSizeFor(const FileLayout& layout, uint32_t configured) {
  const bool several_arrays = layout.format == "orbax-ocdbt" && layout.tensors.size() > 1;
  return several_arrays ? std::min(configured, kOcdbtChunkSize) : configured;
}

// Array metadata is a few hundred bytes; more is not a .zarray of Orbax's.
constexpr uint64_t kMaxZarrayBytes = 64u << 10;

std::optional<FileLayout> ZarrChunkLayoutFromSiblings(const ByteSource& file, SiblingSource& siblings) {
  const std::string own = Basename(siblings.OwnName());
  if (!formats::LooksLikeZarrChunkName(own)) return std::nullopt;
  const std::vector<std::string> names = siblings.Candidates();
  auto zarray = std::find_if(names.begin(), names.end(), [](const std::string& n) { return Basename(n) == ".zarray"; });
  if (zarray == names.end()) return std::nullopt;
  Result<std::shared_ptr<const ByteSource>> meta = siblings.Open(*zarray);
  if (!meta.ok() || (*meta)->size() > kMaxZarrayBytes) return std::nullopt;
  std::string text((*meta)->size(), '\0');
  if (!(*meta)->ReadAt(0, std::span(reinterpret_cast<uint8_t*>(text.data()), text.size())).ok()) return std::nullopt;
  Result<FileLayout> l = formats::ZarrChunkFileLayout(text, siblings.DirName(), own, file.size());
  if (!l.ok()) {
    spdlog::debug("{}: not read as a zarr chunk: {}", LogSafe(own), LogSafe(l.status().message()));
    return std::nullopt;
  }
  return std::move(*l);
}

}  // namespace ckptfs
