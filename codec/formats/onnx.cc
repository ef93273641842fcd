#include "codec/formats/onnx.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <string>
#include <vector>

#include "codec/formats/forward_reader.h"
#include "codec/formats/limits.h"

namespace ckptfs::formats {
namespace {

constexpr uint64_t kMaxIrVersion = 64;
// Protobuf varint over a ForwardReader.
Result<uint64_t> Varint(ForwardReader& c) {
  uint64_t r = 0;
  for (unsigned shift = 0; shift < 64; shift += 7) {
    ASSIGN_OR_RETURN(uint8_t b, c.Byte());
    if (shift == 63 && b > 1) return Malformed("onnx: varint over 64 bits");
    r |= uint64_t{b & 0x7fu} << shift;
    if (!(b & 0x80)) return r;
  }
  return Malformed("onnx: varint over 64 bits");
}

struct Field {
  uint32_t number = 0;
  uint8_t wire = 0;
  uint64_t value = 0;  // varint / fixed value, or the length of wire type 2
  uint64_t body = 0;   // wire type 2: where its bytes start
};

// Reads one tag and, for wire type 2, the length; the caller reads or skips
// the body (SkipBody).
Result<Field> NextField(ForwardReader& c) {
  ASSIGN_OR_RETURN(uint64_t tag, Varint(c));
  Field f;
  if (tag > UINT32_MAX || (tag >> 3) == 0) return Malformed("onnx: bad field tag");
  f.number = static_cast<uint32_t>(tag >> 3);
  f.wire = static_cast<uint8_t>(tag & 7);
  switch (f.wire) {
    case 0: {
      ASSIGN_OR_RETURN(f.value, Varint(c));
      return f;
    }
    case 1:
    case 5: {
      ASSIGN_OR_RETURN(f.value, c.LittleEndian(f.wire == 1 ? 8 : 4));
      return f;
    }
    case 2: {
      ASSIGN_OR_RETURN(f.value, Varint(c));
      if (f.value > c.end() - c.pos()) return Malformed("onnx: length-delimited field past its message");
      f.body = c.pos();
      return f;
    }
    default:
      return Malformed("onnx: unsupported wire type " + std::to_string(f.wire));
  }
}

Status SkipBody(ForwardReader& c, const Field& f) { return f.wire == 2 ? c.Skip(f.value) : Status::Ok(); }

Status Expect(const Field& f, uint8_t wire, const char* what) {
  if (f.wire == wire) return Status::Ok();
  return Malformed(std::string("onnx: ") + what + " has wire type " + std::to_string(f.wire));
}

struct Initializer {
  std::string name;
  int64_t data_type = 0;
  std::vector<uint64_t> dims;
  bool dims_ok = true;
  uint64_t raw_offset = 0, raw_length = 0;
  bool external = false;
  // external_data's location, offset and length keys.
  std::string location;
  std::optional<uint64_t> ext_offset, ext_length;
  bool ext_ok = true;  // every key we know parsed
};

// onnx writes these as plain decimal strings; anything else (sign, spaces,
// trailing bytes, more than 19 digits) marks the entry as unparsed.
std::optional<uint64_t> DecimalValue(const std::string& s) {
  if (s.empty() || s.size() > 19) return std::nullopt;
  uint64_t v = 0;
  const char* end = s.data() + s.size();
  const auto [ptr, ec] = std::from_chars(s.data(), end, v);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return v;
}

// StringStringEntryProto: key=1, value=2.
Status ParseExternalEntry(const ByteSource& src, uint64_t begin, uint64_t len, Initializer* t) {
  ForwardReader c(src, begin, begin + len);
  std::string key, value;
  while (!c.done()) {
    ASSIGN_OR_RETURN(Field f, NextField(c));
    if ((f.number == 1 || f.number == 2) && f.wire == 2) {
      ASSIGN_OR_RETURN(std::string v, c.String(f.value));
      (f.number == 1 ? key : value) = std::move(v);
    } else {
      RETURN_IF_ERROR(SkipBody(c, f));
    }
  }
  if (key == "location") {
    t->location = std::move(value);
  } else if (key == "offset" || key == "length") {
    const std::optional<uint64_t> v = DecimalValue(value);
    if (!v) t->ext_ok = false;
    (key == "offset" ? t->ext_offset : t->ext_length) = v;
  }
  return Status::Ok();
}

Status AddDim(Initializer* t, uint64_t v) {
  if (t->dims.size() >= kMaxDims) return Malformed("onnx: initializer has too many dims");
  if (static_cast<int64_t>(v) < 0) t->dims_ok = false;
  t->dims.push_back(v);
  return Status::Ok();
}

// TensorProto: dims=1 (int64, packed or not), data_type=2, name=8,
// raw_data=9, external_data=13, data_location=14 (1: EXTERNAL).
Result<Initializer> ParseTensor(const ByteSource& src, uint64_t begin, uint64_t len) {
  ForwardReader c(src, begin, begin + len);
  Initializer t;
  while (!c.done()) {
    ASSIGN_OR_RETURN(Field f, NextField(c));
    if (f.number == 1 && f.wire == 0) {
      RETURN_IF_ERROR(AddDim(&t, f.value));
    } else if (f.number == 1 && f.wire == 2) {
      ForwardReader packed(src, f.body, f.body + f.value);
      while (!packed.done()) {
        ASSIGN_OR_RETURN(uint64_t d, Varint(packed));
        RETURN_IF_ERROR(AddDim(&t, d));
      }
      RETURN_IF_ERROR(c.Skip(f.value));
    } else if (f.number == 2) {
      RETURN_IF_ERROR(Expect(f, 0, "TensorProto.data_type"));
      t.data_type = static_cast<int64_t>(f.value);
    } else if (f.number == 8) {
      RETURN_IF_ERROR(Expect(f, 2, "TensorProto.name"));
      ASSIGN_OR_RETURN(t.name, c.String(f.value));
    } else if (f.number == 9) {
      RETURN_IF_ERROR(Expect(f, 2, "TensorProto.raw_data"));
      t.raw_offset = f.body, t.raw_length = f.value;
      RETURN_IF_ERROR(c.Skip(f.value));
    } else if (f.number == 13) {
      RETURN_IF_ERROR(Expect(f, 2, "TensorProto.external_data"));
      RETURN_IF_ERROR(ParseExternalEntry(src, f.body, f.value, &t));
      RETURN_IF_ERROR(c.Skip(f.value));
    } else if (f.number == 14) {
      RETURN_IF_ERROR(Expect(f, 0, "TensorProto.data_location"));
      t.external = f.value == 1;
    } else {
      RETURN_IF_ERROR(SkipBody(c, f));
    }
  }
  return t;
}

// GraphProto: initializer=5; every other field is skipped unread.
Status ParseGraph(const ByteSource& src, uint64_t begin, uint64_t len, std::vector<Initializer>* out) {
  ForwardReader c(src, begin, begin + len);
  while (!c.done()) {
    ASSIGN_OR_RETURN(Field f, NextField(c));
    if (f.number == 5) {
      RETURN_IF_ERROR(Expect(f, 2, "GraphProto.initializer"));
      if (out->size() >= kMaxEntries) return Malformed("onnx: too many initializers");
      ASSIGN_OR_RETURN(Initializer t, ParseTensor(src, f.body, f.value));
      out->push_back(std::move(t));
    }
    RETURN_IF_ERROR(SkipBody(c, f));
  }
  return Status::Ok();
}

// ModelProto's fields and their wire types (onnx.proto, IR version 10).
bool IsModelField(const Field& f) {
  switch (f.number) {
    case 1:  // ir_version
    case 5:  // model_version
      return f.wire == 0;
    case 2: case 3: case 4: case 6:  // producer_name, producer_version, domain, doc_string
    case 7: case 8: case 14:         // graph, opset_import, metadata_props
    case 20: case 25: case 26:       // training_info, functions, configuration
      return f.wire == 2;
    default:
      return false;
  }
}

TensorRegion RegionOf(const Initializer& t, DType dtype, uint32_t order) {
  TensorRegion r;
  r.name = t.name;
  r.label = t.name;
  r.dtype = dtype;
  r.shape = t.dims;
  r.offset = t.raw_offset;
  r.length = t.raw_length;
  r.order = order;
  return r;
}

}  // namespace

bool LooksLikeOnnx(std::span<const uint8_t> head) {
  return head.size() >= 2 && head[0] == 0x08 && head[1] >= 1 && head[1] <= kMaxIrVersion;
}

DType OnnxDTypeToDType(int64_t t) {
  switch (t) {
    case 1: return DType::kF32;
    case 2: return DType::kU8;
    case 3: return DType::kI8;
    case 4: return DType::kU16;
    case 5: return DType::kI16;
    case 6: return DType::kI32;
    case 7: return DType::kI64;
    case 9: return DType::kBool;
    case 10: return DType::kF16;
    case 11: return DType::kF64;
    case 12: return DType::kU32;
    case 13: return DType::kU64;
    case 14: return DType::kC64;
    case 15: return DType::kC128;
    case 16: return DType::kBF16;
    case 17: return DType::kF8E4M3;  // FLOAT8E4M3FN
    case 19: return DType::kF8E5M2;
    default: return DType::kUnknown;  // STRING 8, the fnuz float8s, 4-bit types
  }
}

namespace {

Result<std::vector<Initializer>> ReadInitializers(const ByteSource& src) {
  ForwardReader c(src, 0, src.size());
  std::vector<Initializer> inits;
  bool graph = false, first = true;
  while (!c.done()) {
    ASSIGN_OR_RETURN(Field f, NextField(c));
    if (first && (f.number != 1 || f.wire != 0 || f.value == 0 || f.value > kMaxIrVersion)) {
      return Malformed("onnx: does not start with ir_version");
    }
    first = false;
    if (!IsModelField(f)) return Malformed("onnx: field " + std::to_string(f.number) + " is not a ModelProto's");
    if (f.number == 7) {
      if (graph) return Malformed("onnx: two graphs");
      graph = true;
      RETURN_IF_ERROR(ParseGraph(src, f.body, f.value, &inits));
    }
    RETURN_IF_ERROR(SkipBody(c, f));
  }
  if (!graph) return Malformed("onnx: no graph");
  return inits;
}

}  // namespace

Result<FileLayout> ParseOnnx(const ByteSource& src) {
  ASSIGN_OR_RETURN(std::vector<Initializer> inits, ReadInitializers(src));
  FileLayout l;
  l.format = "onnx";
  l.lossy_allowed = false;
  uint64_t elsewhere = 0, mismatched = 0;
  for (const Initializer& t : inits) {
    if (t.raw_length == 0) {
      ++elsewhere;
      continue;
    }
    const DType dtype = OnnxDTypeToDType(t.data_type);
    auto numel = NumElements(t.dims);
    auto bytes = numel && dtype != DType::kUnknown ? CheckedMul(*numel, DTypeSize(dtype)) : std::nullopt;
    if (!t.dims_ok || bytes != t.raw_length) {
      ++mismatched;
      continue;
    }
    l.tensors.push_back(RegionOf(t, dtype, static_cast<uint32_t>(l.tensors.size())));
  }
  l.note = std::to_string(inits.size()) + " initializers";
  if (elsewhere) l.note += "; " + std::to_string(elsewhere) + " without raw_data here (external or typed fields)";
  if (mismatched) l.note += "; " + std::to_string(mismatched) + " of unknown dtype or a size that disagrees";
  return l;
}

Result<std::vector<OnnxExternalTensor>> ReadOnnxExternalTensors(const ByteSource& model) {
  ASSIGN_OR_RETURN(std::vector<Initializer> inits, ReadInitializers(model));
  std::vector<OnnxExternalTensor> out;
  for (Initializer& t : inits) {
    if (!t.external || t.location.empty()) continue;
    OnnxExternalTensor e;
    e.name = std::move(t.name);
    e.dtype = OnnxDTypeToDType(t.data_type);
    e.dims = std::move(t.dims);
    e.location = std::move(t.location);
    e.offset = t.ext_offset.value_or(0);
    e.length = t.ext_length;
    e.valid = t.ext_ok && t.dims_ok;
    out.push_back(std::move(e));
  }
  return out;
}

// Relative locations name files beside the model; "./x" is x.
bool NamesFile(const std::string& location, const std::string& file) {
  return location == file || location == "./" + file;
}

std::optional<FileLayout> OnnxExternalLayout(const std::vector<OnnxExternalTensor>& refs, const std::string& file,
                                             uint64_t file_size) {
  if (file.empty()) return std::nullopt;
  FileLayout l;
  l.format = "onnx-external";
  l.lossy_allowed = false;
  uint64_t named = 0, unknown = 0;
  for (const OnnxExternalTensor& e : refs) {
    if (!NamesFile(e.location, file)) continue;
    ++named;
    const auto numel = NumElements(e.dims);
    const auto bytes = numel && e.dtype != DType::kUnknown ? CheckedMul(*numel, DTypeSize(e.dtype)) : std::nullopt;
    const uint64_t length = e.length.value_or(bytes.value_or(0));
    // A tensor past the end means the model describes another version of
    // this file: none of it is trusted.
    if (!e.valid || !InRange(e.offset, length, file_size)) return std::nullopt;
    if (!bytes || *bytes != length || length == 0) {
      ++unknown;
      continue;
    }
    TensorRegion r;
    r.name = e.name;
    r.label = e.name;
    r.dtype = e.dtype;
    r.shape = e.dims;
    r.offset = e.offset;
    r.length = length;
    r.order = static_cast<uint32_t>(l.tensors.size());
    l.tensors.push_back(std::move(r));
  }
  // The store takes this layout as it is (DetectLayout's checks do not
  // run on it): in order and without overlaps, whatever the model says.
  std::stable_sort(l.tensors.begin(), l.tensors.end(),
                   [](const auto& a, const auto& b) { return a.offset < b.offset; });
  uint64_t end = 0, overlapping = 0;
  std::erase_if(l.tensors, [&](const TensorRegion& r) {
    if (r.offset < end) return ++overlapping, true;
    end = r.offset + r.length;
    return false;
  });
  for (size_t i = 0; i < l.tensors.size(); ++i) l.tensors[i].order = static_cast<uint32_t>(i);
  if (l.tensors.empty()) return std::nullopt;
  l.note = std::to_string(named) + " tensors of the model";
  if (overlapping) l.note += "; " + std::to_string(overlapping) + " overlapping others dropped";
  if (unknown) l.note += "; " + std::to_string(unknown) + " of unknown dtype or a size that disagrees";
  return l;
}

}  // namespace ckptfs::formats
