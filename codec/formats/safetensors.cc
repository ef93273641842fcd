#include "codec/formats/safetensors.h"

#include <algorithm>
#include <iterator>
#include <nlohmann/json.hpp>
#include <numeric>

#include "codec/formats/limits.h"
#include "base/le.h"

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

// The header is streamed through a small buffer and never held whole: a
// header may be 100 MB, and a JSON DOM of it takes many times that. One
// token (a name, a metadata string) may be at most kMaxJsonToken long.
class HeaderReader {
 public:
  HeaderReader(const ByteSource& src, uint64_t off, uint64_t len) : src_(src), pos_(off), end_(off + len) {}
  bool AtEnd() {
    if (over_token_cap_ || !io_.ok() || pos_ >= end_) return true;
    if (buf_pos_ >= buf_.size()) Fill();
    return buf_pos_ >= buf_.size();
  }
  char Peek() const { return static_cast<char>(buf_[buf_pos_]); }
  void Advance() {
    ++buf_pos_;
    ++pos_;
    if (++since_event_ > kMaxJsonToken) over_token_cap_ = true;
  }
  // The parser delivered a token: the bytes before it are gone.
  void Event() { since_event_ = 0; }
  const Status& io() const { return io_; }
  bool over_token_cap() const { return over_token_cap_; }

 private:
  void Fill() {
    buf_.resize(std::min<uint64_t>(64 << 10, end_ - pos_));
    buf_pos_ = 0;
    io_ = src_.ReadAt(pos_, buf_);
    if (!io_.ok()) buf_.clear();
  }
  const ByteSource& src_;
  uint64_t pos_, end_;
  std::vector<uint8_t> buf_;
  size_t buf_pos_ = 0;
  uint64_t since_event_ = 0;
  bool over_token_cap_ = false;
  Status io_ = Status::Ok();
};

// An input iterator over a HeaderReader, for json::sax_parse.
class HeaderIter {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = char;
  HeaderIter() = default;
  explicit HeaderIter(HeaderReader* r) : r_(r) {}
  char operator*() const { return r_->Peek(); }
  HeaderIter& operator++() {
    r_->Advance();
    return *this;
  }
  HeaderIter operator++(int) {
    HeaderIter old = *this;
    r_->Advance();
    return old;
  }
  bool operator==(const HeaderIter& o) const { return AtEnd() == o.AtEnd(); }
  bool operator!=(const HeaderIter& o) const { return !(*this == o); }

 private:
  bool AtEnd() const { return r_ == nullptr || r_->AtEnd(); }
  HeaderReader* r_ = nullptr;
};

// Receives the header's tokens and builds one small DOM per tensor entry,
// which Entry() checks as before; `__metadata__` is skipped, not stored.
// What it keeps is bounded by kMaxLayoutBytes.
class HeaderSax {
 public:
  HeaderSax(HeaderReader* in, uint64_t buf_start, uint64_t file_size, std::vector<TensorRegion>* out)
      : in_(in), buf_start_(buf_start), file_size_(file_size), out_(out) {}

  bool null() { return Scalar(nullptr); }
  bool boolean(bool v) { return Scalar(v); }
  bool number_integer(json::number_integer_t v) { return Scalar(v); }
  bool number_unsigned(json::number_unsigned_t v) { return Scalar(v); }
  bool number_float(json::number_float_t v, const json::string_t&) { return Scalar(v); }
  bool string(json::string_t& v) { return Scalar(std::move(v)); }
  bool binary(json::binary_t&) { return Fail("safetensors: binary value in the header"); }
  bool start_object(std::size_t) { return Open(json::object()); }
  bool start_array(std::size_t) { return Open(json::array()); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }
  bool key(json::string_t& k) {
    in_->Event();
    if (depth_ == 1) {
      name_ = std::move(k);
      skipping_ = name_ == "__metadata__";
    } else {
      key_ = std::move(k);
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    return Fail("safetensors: header is not a JSON object");
  }
  const std::string& error() const { return error_; }

 private:
  // One entry holds a dtype, a shape of at most kMaxDims and two offsets.
  static constexpr uint32_t kMaxEntryValues = 64;

  bool Fail(std::string why) {
    if (error_.empty()) error_ = std::move(why);
    return false;
  }
  bool Scalar(json v) {
    in_->Event();
    if (depth_ == 0) return Fail("safetensors: header is not a JSON object");
    if (depth_ == 1) {
      entry_ = std::move(v);
      return FinishEntry();
    }
    if (skipping_) return true;
    Insert(std::move(v));
    return CountValue();
  }
  bool Open(json v) {
    in_->Event();
    ++depth_;
    if (depth_ == 1) return v.is_object() ? true : Fail("safetensors: header is not a JSON object");
    if (skipping_) return true;
    if (depth_ == 2) {
      entry_ = std::move(v);
      stack_.assign(1, &entry_);
    } else {
      stack_.push_back(Insert(std::move(v)));
    }
    return CountValue();
  }
  bool Close() {
    in_->Event();
    --depth_;
    if (depth_ == 0) return true;  // the header object itself
    if (!skipping_) stack_.pop_back();
    return depth_ == 1 ? FinishEntry() : true;
  }
  json* Insert(json v) {
    json* parent = stack_.back();
    if (parent->is_object()) {
      json& slot = (*parent)[key_];
      slot = std::move(v);
      return &slot;
    }
    parent->push_back(std::move(v));
    return &parent->back();
  }
  bool CountValue() {
    return ++entry_values_ <= kMaxEntryValues ? true : Fail("safetensors: entry " + name_ + " is too large");
  }
  bool FinishEntry() {
    entry_values_ = 0;
    stack_.clear();
    if (skipping_) {
      skipping_ = false;
      return true;
    }
    if (++entries_ > kMaxEntries) return Fail("safetensors: too many tensors");
    Result<TensorRegion> r = Entry(name_, entry_, buf_start_, file_size_);
    entry_ = json();
    if (!r.ok()) return Fail(r.status().message());
    if (r->length == 0) return true;
    heap_bytes_ += r->name.capacity() + r->label.capacity() + r->shape.capacity() * sizeof(uint64_t);
    out_->push_back(std::move(r).value());
    if (heap_bytes_ + out_->capacity() * sizeof(TensorRegion) > kMaxLayoutBytes) {
      return Fail("safetensors: the header describes more than " + std::to_string(kMaxLayoutBytes >> 20) +
                  " MiB of tensor metadata");
    }
    return true;
  }

  HeaderReader* in_;
  const uint64_t buf_start_, file_size_;
  std::vector<TensorRegion>* out_;
  uint32_t depth_ = 0;
  bool skipping_ = false;
  std::string name_, key_;
  json entry_;
  std::vector<json*> stack_;
  uint32_t entry_values_ = 0;
  uint64_t entries_ = 0;
  uint64_t heap_bytes_ = 0;
  std::string error_;
};

// A JSON object keeps the last of duplicate keys, and the reference reader
// (and this parser before it streamed) sees the tensors sorted by name.
void SortByNameKeepLast(std::vector<TensorRegion>* t) {
  std::stable_sort(t->begin(), t->end(), [](const TensorRegion& a, const TensorRegion& b) { return a.name < b.name; });
  size_t w = 0;
  for (size_t i = 0; i < t->size(); ++i) {
    if (i + 1 < t->size() && (*t)[i + 1].name == (*t)[i].name) continue;
    if (w != i) (*t)[w] = std::move((*t)[i]);
    ++w;
  }
  t->resize(w);
}

// The header's order is not kept; data order stands in (the safetensors
// library writes by dtype, then name).
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
  FileLayout l;
  l.format = "safetensors";
  HeaderReader in(src, 8, n);
  HeaderSax sax(&in, 8 + n, src.size(), &l.tensors);
  const bool parsed = json::sax_parse(HeaderIter(&in), HeaderIter(), &sax);
  if (!in.io().ok()) return in.io();
  if (in.over_token_cap()) {
    return Malformed("safetensors: a header token is longer than " + std::to_string(kMaxJsonToken >> 10) + " KiB");
  }
  if (!parsed) return Malformed(sax.error().empty() ? "safetensors: header is not a JSON object" : sax.error());
  SortByNameKeepLast(&l.tensors);
  AssignOffsetOrder(&l.tensors);
  return l;
}

}  // namespace ckptfs::formats
