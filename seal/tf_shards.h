// TensorFlow data shards (`ckpt-1.data-00000-of-00001`) have no header:
// their tensors are known only from the bundle's .index, a sibling file
// written just after them. The store finds that index among the file's
// siblings (same directory, owner and save) and lets the content decide
// (formats::MatchTfDataShard); see codec/formats/tf_bundle.h.
#pragma once

#include <chrono>
#include <optional>

#include "codec/formats/layout.h"
#include "codec/lossy/siblings.h"

namespace ckptfs {

// How long the seal of a file named like a data shard waits for its index:
// TF closes the data file, then writes the index, and the seal starts at
// the close. Files named otherwise do not wait.
inline constexpr std::chrono::milliseconds kTfIndexWait{3000};

// Index files larger than this are not parsed as candidates.
inline constexpr uint64_t kMaxTfIndexBytes = 64u << 20;

// A file of unknown format named otherwise is looked up once, and only from
// this size: listing a directory of many small files for each would cost
// more than their tensors could save.
inline constexpr uint64_t kMinUnnamedTfShardBytes = 1u << 20;

// The layout of `file` as a data shard of a bundle whose .index is among
// `siblings`; nothing when no sibling index describes it by content. A
// file named like a data shard waits up to `wait` for its index.
std::optional<FileLayout> TfDataLayoutFromSiblings(const ByteSource& file, SiblingSource& siblings,
                                                   std::chrono::milliseconds wait = kTfIndexWait);

}  // namespace ckptfs
