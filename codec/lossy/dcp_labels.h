// DCP shards (torch.distributed.checkpoint's __R_K.distcp files) hold bare
// tensors, torch.save'd one by one in size order: nothing in a shard says
// which tensor is a weight and which an optimizer moment. The save's
// .metadata file, which the coordinator writes beside the shards once they
// are all written, does: its storage_data names each item's state-dict key
// and where the item lies in which shard. With it, a shard's tensors get
// their keys as labels and the state dict's order, so that lossy::AssignRoles
// finds Adam's moments and pairs them with their weights as it does in a
// torch.save file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "codec/formats/layout.h"
#include "codec/lossy/siblings.h"

namespace ckptfs {

// The most a .metadata file may take to be parsed for labels.
inline constexpr uint64_t kMaxDcpMetadataBytes = 64ull << 20;

struct LabelledShard {
  FileLayout layout;     // the shard's layout with labels and order filled in
  std::string metadata;  // the .metadata file's name, for stats and logs
};

// `shard` (a "dcp" layout) labelled from the first sibling that is a DCP
// .metadata whose items for this file (SiblingSource::OwnName) cover every
// tensor of it. Waits for such a sibling while SiblingSource::WaitForMore
// says it may still come; nothing when none does.
std::optional<LabelledShard> LabelDcpShard(const FileLayout& shard, uint64_t shard_size, SiblingSource& siblings);

// The same with a given .metadata file's bytes (tests, and the step above).
std::optional<FileLayout> LabelDcpShardFrom(const FileLayout& shard, uint64_t shard_size, const std::string& self,
                                            const ByteSource& metadata);

}  // namespace ckptfs
