// Which tensors of a checkpoint are model weights and which are optimizer
// moments, and which second moment (Adam's v) goes with each, so the lossy
// encoder can weigh errors by sensitivity; and which tensors lossy mode may
// touch at all (its scope, docs/SEMANTICS.md "Lossy mode"). Decided from the
// layout alone (format, labels, containers and order the parsers found),
// never from file names.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "codec/formats/layout.h"

namespace ckptfs::lossy {

enum class TensorRole : uint8_t {
  kOther = 0,   // not floating point, or nothing lossy may touch (data, buffers)
  kWeight = 1,  // a model parameter (any floating-point tensor under LossyScope::kAll)
  kAdamM = 2,   // first moment (exp_avg, momentum_buffer)
  kAdamV = 3,   // second moment (exp_avg_sq, max_exp_avg_sq): non-negative
};

const char* TensorRoleName(TensorRole r);

// What a lossy policy may quantize.
enum class LossyScope : uint8_t {
  // Parameters and optimizer moments that the file proves are such, by its
  // format or its structure, never by names alone:
  //  - torch.save files (zip or legacy): a tensor stored as a value of a
  //    Module.state_dict() (an OrderedDict carrying the `_metadata` that
  //    state_dict() attaches); the exp_avg, exp_avg_sq, max_exp_avg_sq and
  //    momentum_buffer of an optimizer state_dict's per-parameter entries
  //    (a dict with "param_groups" and a "state" dict of such entries); and
  //    any other tensor that one of those entries matches, by order, element
  //    type and shape (AssignRoles) or by name (the entry's key, or the
  //    param_groups' "param_names");
  //  - safetensors, GGUF, DCP, Orbax and Flax msgpack files: every float tensor.
  // Either way, a tensor whose name's last component names a buffer
  // (running_*, num_batches_tracked, inv_freq, position_ids, masked_bias)
  // or data (IsDataName) stays exact, and so does every tensor of a NumPy
  // file (.npy, .npz): names only ever keep a tensor exact.
  kModels = 0,
  // Every float tensor of every format lossy mode handles (npy and npz
  // included, buffers and data too): opt-in, for arrays known to tolerate it.
  kAll = 1,
};
const char* LossyScopeName(LossyScope s);

// Last name components that say a tensor is data or a buffer, not a
// parameter ("inputs", "train.labels", "bn1.running_var").
bool IsDataName(std::string_view last_component);
bool IsBufferName(std::string_view last_component);

struct RoleAssignment {
  TensorRole role = TensorRole::kOther;
  // Index into layout.tensors of the second moment that belongs to the same
  // parameter (for kWeight and kAdamM), or -1 when there is none. It has the
  // same element count and element type.
  int32_t partner_v = -1;
};

// One entry per layout.tensors element, in the same order. Tensors outside
// `scope` get kOther.
std::vector<RoleAssignment> AssignRoles(const FileLayout& layout, LossyScope scope = LossyScope::kModels);

}  // namespace ckptfs::lossy
