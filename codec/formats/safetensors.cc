#include "codec/formats/safetensors.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>

#include "codec/formats/limits.h"
#include "store/le.h"

namespace ckptfs::formats {
namespace {

using nlohmann::json;

// The reference reader caps the header at 100 MB.
constexpr uint64_t kMaxHeader = 100'000'000;

struct DTypeInfo {
  DType dtype;  // kU8 for types ckptfs has no name for (F4, F6_*, F8_E8M0, *FNUZ)
  unsigned bits;
};

std::optional<DTypeInfo> LookupDType(const std::string& s) {
  static const std::pair<const char*, DTypeInfo> kMap[] = {
      {"F64", {DType::kF64, 64}},       {"F32", {DType::kF32, 32}},       {"F16", {DType::kF16, 16}},
      {"BF16", {DType::kBF16, 16}},     {"F8_E4M3", {DType::kF8E4M3, 8}}, {"F8_E5M2", {DType::kF8E5M2, 8}},
      {"I64", {DType::kI64, 64}},       {"I32", {DType::kI32, 32}},       {"I16", {DType::kI16, 16}},
      {"I8", {DType::kI8, 8}},          {"U8", {DType::kU8, 8}},          {"BOOL", {DType::kBool, 8}},
      {"U16", {DType::kU16, 16}},       {"U32", {DType::kU32, 32}},       {"U64", {DType::kU64, 64}},
      {"C64", {DType::kC64, 64}},       {"F8_E8M0", {DType::kU8, 8}},     {"F8_E4M3FNUZ", {DType::kU8, 8}},
      {"F8_E5M2FNUZ", {DType::kU8, 8}}, {"F4", {DType::kU8, 4}},          {"F6_E2M3", {DType::kU8, 6}},
      {"F6_E3M2", {DType::kU8, 6}},
  };
  for (const auto& [name, info] : kMap) {
    if (s == name) return info;
  }
  return std::nullopt;
}

Result<uint64_t> Unsigned(const json& v, const std::string& what) {
  if (!v.is_number_unsigned()) return Malformed("safetensors: " + what + " is not a non-negative integer");
  return v.get<uint64_t>();
}

Result<std::vector<uint64_t>> Shape(const json& v, const std::string& name) {
  if (!v.is_array() || v.size() > kMaxDims) return Malformed("safetensors: bad shape for " + name);
  std::vector<uint64_t> shape;
  for (const json& d : v) {
    ASSIGN_OR_RETURN(uint64_t n, Unsigned(d, "shape of " + name));
    shape.push_back(n);
  }
  return shape;
}

// One header entry -> a region at an absolute offset, with its byte length
// checked against dtype and shape as the reference reader does.
Result<TensorRegion> Entry(const std::string& name, const json& v, uint64_t buf_start, uint64_t file_size) {
  if (!v.is_object()) return Malformed("safetensors: entry is not an object: " + name);
  auto dt = v.find("dtype"), sh = v.find("shape"), off = v.find("data_offsets");
  if (dt == v.end() || sh == v.end() || off == v.end() || !dt->is_string()) {
    return Malformed("safetensors: incomplete entry: " + name);
  }
  auto info = LookupDType(dt->get_ref<const std::string&>());
  if (!info) return Malformed("safetensors: unknown dtype for " + name);
  if (!off->is_array() || off->size() != 2) return Malformed("safetensors: bad data_offsets for " + name);
  ASSIGN_OR_RETURN(uint64_t b, Unsigned((*off)[0], "offset"));
  ASSIGN_OR_RETURN(uint64_t e, Unsigned((*off)[1], "offset"));
  ASSIGN_OR_RETURN(std::vector<uint64_t> shape, Shape(*sh, name));
  auto numel = NumElements(shape);
  auto bits = numel ? CheckedMul(*numel, info->bits) : std::nullopt;
  if (e < b || !bits || *bits % 8 != 0 || *bits / 8 != e - b)
    return Malformed("safetensors: size mismatch for " + name);
  auto abs = CheckedAdd(buf_start, b);
  if (!abs || !InRange(*abs, e - b, file_size)) return Malformed("safetensors: tensor past end of file: " + name);
  TensorRegion r;
  r.name = name;
  r.label = name;
  r.dtype = info->dtype;
  r.shape = std::move(shape);
  r.offset = *abs;
  r.length = e - b;
  if (info->bits < 8) r.shape = {r.length};  // sub-byte types: describe the packed bytes
  return r;
}

// The header is parsed into a sorted map, so its order is lost; data order
// stands in (the safetensors library writes by dtype, then name).
void AssignOffsetOrder(std::vector<TensorRegion>* t) {
  std::vector<uint32_t> idx(t->size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) { return (*t)[a].offset < (*t)[b].offset; });
  for (uint32_t k = 0; k < idx.size(); ++k) (*t)[idx[k]].order = k;
}

}  // namespace

bool LooksLikeSafetensors(std::span<const uint8_t> head, uint64_t file_size) {
  if (head.size() < 9) return false;
  uint64_t n = le::Get64(head, 0);
  return n >= 2 && n <= kMaxHeader && n <= file_size - 8 && head[8] == '{';
}

Result<FileLayout> ParseSafetensors(const ByteSource& src) {
  uint8_t len[8];
  RETURN_IF_ERROR(src.ReadAt(0, len));
  uint64_t n = le::Get64(len, 0);
  if (n > kMaxHeader || !InRange(8, n, src.size())) return Malformed("safetensors: bad header length");
  ASSIGN_OR_RETURN(std::vector<uint8_t> text, ReadBounded(src, 8, n, "safetensors header"));
  json header = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return Malformed("safetensors: header is not a JSON object");
  if (header.size() > kMaxEntries) return Malformed("safetensors: too many tensors");
  FileLayout l;
  l.format = "safetensors";
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    ASSIGN_OR_RETURN(TensorRegion r, Entry(name, v, 8 + n, src.size()));
    if (r.length > 0) l.tensors.push_back(std::move(r));
  }
  AssignOffsetOrder(&l.tensors);
  return l;
}

}  // namespace ckptfs::formats
