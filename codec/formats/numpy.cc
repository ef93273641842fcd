#include "codec/formats/numpy.h"

#include <algorithm>
#include <charconv>
#include <string_view>
#include <tuple>

#include "codec/formats/limits.h"
#include "base/le.h"

namespace ckptfs::formats {
namespace {

struct NpyHeader {
  std::string descr;  // empty for structured dtypes (a list literal)
  bool fortran = false;
  std::vector<uint64_t> shape;
};

// Parses the header: the repr() of a dict with string keys. Only the value
// forms numpy writes for descr/fortran_order/shape are understood; any
// other value is skipped by bracket matching, without recursion.
class DictParser {
 public:
  explicit DictParser(std::string_view s) : s_(s) {}

  Result<NpyHeader> Parse() {
    NpyHeader h;
    bool have_descr = false, have_shape = false;
    Ws();
    if (!Eat('{')) return Bad();
    while (true) {
      Ws();
      if (Eat('}')) break;
      ASSIGN_OR_RETURN(std::string key, Str());
      Ws();
      if (!Eat(':')) return Bad();
      Ws();
      if (key == "descr" && Peek('\'')) {
        ASSIGN_OR_RETURN(h.descr, Str());
        have_descr = true;
      } else if (key == "descr") {
        RETURN_IF_ERROR(SkipValue());  // structured dtype
        have_descr = true;
      } else if (key == "fortran_order") {
        if (s_.substr(p_).starts_with("True"))
          h.fortran = true, p_ += 4;
        else if (s_.substr(p_).starts_with("False"))
          p_ += 5;
        else
          return Bad();
      } else if (key == "shape") {
        ASSIGN_OR_RETURN(h.shape, Tuple());
        have_shape = true;
      } else {
        RETURN_IF_ERROR(SkipValue());
      }
      Ws();
      if (Eat(',')) continue;
      Ws();
      if (Eat('}')) break;
      return Bad();
    }
    if (!have_descr || !have_shape) return Malformed("npy: header lacks descr or shape");
    return h;
  }

 private:
  static Status Bad() { return Malformed("npy: unparsable header"); }
  void Ws() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\t' || s_[p_] == '\n' || s_[p_] == '\r')) ++p_;
  }
  bool Peek(char c) const { return p_ < s_.size() && (s_[p_] == c || (c == '\'' && s_[p_] == '"')); }
  bool Eat(char c) {
    if (p_ < s_.size() && s_[p_] == c) return ++p_, true;
    return false;
  }
  Result<std::string> Str() {
    if (!Peek('\'')) return Bad();
    char q = s_[p_++];
    size_t end = s_.find(q, p_);
    if (end == std::string_view::npos) return Bad();
    std::string v(s_.substr(p_, end - p_));
    p_ = end + 1;
    return v;
  }
  Result<std::vector<uint64_t>> Tuple() {
    std::vector<uint64_t> dims;
    if (!Eat('(')) return Bad();
    while (true) {
      Ws();
      if (Eat(')')) return dims;
      uint64_t d;
      auto r = std::from_chars(s_.data() + p_, s_.data() + s_.size(), d);
      if (r.ec != std::errc() || dims.size() >= kMaxDims) return Bad();
      p_ = r.ptr - s_.data();
      Eat('L');  // Python 2 longs
      dims.push_back(d);
      Ws();
      if (Eat(')')) return dims;
      if (!Eat(',')) return Bad();
    }
  }
  // Up to the ',' or '}' that ends this value at nesting level 0.
  Status SkipValue() {
    size_t depth = 0;
    for (; p_ < s_.size(); ++p_) {
      char c = s_[p_];
      if (c == '\'' || c == '"') {
        size_t end = s_.find(c, p_ + 1);
        if (end == std::string_view::npos) return Bad();
        p_ = end;
      } else if (c == '(' || c == '[' || c == '{') {
        ++depth;
      } else if (c == ')' || c == ']' || c == '}') {
        if (depth == 0) return c == '}' ? Status::Ok() : Bad();
        --depth;
      } else if (c == ',' && depth == 0) {
        return Status::Ok();
      }
    }
    return Bad();
  }

  std::string_view s_;
  size_t p_ = 0;
};

// Little-endian or byte-order-free numeric descrs only; other data (big
// endian, objects, strings, datetimes) stays metadata.
struct Elem {
  DType dtype;
  unsigned size;  // bytes per array element
};
std::optional<Elem> ParseDescr(const std::string& d, std::string* why) {
  if (d.size() < 3 || (d[0] != '<' && d[0] != '|' && d[0] != '=' && d[0] != '>'))
    return *why = "odd descr " + d, std::nullopt;
  unsigned size = 0;
  auto r = std::from_chars(d.data() + 2, d.data() + d.size(), size);
  if (r.ec != std::errc() || r.ptr != d.data() + d.size() || size == 0) return *why = "odd descr " + d, std::nullopt;
  if (d[0] == '>' && size > 1) return *why = "big-endian " + d, std::nullopt;
  static const std::tuple<char, unsigned, DType> kMap[] = {
      {'f', 2, DType::kF16}, {'f', 4, DType::kF32},   {'f', 8, DType::kF64}, {'i', 1, DType::kI8},
      {'i', 2, DType::kI16}, {'i', 4, DType::kI32},   {'i', 8, DType::kI64}, {'u', 1, DType::kU8},
      {'u', 2, DType::kU16}, {'u', 4, DType::kU32},   {'u', 8, DType::kU64}, {'b', 1, DType::kBool},
      {'c', 8, DType::kC64}, {'c', 16, DType::kC128},
  };
  for (const auto& [kind, sz, t] : kMap) {
    if (d[1] == kind && size == sz) return Elem{t, size};
  }
  // Opaque fixed-size records, e.g. ml_dtypes bfloat16 saved as '<V2'.
  if (d[1] == 'V') return Elem{DType::kU8, size};
  return *why = "unsupported descr " + d, std::nullopt;
}

// The region of one .npy held in `src` (a whole file or an npz member);
// nullopt with `why` when the array is not a plain numeric tensor.
Result<std::optional<TensorRegion>> NpyRegion(const ByteSource& src, std::string* why) {
  uint8_t pre[12];
  if (src.size() < 10) return Malformed("npy: truncated preamble");
  RETURN_IF_ERROR(src.ReadAt(0, std::span(pre, std::min<uint64_t>(12, src.size()))));
  if (std::string_view(reinterpret_cast<char*>(pre), 6) != "\x93NUMPY") return Malformed("npy: bad magic");
  uint8_t major = pre[6];
  uint64_t hlen, hstart;
  if (major == 1) {
    hlen = le::Get16(pre, 8), hstart = 10;
  } else if ((major == 2 || major == 3) && src.size() >= 12) {
    hlen = le::Get32(pre, 8), hstart = 12;
  } else {
    return Malformed("npy: unsupported version " + std::to_string(major));
  }
  ASSIGN_OR_RETURN(std::vector<uint8_t> text, ReadBounded(src, hstart, hlen, "npy header"));
  ASSIGN_OR_RETURN(NpyHeader h,
                   DictParser(std::string_view(reinterpret_cast<char*>(text.data()), text.size())).Parse());
  if (h.descr.empty()) return *why = "structured dtype", std::optional<TensorRegion>();
  std::optional<Elem> el = ParseDescr(h.descr, why);
  if (!el) return std::optional<TensorRegion>();
  auto numel = NumElements(h.shape);
  auto nbytes = numel ? CheckedMul(*numel, el->size) : std::nullopt;
  uint64_t data = hstart + hlen;
  if (!nbytes || !InRange(data, *nbytes, src.size())) return Malformed("npy: array extends past end of file");
  TensorRegion r;
  r.dtype = el->dtype;
  r.offset = data;
  r.length = *nbytes;
  // Shapes describe the bytes in C order; a Fortran array's bytes are the
  // C-order layout of its transpose.
  r.shape = h.shape;
  if (h.fortran) std::reverse(r.shape.begin(), r.shape.end());
  if (DTypeSize(r.dtype) != el->size) r.shape.push_back(el->size);
  return std::optional<TensorRegion>(std::move(r));
}

void AddNote(std::string* note, const std::string& s) {
  if (!note->empty()) *note += "; ";
  *note += s;
}

}  // namespace

Result<FileLayout> ParseNpy(const ByteSource& src) {
  std::string why;
  ASSIGN_OR_RETURN(std::optional<TensorRegion> r, NpyRegion(src, &why));
  FileLayout l;
  l.format = "npy";
  l.note = why;
  if (r && r->length > 0) {
    r->name = "array";
    l.tensors.push_back(std::move(*r));
  }
  return l;
}

bool IsNpzArchive(const ZipArchive& z) {
  for (const ZipEntry& e : z.entries) {
    if (e.name.ends_with(".npy")) return true;
  }
  return false;
}

// Stored members map to regions at absolute offsets; deflated members and
// members that fail to parse stay metadata.
Result<FileLayout> ParseNpz(const ByteSource& src, const ZipArchive& z) {
  FileLayout l;
  l.format = "npz";
  size_t deflated = 0;
  for (const ZipEntry& e : z.entries) {
    if (!e.name.ends_with(".npy")) continue;
    if (e.method != 0 || e.comp_size != e.uncomp_size) {
      ++deflated;
      continue;
    }
    SubSource member(src, e.data_offset, e.comp_size);
    std::string why;
    auto r = NpyRegion(member, &why);
    if (!r.ok()) {
      AddNote(&l.note, e.name + ": " + r.status().message());
      continue;
    }
    if (!why.empty()) AddNote(&l.note, e.name + ": " + why);
    if (!*r || (*r)->length == 0) continue;
    TensorRegion t = std::move(**r);
    t.name = e.name.substr(0, e.name.size() - 4);
    t.label = t.name;
    t.order = static_cast<uint32_t>(l.tensors.size());  // member order: np.savez keeps the caller's order
    t.offset += e.data_offset;
    l.tensors.push_back(std::move(t));
  }
  if (deflated) AddNote(&l.note, std::to_string(deflated) + " compressed members kept as metadata");
  AppendZipCrcFields(z, l.tensors, &l.zip_crcs);
  SortZipCrcFields(&l.zip_crcs);
  return l;
}

}  // namespace ckptfs::formats
