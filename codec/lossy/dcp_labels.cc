#include "codec/lossy/dcp_labels.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "codec/formats/pickle_scan.h"

namespace ckptfs {
namespace {

constexpr uint8_t kPickleProto = 0x80;

// The items of `metadata` that lie in the file named `self`, or nothing when
// it is not a DCP .metadata pickle.
std::optional<std::vector<formats::DcpItem>> ItemsFor(const std::string& self, const ByteSource& metadata) {
  uint8_t first = 0;
  if (metadata.size() < 2 || metadata.size() > kMaxDcpMetadataBytes) return std::nullopt;
  if (!metadata.ReadAt(0, std::span(&first, 1)).ok() || first != kPickleProto) return std::nullopt;
  std::vector<uint8_t> bytes(metadata.size());
  if (!metadata.ReadAt(0, bytes).ok()) return std::nullopt;
  Result<formats::PickleScan> scan = formats::ScanPickle(bytes);
  if (!scan.ok() || scan->dcp_items.empty()) return std::nullopt;
  std::vector<formats::DcpItem> mine;
  for (formats::DcpItem& it : scan->dcp_items) {
    if (it.relative_path == self) mine.push_back(std::move(it));
  }
  std::sort(mine.begin(), mine.end(),
            [](const formats::DcpItem& a, const formats::DcpItem& b) { return a.offset < b.offset; });
  return mine;
}

// The item whose archive holds the bytes at `offset`.
const formats::DcpItem* ItemHolding(const std::vector<formats::DcpItem>& items, uint64_t offset, uint64_t length) {
  auto after = std::upper_bound(items.begin(), items.end(), offset,
                                [](uint64_t off, const formats::DcpItem& it) { return off < it.offset; });
  if (after == items.begin()) return nullptr;
  const formats::DcpItem& it = *std::prev(after);
  return offset - it.offset <= it.length && length <= it.length - (offset - it.offset) ? &it : nullptr;
}

}  // namespace

std::optional<FileLayout> LabelDcpShardFrom(const FileLayout& shard, uint64_t shard_size, const std::string& self,
                                            const ByteSource& metadata) {
  if (shard.format != "dcp" || self.empty()) return std::nullopt;
  std::optional<std::vector<formats::DcpItem>> items = ItemsFor(self, metadata);
  if (!items || items->empty()) return std::nullopt;
  for (const formats::DcpItem& it : *items) {
    if (it.offset > shard_size || it.length > shard_size - it.offset) return std::nullopt;  // another file's index
  }
  FileLayout out = shard;
  for (TensorRegion& r : out.tensors) {
    const formats::DcpItem* it = ItemHolding(*items, r.offset, r.length);
    if (it == nullptr) return std::nullopt;  // the metadata does not describe this file
    r.label = it->fqn;
    r.order = static_cast<uint32_t>(std::min<uint64_t>(it->fqn_order, std::numeric_limits<uint32_t>::max()));
  }
  return out;
}

std::optional<LabelledShard> LabelDcpShard(const FileLayout& shard, uint64_t shard_size, SiblingSource& siblings) {
  const std::string self = siblings.OwnName();
  if (shard.format != "dcp" || self.empty()) return std::nullopt;
  do {
    for (const std::string& name : siblings.Candidates()) {
      Result<std::shared_ptr<const ByteSource>> src = siblings.Open(name);
      if (!src.ok()) continue;
      if (std::optional<FileLayout> l = LabelDcpShardFrom(shard, shard_size, self, **src)) {
        return LabelledShard{std::move(*l), name};
      }
    }
  } while (siblings.WaitForMore());
  return std::nullopt;
}

}  // namespace ckptfs
