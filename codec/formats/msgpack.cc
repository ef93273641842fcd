#include "codec/formats/msgpack.h"

#include <string>
#include <utility>
#include <vector>

#include "codec/formats/forward_reader.h"
#include "codec/formats/limits.h"

namespace ckptfs::formats {
namespace {

constexpr int8_t kNdarrayExt = 1;  // flax.serialization._MsgpackExtType.ndarray

enum class Kind { kNil, kBool, kInt, kFloat, kStr, kBin, kArray, kMap, kExt };

// One msgpack head: the kind and, for containers, strings, binaries and
// ext values, the count or byte length that follows.
struct Head {
  Kind kind = Kind::kNil;
  uint64_t n = 0;       // elements (array), pairs (map), bytes (str, bin, ext)
  int64_t value = 0;    // kInt (uint64 above INT64_MAX is clamped: not a dim anyway)
  int8_t ext_type = 0;  // kExt
};

Result<Head> ReadHead(ForwardReader& r) {
  ASSIGN_OR_RETURN(uint8_t b, r.Byte());
  Head h;
  auto sized = [&](Kind k, unsigned bytes) -> Result<Head> {
    h.kind = k;
    ASSIGN_OR_RETURN(h.n, r.BigEndian(bytes));
    return h;
  };
  auto ext = [&](unsigned len_bytes, uint64_t fixed) -> Result<Head> {
    h.kind = Kind::kExt;
    if (len_bytes) {
      ASSIGN_OR_RETURN(h.n, r.BigEndian(len_bytes));
    } else {
      h.n = fixed;
    }
    ASSIGN_OR_RETURN(uint8_t t, r.Byte());
    h.ext_type = static_cast<int8_t>(t);
    return h;
  };
  auto integer = [&](unsigned bytes, bool is_signed) -> Result<Head> {
    h.kind = Kind::kInt;
    ASSIGN_OR_RETURN(uint64_t v, r.BigEndian(bytes));
    if (is_signed && bytes < 8 && (v >> (8 * bytes - 1))) v |= ~uint64_t{0} << (8 * bytes);  // sign-extend
    h.value = !is_signed && v > INT64_MAX ? INT64_MAX : static_cast<int64_t>(v);
    return h;
  };
  if (b <= 0x7f) return Head{Kind::kInt, 0, b};
  if (b >= 0xe0) return Head{Kind::kInt, 0, static_cast<int8_t>(b)};
  if (b <= 0x8f) return Head{Kind::kMap, uint64_t{b & 0x0fu}};
  if (b <= 0x9f) return Head{Kind::kArray, uint64_t{b & 0x0fu}};
  if (b <= 0xbf) return Head{Kind::kStr, uint64_t{b & 0x1fu}};
  switch (b) {
    case 0xc0: return Head{Kind::kNil};
    case 0xc2: case 0xc3: return Head{Kind::kBool};
    case 0xc4: return sized(Kind::kBin, 1);
    case 0xc5: return sized(Kind::kBin, 2);
    case 0xc6: return sized(Kind::kBin, 4);
    case 0xc7: return ext(1, 0);
    case 0xc8: return ext(2, 0);
    case 0xc9: return ext(4, 0);
    case 0xca: RETURN_IF_ERROR(r.Skip(4)); return Head{Kind::kFloat};
    case 0xcb: RETURN_IF_ERROR(r.Skip(8)); return Head{Kind::kFloat};
    case 0xcc: return integer(1, false);
    case 0xcd: return integer(2, false);
    case 0xce: return integer(4, false);
    case 0xcf: return integer(8, false);
    case 0xd0: return integer(1, true);
    case 0xd1: return integer(2, true);
    case 0xd2: return integer(4, true);
    case 0xd3: return integer(8, true);
    case 0xd4: return ext(0, 1);
    case 0xd5: return ext(0, 2);
    case 0xd6: return ext(0, 4);
    case 0xd7: return ext(0, 8);
    case 0xd8: return ext(0, 16);
    case 0xd9: return sized(Kind::kStr, 1);
    case 0xda: return sized(Kind::kStr, 2);
    case 0xdb: return sized(Kind::kStr, 4);
    case 0xdc: return sized(Kind::kArray, 2);
    case 0xdd: return sized(Kind::kArray, 4);
    case 0xde: return sized(Kind::kMap, 2);
    case 0xdf: return sized(Kind::kMap, 4);
    default: return Malformed("msgpack: byte 0xc1 is never used");
  }
}

class Walker {
 public:
  Walker(const ByteSource& src, FileLayout* out) : src_(src), out_(out) {}

  // The item at the reader's position, all of it, under key path `label`.
  Status Item(ForwardReader& r, const std::string& label, unsigned depth) {
    if (depth > kMaxMsgpackDepth) return Malformed("msgpack: nested too deep");
    ASSIGN_OR_RETURN(Head h, ReadHead(r));
    switch (h.kind) {
      case Kind::kStr:
      case Kind::kBin:
        return r.Skip(h.n);
      case Kind::kExt: {
        const uint64_t body = r.pos();
        RETURN_IF_ERROR(r.Skip(h.n));
        if (h.ext_type == kNdarrayExt) Ndarray(body, h.n, label);
        return Status::Ok();
      }
      case Kind::kArray:
        for (uint64_t i = 0; i < h.n; ++i) RETURN_IF_ERROR(Item(r, Join(label, std::to_string(i)), depth + 1));
        return Status::Ok();
      case Kind::kMap:
        for (uint64_t i = 0; i < h.n; ++i) {
          ASSIGN_OR_RETURN(std::string key, Key(r));
          RETURN_IF_ERROR(Item(r, Join(label, key), depth + 1));
        }
        return Status::Ok();
      default:
        return Status::Ok();
    }
  }

  uint64_t ndarrays = 0, kept_as_metadata = 0;

 private:
  static std::string Join(const std::string& a, const std::string& b) { return a.empty() ? b : a + "." + b; }

  // Flax's keys are strings; other scalars are named by value.
  Result<std::string> Key(ForwardReader& r) {
    ASSIGN_OR_RETURN(Head h, ReadHead(r));
    if (h.kind == Kind::kStr) return r.String(h.n);
    if (h.kind == Kind::kInt) return std::to_string(h.value);
    if (h.kind == Kind::kArray || h.kind == Kind::kMap || h.kind == Kind::kExt || h.kind == Kind::kBin) {
      return Malformed("msgpack: a map key that is not a string or number");
    }
    return std::string("?");
  }

  // The ext body (shape, dtype name, bytes); anything else in an ext of
  // type 1 is kept as metadata, never an error.
  void Ndarray(uint64_t body, uint64_t len, const std::string& label) {
    ++ndarrays;
    ForwardReader r(src_, body, body + len);
    Result<TensorRegion> t = Region(r, label);
    if (t.ok() && r.done()) {
      t->order = static_cast<uint32_t>(out_->tensors.size());
      out_->tensors.push_back(std::move(t).value());
    } else {
      ++kept_as_metadata;
    }
  }

  Result<TensorRegion> Region(ForwardReader& r, const std::string& label) {
    ASSIGN_OR_RETURN(Head tuple, ReadHead(r));
    if (tuple.kind != Kind::kArray || tuple.n != 3) return Malformed("ndarray: not (shape, dtype, data)");
    ASSIGN_OR_RETURN(Head shape, ReadHead(r));
    if (shape.kind != Kind::kArray || shape.n > kMaxDims) return Malformed("ndarray: bad shape");
    TensorRegion t;
    for (uint64_t i = 0; i < shape.n; ++i) {
      ASSIGN_OR_RETURN(Head d, ReadHead(r));
      if (d.kind != Kind::kInt || d.value < 0) return Malformed("ndarray: bad dim");
      t.shape.push_back(static_cast<uint64_t>(d.value));
    }
    ASSIGN_OR_RETURN(Head name, ReadHead(r));
    if (name.kind != Kind::kStr || name.n > 64) return Malformed("ndarray: bad dtype");
    ASSIGN_OR_RETURN(std::string dtype, r.String(name.n));
    ASSIGN_OR_RETURN(Head data, ReadHead(r));
    if (data.kind != Kind::kBin) return Malformed("ndarray: data is not bytes");
    t.dtype = NumpyNameToDType(dtype);
    auto numel = NumElements(t.shape);
    auto bytes = numel && t.dtype != DType::kUnknown ? CheckedMul(*numel, DTypeSize(t.dtype)) : std::nullopt;
    if (bytes != data.n) return Malformed("ndarray: size disagrees with dtype and shape");
    t.offset = r.pos();
    t.length = data.n;
    RETURN_IF_ERROR(r.Skip(data.n));
    t.name = t.label = label;
    return t;
  }

  const ByteSource& src_;
  FileLayout* out_;
};

}  // namespace

bool LooksLikeMsgpackMap(std::span<const uint8_t> head) {
  return !head.empty() && ((head[0] >= 0x80 && head[0] <= 0x8f) || head[0] == 0xde || head[0] == 0xdf);
}

DType NumpyNameToDType(std::string_view n) {
  static const std::pair<std::string_view, DType> kMap[] = {
      {"float32", DType::kF32},      {"float64", DType::kF64},         {"float16", DType::kF16},
      {"bfloat16", DType::kBF16},    {"int8", DType::kI8},             {"int16", DType::kI16},
      {"int32", DType::kI32},        {"int64", DType::kI64},           {"uint8", DType::kU8},
      {"uint16", DType::kU16},       {"uint32", DType::kU32},          {"uint64", DType::kU64},
      {"bool", DType::kBool},        {"complex64", DType::kC64},       {"complex128", DType::kC128},
      {"float8_e4m3fn", DType::kF8E4M3}, {"float8_e5m2", DType::kF8E5M2},
  };
  for (const auto& [name, t] : kMap) {
    if (n == name) return t;
  }
  return DType::kUnknown;
}

Result<FileLayout> ParseFlaxMsgpack(const ByteSource& src) {
  FileLayout l;
  l.format = "flax-msgpack";
  // optax's mu and nu trees get Adam's roles by label (lossy/roles.h).
  Walker w(src, &l);
  ForwardReader r(src, 0, src.size());
  RETURN_IF_ERROR(w.Item(r, "", 0));
  if (!r.done()) return Malformed("msgpack: bytes after the state map");
  if (w.ndarrays == 0) return Malformed("msgpack: a map without ndarrays");
  l.note = std::to_string(w.ndarrays) + " ndarrays";
  if (w.kept_as_metadata) l.note += "; " + std::to_string(w.kept_as_metadata) + " kept as metadata";
  return l;
}

}  // namespace ckptfs::formats
