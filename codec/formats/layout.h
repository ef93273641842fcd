// Content-based layout of checkpoint files: which byte ranges hold tensor
// storages (and of what element type) and which hold metadata. Parsers
// never trust the file: every length and offset is checked against the file
// size, and bad input yields format "unknown" rather than an error.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/byte_source.h"
#include "base/status.h"
#include "codec/dtype.h"

namespace ckptfs {

// ByteSource and its adapters (SpanSource, FdSource, SubSource): base/byte_source.h.

struct TensorRegion {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;  // C order (outermost first) as laid out in the bytes
  uint64_t offset = 0;          // absolute, in the file
  uint64_t length = 0;          // bytes, > 0
  // What the file calls the tensor: the dict key a torch storage is first
  // stored under ("layer.0.weight", "exp_avg_sq"), or the safetensors, npz
  // or GGUF tensor name. Lossy mode tells weights from optimizer moments by it.
  std::string label;
  // Position in the file's own order (torch: first appearance in the pickle),
  // which pairs optimizer state with parameters; file order when unknown.
  uint32_t order = 0;
  // torch: the tensor is a value of a Module.state_dict() (an OrderedDict
  // carrying `_metadata`), or of one parameter's entry in an optimizer
  // state_dict's "state" (formats::StorageRef). Lossy mode's scope uses them.
  bool module_entry = false;
  bool optimizer_entry = false;
};

// A zip member whose CRC-32 must follow its data: when lossy mode rewrites
// the member's bytes, every field naming it is patched with the new CRC.
struct ZipCrcField {
  uint64_t data_offset = 0;  // absolute: the member's stored bytes
  uint64_t data_length = 0;
  // Absolute offsets of the 4-byte little-endian CRC-32 fields that name
  // this member: local header, central directory, data descriptor.
  std::vector<uint64_t> field_offsets;
};

struct FileLayout {
  // "torch-zip", "torch-legacy", "safetensors", "npy", "npz", "gguf",
  // "tf-bundle-data", "tf-bundle-index", "dcp", "onnx", "flax-msgpack", "hdf5", "keras",
  // "onnx-external" (only from a sibling model: seal/onnx_external.h),
  // "unknown"
  std::string format = "unknown";
  std::vector<TensorRegion> tensors;  // sorted by offset, non-overlapping, inside the file
  bool lossy_allowed = true;          // false for formats whose loaders verify data checksums (TF)
  // torch: the pickle holds an optimizer's state_dict (a dict with
  // "param_groups" and a "state" dict), so exp_avg & co. in its entries are
  // optimizer moments.
  bool optimizer_state = false;
  // torch: the keys of that "state" when they are parameter names rather
  // than indices (PickleScan::state_names).
  std::vector<std::string> state_names;
  // torch: the names of the optimizer's parameters in index order, when
  // its param_groups carry them (PickleScan::param_names); else empty.
  std::vector<std::string> param_names;
  // torch: the optimizer's param_groups learning rates and epsilons
  // (PickleScan::group_lrs, group_eps); empty when none were plain numbers.
  std::vector<double> group_lrs, group_eps;
  // Orbax: the tree path of every array of the save, whichever data file
  // holds it, so that lossy roles know an optax nu's mu twin exists when
  // TensorStore put the two in different files (codec/lossy/roles.cc).
  std::vector<std::string> save_arrays;
  std::string note;                   // why "unknown", or what was skipped; for logs
  // Stored (uncompressed) zip members holding tensors: torch-zip, npz, DCP.
  std::vector<ZipCrcField> zip_crcs;
};

// Never fails on bad input: unknown, truncated or malformed files give
// format "unknown" with a note. Work is bounded by the caps in limits.h.
FileLayout DetectLayout(const ByteSource& src);

}  // namespace ckptfs
