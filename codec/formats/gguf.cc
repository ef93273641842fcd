#include "codec/formats/gguf.h"

#include <algorithm>

#include "codec/formats/limits.h"

namespace ckptfs::formats {
namespace {

constexpr uint32_t kDefaultAlignment = 32;
constexpr int kMaxArrayNesting = 4;

enum ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

uint64_t FixedSize(uint32_t t) {
  switch (t) {
    case kU8:
    case kI8:
    case kBool:
      return 1;
    case kU16:
    case kI16:
      return 2;
    case kU32:
    case kI32:
    case kF32:
      return 4;
    case kU64:
    case kI64:
    case kF64:
      return 8;
    default:
      return 0;
  }
}

// ggml types: element dtype for plain ones, and (block elements, block
// bytes) for all known ones, from ggml's type_traits table.
struct GgmlType {
  DType dtype;  // kU8 for quantized blocks
  uint32_t block;
  uint32_t bytes;
};
std::optional<GgmlType> LookupGgml(uint32_t t) {
  switch (t) {
    case 0:
      return GgmlType{DType::kF32, 1, 4};
    case 1:
      return GgmlType{DType::kF16, 1, 2};
    case 2:
      return GgmlType{DType::kU8, 32, 18};  // Q4_0
    case 3:
      return GgmlType{DType::kU8, 32, 20};  // Q4_1
    case 6:
      return GgmlType{DType::kU8, 32, 22};  // Q5_0
    case 7:
      return GgmlType{DType::kU8, 32, 24};  // Q5_1
    case 8:
      return GgmlType{DType::kU8, 32, 34};  // Q8_0
    case 9:
      return GgmlType{DType::kU8, 32, 36};  // Q8_1
    case 10:
      return GgmlType{DType::kU8, 256, 84};  // Q2_K
    case 11:
      return GgmlType{DType::kU8, 256, 110};  // Q3_K
    case 12:
      return GgmlType{DType::kU8, 256, 144};  // Q4_K
    case 13:
      return GgmlType{DType::kU8, 256, 176};  // Q5_K
    case 14:
      return GgmlType{DType::kU8, 256, 210};  // Q6_K
    case 15:
      return GgmlType{DType::kU8, 256, 292};  // Q8_K
    case 16:
      return GgmlType{DType::kU8, 256, 66};  // IQ2_XXS
    case 17:
      return GgmlType{DType::kU8, 256, 74};  // IQ2_XS
    case 18:
      return GgmlType{DType::kU8, 256, 98};  // IQ3_XXS
    case 19:
      return GgmlType{DType::kU8, 256, 50};  // IQ1_S
    case 20:
      return GgmlType{DType::kU8, 32, 18};  // IQ4_NL
    case 21:
      return GgmlType{DType::kU8, 256, 110};  // IQ3_S
    case 22:
      return GgmlType{DType::kU8, 256, 82};  // IQ2_S
    case 23:
      return GgmlType{DType::kU8, 256, 136};  // IQ4_XS
    case 24:
      return GgmlType{DType::kI8, 1, 1};
    case 25:
      return GgmlType{DType::kI16, 1, 2};
    case 26:
      return GgmlType{DType::kI32, 1, 4};
    case 27:
      return GgmlType{DType::kI64, 1, 8};
    case 28:
      return GgmlType{DType::kF64, 1, 8};
    case 29:
      return GgmlType{DType::kU8, 256, 56};  // IQ1_M
    case 30:
      return GgmlType{DType::kBF16, 1, 2};
    case 34:
      return GgmlType{DType::kU8, 256, 54};  // TQ1_0
    case 35:
      return GgmlType{DType::kU8, 256, 66};  // TQ2_0
    case 39:
      return GgmlType{DType::kU8, 32, 17};  // MXFP4
    default:
      return std::nullopt;
  }
}

Result<std::string> GgufString(Cursor& c) {
  ASSIGN_OR_RETURN(uint64_t n, c.U64());
  return c.String(n);
}

// Skips one value; arrays may nest, a little.
Status SkipValue(Cursor& c, uint32_t type, int depth) {
  if (uint64_t n = FixedSize(type)) return c.Skip(n);
  if (type == kString) {
    ASSIGN_OR_RETURN(uint64_t n, c.U64());
    return c.Skip(n);
  }
  if (type != kArray || depth >= kMaxArrayNesting) return Malformed("gguf: bad value type");
  ASSIGN_OR_RETURN(uint32_t et, c.U32());
  ASSIGN_OR_RETURN(uint64_t count, c.U64());
  if (uint64_t n = FixedSize(et)) {
    auto bytes = CheckedMul(count, n);
    if (!bytes) return Malformed("gguf: array too large");
    return c.Skip(*bytes);
  }
  // Each string or array element takes at least 8 bytes, which bounds the loop.
  for (uint64_t i = 0; i < count; ++i) {
    RETURN_IF_ERROR(SkipValue(c, et, depth + 1));
    if (c.pos() > kMaxMetadataBytes) return Malformed("gguf: metadata too large");
  }
  return Status::Ok();
}

// Reads the KVs, returning general.alignment (or the default).
Result<uint32_t> ReadMetadata(Cursor& c, uint64_t kv_count) {
  uint32_t alignment = kDefaultAlignment;
  for (uint64_t i = 0; i < kv_count; ++i) {
    ASSIGN_OR_RETURN(std::string key, GgufString(c));
    ASSIGN_OR_RETURN(uint32_t type, c.U32());
    if (key == "general.alignment" && type == kU32) {
      ASSIGN_OR_RETURN(alignment, c.U32());
      if (alignment == 0 || (alignment & (alignment - 1)) != 0) return Malformed("gguf: alignment not a power of two");
    } else {
      RETURN_IF_ERROR(SkipValue(c, type, 0));
    }
    if (c.pos() > kMaxMetadataBytes) return Malformed("gguf: metadata too large");
  }
  return alignment;
}

struct Info {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] innermost
  uint32_t type = 0;
  uint64_t offset = 0;  // relative to the data section
  uint32_t order = 0;   // position in the header, which sorting by offset loses
};

Result<Info> ReadInfo(Cursor& c) {
  Info t;
  ASSIGN_OR_RETURN(t.name, GgufString(c));
  ASSIGN_OR_RETURN(uint32_t nd, c.U32());
  if (nd > kMaxDims) return Malformed("gguf: too many dims: " + t.name);
  for (uint32_t d = 0; d < nd; ++d) {
    ASSIGN_OR_RETURN(uint64_t n, c.U64());
    t.ne.push_back(n);
  }
  ASSIGN_OR_RETURN(t.type, c.U32());
  ASSIGN_OR_RETURN(t.offset, c.U64());
  return t;
}

// Byte size from the block layout; nullopt for unknown types.
Result<std::optional<uint64_t>> TensorBytes(const Info& t) {
  auto g = LookupGgml(t.type);
  if (!g) return std::optional<uint64_t>();
  auto numel = NumElements(t.ne);
  if (!numel) return Malformed("gguf: element count overflows: " + t.name);
  if (!t.ne.empty() && t.ne[0] % g->block != 0) return Malformed("gguf: row not a whole number of blocks: " + t.name);
  auto bytes = CheckedMul(*numel / g->block, g->bytes);
  if (!bytes) return Malformed("gguf: tensor too large: " + t.name);
  return std::optional<uint64_t>(*bytes);
}

}  // namespace

Result<FileLayout> ParseGguf(const ByteSource& src) {
  Cursor c(src, 4);
  ASSIGN_OR_RETURN(uint32_t version, c.U32());
  if (version != 2 && version != 3) return Malformed("gguf: unsupported version " + std::to_string(version));
  ASSIGN_OR_RETURN(uint64_t n_tensors, c.U64());
  ASSIGN_OR_RETURN(uint64_t n_kv, c.U64());
  if (n_tensors > kMaxEntries || n_kv > kMaxEntries) return Malformed("gguf: too many entries");
  ASSIGN_OR_RETURN(uint32_t alignment, ReadMetadata(c, n_kv));
  std::vector<Info> infos;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    ASSIGN_OR_RETURN(Info t, ReadInfo(c));
    t.order = static_cast<uint32_t>(i);
    infos.push_back(std::move(t));
    if (c.pos() > kMaxMetadataBytes) return Malformed("gguf: tensor infos too large");
  }
  uint64_t data = (c.pos() + alignment - 1) / alignment * alignment;
  if (data > src.size()) return Malformed("gguf: data section past end of file");
  std::stable_sort(infos.begin(), infos.end(), [](const Info& a, const Info& b) { return a.offset < b.offset; });
  FileLayout l;
  l.format = "gguf";
  for (size_t i = 0; i < infos.size(); ++i) {
    const Info& t = infos[i];
    auto off = CheckedAdd(data, t.offset);
    if (!off || *off > src.size()) return Malformed("gguf: tensor past end of file: " + t.name);
    ASSIGN_OR_RETURN(std::optional<uint64_t> len, TensorBytes(t));
    // Unknown block layout: the tensor runs to the next one (or the end).
    if (!len) len = (i + 1 < infos.size() ? std::min(data + infos[i + 1].offset, src.size()) : src.size()) - *off;
    if (!InRange(*off, *len, src.size())) return Malformed("gguf: tensor past end of file: " + t.name);
    auto g = LookupGgml(t.type);
    TensorRegion r;
    r.name = t.name;
    r.label = t.name;
    r.order = t.order;
    r.dtype = g ? g->dtype : DType::kU8;
    r.offset = *off;
    r.length = *len;
    if (g && g->block == 1) {
      r.shape.assign(t.ne.rbegin(), t.ne.rend());  // C order: outermost first
    } else {
      r.shape = {r.length};
    }
    if (r.length > 0) l.tensors.push_back(std::move(r));
  }
  return l;
}

}  // namespace ckptfs::formats
