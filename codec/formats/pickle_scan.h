// A pickle opcode scanner (protocols 0-5) that runs no Python. It executes
// just enough of the pickle machine (stack, marks, memo, tuples, globals) to
// collect torch's storage persistent IDs
//   ('storage', <torch.XStorage global>, key, location, numel[, ...]),
// the dict key each storage is first stored under, the dtype argument of
// _rebuild_tensor_v3 for untyped storages, the size and stride arguments
// of _rebuild_tensor_v2/v3, and enough about the dicts tensors are stored
// in to tell a module's state_dict and an optimizer's state from other
// tensors by the pickle's structure, never by names (lossy mode's scope,
// codec/lossy/roles.h).
// Everything else becomes an opaque value.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "codec/dtype.h"

namespace ckptfs::formats {

struct StorageRef {
  std::string key;
  std::string type;      // e.g. "torch.FloatStorage"
  std::string location;  // e.g. "cpu"
  uint64_t numel = 0;
  DType dtype = DType::kUnknown;  // from the type, or the v3 dtype for UntypedStorage
  unsigned elsize = 0;            // bytes per numel unit: 1 for untyped storages
  // The dict key the storage is first stored under ("layer.0.weight",
  // "exp_avg_sq"); empty when it is not a string key (list item, int key).
  std::string label;
  uint32_t index = 0;  // position in PickleScan::storages: first-seen order
  // Shape of the first tensor built on the storage, when that tensor covers
  // all of it, contiguously, in C order; empty otherwise.
  std::vector<uint64_t> shape;
  bool viewed = false;  // a tensor rebuild has named this storage
  // A tensor on this storage is a value of a Module.state_dict(): a
  // collections.OrderedDict whose pickled __dict__ holds the `_metadata`
  // OrderedDict that state_dict() attaches (an OrderedDict alone is not one).
  bool module_entry = false;
  // A tensor on this storage is a value of one parameter's entry in an
  // optimizer state_dict: {'state': {key: {name: tensor}}, 'param_groups': ...}.
  bool optimizer_entry = false;
};

// One entry of the storage_data of DCP's .metadata pickle
// (torch.distributed.checkpoint.metadata.Metadata): where a saved item of
// the state dict lives among the shard files.
struct DcpItem {
  std::string fqn;  // the state-dict key, e.g. "optim.state.fc.weight.exp_avg"
  // Rank of the fqn string's first appearance in the pickle: the
  // state_dict_metadata keys come first, in the state dict's own order.
  uint64_t fqn_order = 0;
  std::string relative_path;  // the shard file, e.g. "__0_0.distcp"
  uint64_t offset = 0;        // the item's torch.save archive within that file
  uint64_t length = 0;
};

struct PickleScan {
  std::vector<StorageRef> storages;   // in first-seen order, one per key
  uint64_t end = 0;                   // offset just past STOP
  std::vector<std::string> str_list;  // the result, when it is a list of strings
  // Some dict has the key "param_groups" and a dict under the key "state":
  // the pickle holds an optimizer's state_dict (Optimizer.state_dict()).
  bool optimizer_state = false;
  // The string keys of such a "state" dict, in order: optimizers keyed by
  // parameter name (FSDP's optim_state_dict) rather than by index.
  std::vector<std::string> state_names;
  // The "param_names" lists of its param_groups, concatenated in order
  // (torch >= 2.6 keeps them for optimizers built from named_parameters()):
  // the name of each parameter the optimizer state is keyed by index.
  std::vector<std::string> param_names;
  // The numeric "lr" and "eps" values of dicts in the pickle (an
  // optimizer's param_groups), in pickle order.
  std::vector<double> group_lrs, group_eps;
  // When the pickle is DCP's .metadata: its storage_data, in pickle order.
  std::vector<DcpItem> dcp_items;
};

// Fails on malformed input; a pickle cut short fails with code ENODATA so
// callers reading a prefix know to read more.
Result<PickleScan> ScanPickle(std::span<const uint8_t> bytes);

// "torch.FloatStorage" -> kF32 with element size; unknown -> {kUnknown, 0}.
struct StorageType {
  DType dtype;
  unsigned elsize;
};
StorageType StorageTypeInfo(const std::string& global_name);

}  // namespace ckptfs::formats
