// ONNX models (onnx.save): a protobuf ModelProto with no magic number. The
// weights are the graph's initializers (TensorProto), whose raw_data bytes
// (little-endian) lie in the file as they are; an initializer whose data is
// elsewhere (external data, or typed fields such as float_data) gives no
// region. The file is walked without reading what it skips, so a 2 GB model
// costs a few reads per graph field. A file is taken for ONNX only when its
// whole top level parses as a ModelProto holding a graph: anything else
// falls through to the other probes.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "codec/formats/layout.h"

namespace ckptfs::formats {

// Cheap probe: the file starts with ModelProto.ir_version (field 1, varint)
// of a plausible value.
bool LooksLikeOnnx(std::span<const uint8_t> head);

// Format "onnx", one region per raw_data initializer whose size matches its
// dtype and dims. ONNX carries no checksum, but a model's weights are its
// output, so lossy_allowed is false (docs/ARCHITECTURE.md, lossy scope).
Result<FileLayout> ParseOnnx(const ByteSource& src);

// ONNX TensorProto.DataType -> our element type; kUnknown for strings,
// 4-bit and other types we have no name for.
DType OnnxDTypeToDType(int64_t onnx_dtype);

// An initializer whose bytes are in an external data file
// (onnx.save(..., save_as_external_data=True)): the file is named by
// `location`, relative to the model's directory.
struct OnnxExternalTensor {
  std::string name;
  DType dtype = DType::kUnknown;
  std::vector<uint64_t> dims;
  std::string location;
  uint64_t offset = 0;                // "offset" key; 0 when absent
  std::optional<uint64_t> length;     // "length" key
  bool valid = true;                  // dims and offset/length keys parsed
};

// The external tensors a model names; an error when it is not an ONNX model.
Result<std::vector<OnnxExternalTensor>> ReadOnnxExternalTensors(const ByteSource& model);

// The layout of the external data file called `file` (its name in the
// model's directory) of `file_size` bytes: format "onnx-external",
// lossy_allowed false, one region per tensor the model places in it.
// Nothing when the model places no tensor there, or places one past its end
// (the model describes another version of the file).
std::optional<FileLayout> OnnxExternalLayout(const std::vector<OnnxExternalTensor>& refs, const std::string& file,
                                             uint64_t file_size);

}  // namespace ckptfs::formats
