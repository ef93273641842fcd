// ONNX external data files (onnx.save(..., save_as_external_data=True)) are
// raw tensor bytes with no header: their tensors are known only from the
// model (.onnx) that names them, which onnx.save writes just after the data
// file (it appends tensor by tensor, closing the file after each, then
// serializes the model). The store finds that model among the file's
// siblings (same directory, owner and save) and trusts it only for a file
// of the name it gives and at least the size its tensors need.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "codec/formats/layout.h"
#include "codec/lossy/siblings.h"

namespace ckptfs {

// How long the seal of a file named like external data waits for its
// model; files named otherwise look once and do not wait.
inline constexpr std::chrono::milliseconds kOnnxModelWait{3000};

// Models larger than this are not parsed as candidates (protobuf's own
// limit is 2 GiB).
inline constexpr uint64_t kMaxOnnxModelBytes = 2ull << 30;

// A file of unknown format named otherwise is looked up once, and only
// from this size, as for TF data shards (seal/tf_shards.h).
inline constexpr uint64_t kMinUnnamedOnnxDataBytes = 1u << 20;

// Names onnx exporters give external data: "model.onnx.data",
// "model.onnx_data", "model.data". Not "*.bin": every generic .bin file's
// seal would wait for a model that never comes (a "weights.bin" beside its
// model is still found by the one look that large unknown files get).
bool LooksLikeOnnxDataName(const std::string& name);

// The layout of `file` as the external data of a model among `siblings`;
// nothing when no sibling model names it. A file named like external data
// waits up to `wait` for its model.
std::optional<FileLayout> OnnxExternalLayoutFromSiblings(const ByteSource& file, SiblingSource& siblings,
                                                         std::chrono::milliseconds wait = kOnnxModelWait);

}  // namespace ckptfs
