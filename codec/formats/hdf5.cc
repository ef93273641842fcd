#include "codec/formats/hdf5.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_set>
#include <vector>

#include "codec/formats/limits.h"
#include "codec/formats/zip.h"

namespace ckptfs::formats {
namespace {

constexpr uint8_t kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
// One object header chunk, local heap or index node read at once.
constexpr uint64_t kMaxBlockBytes = 16u << 20;
// Group nesting, B-tree depth and header continuation chains.
constexpr int kMaxDepth = 64;
constexpr uint64_t kMaxContinuations = 1024;
constexpr uint64_t kMaxMessages = 1u << 16;  // per object header

// Little-endian reads over one block in memory. A read past the end sets
// `bad` and yields zeros, so parsers check once after a group of reads.
class Le {
 public:
  explicit Le(std::span<const uint8_t> b, size_t pos = 0) : b_(b), pos_(pos) {}
  uint64_t U(unsigned n) {
    if (n > 8 || !Has(n)) return Fail();
    uint64_t v = 0;
    for (unsigned i = 0; i < n; ++i) v |= uint64_t{b_[pos_ + i]} << (8 * i);
    pos_ += n;
    return v;
  }
  void Skip(uint64_t n) {
    if (!Has(n))
      Fail();
    else
      pos_ += n;
  }
  bool Tag(const char* four) {
    if (!Has(4) || std::memcmp(b_.data() + pos_, four, 4) != 0) return Fail(), false;
    pos_ += 4;
    return true;
  }
  std::span<const uint8_t> Bytes(uint64_t n) {
    if (!Has(n)) return Fail(), std::span<const uint8_t>{};
    auto s = b_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  size_t pos() const { return pos_; }
  size_t left() const { return pos_ <= b_.size() ? b_.size() - pos_ : 0; }
  bool bad() const { return bad_; }

 private:
  bool Has(uint64_t n) const { return !bad_ && pos_ <= b_.size() && n <= b_.size() - pos_; }
  uint64_t Fail() {
    bad_ = true;
    return 0;
  }
  std::span<const uint8_t> b_;
  size_t pos_;
  bool bad_ = false;
};

struct Superblock {
  uint64_t base = 0;        // absolute offset of the signature; addresses count from it
  unsigned so = 8, sl = 8;  // sizes of offsets and lengths
  uint64_t root = 0;        // root group's object header
};

struct Dataspace {
  bool present = false;
  std::vector<uint64_t> dims, max_dims;
};

struct Layout {
  enum Kind { kNone, kContiguous, kChunked, kOther } kind = kNone;
  unsigned version = 0;
  uint64_t address = 0, size = 0;  // contiguous: data; chunked: index
  std::vector<uint64_t> chunk;     // chunk dims, without the element-size dim
  unsigned index_type = 1;         // layout v4; v3 is a v1 B-tree (index type 0 here)
  unsigned page_bits = 0;
  bool filtered_single = false;
};

struct Link {
  std::string name;
  uint64_t address = 0;
};

struct ObjectInfo {
  Dataspace space;
  DType dtype = DType::kUnknown;
  bool has_type = false;
  uint64_t type_size = 0;
  Layout layout;
  bool filtered = false;
  bool symbol_table = false;
  uint64_t btree = 0, heap = 0;
  std::vector<Link> links;
  bool dense_links = false;
  uint64_t dense_heap = 0;   // fractal heap of the links, when dense
  uint64_t dense_names = 0;  // v2 B-tree indexing them by name
};

struct Counts {
  uint64_t datasets = 0, filtered = 0, other_type = 0, other_layout = 0, dense_groups = 0, skipped = 0;
};

DType FixedPointType(uint64_t bits, uint64_t size) {
  if (bits & 1) return DType::kUnknown;  // big-endian
  const bool is_signed = bits & 8;
  switch (size) {
    case 1:
      return is_signed ? DType::kI8 : DType::kU8;
    case 2:
      return is_signed ? DType::kI16 : DType::kU16;
    case 4:
      return is_signed ? DType::kI32 : DType::kU32;
    case 8:
      return is_signed ? DType::kI64 : DType::kU64;
    default:
      return DType::kUnknown;
  }
}

// IEEE layouts only, little-endian; bfloat16 is a custom 2-byte type with
// 8 exponent and 7 mantissa bits.
DType FloatType(uint64_t bits, uint64_t size, Le& props) {
  props.Skip(4);  // bit offset, precision
  props.Skip(1);
  const uint64_t exp_size = props.U(1);
  props.Skip(1);
  const uint64_t mant_size = props.U(1);
  if (props.bad() || (bits & 0x41) != 0) return DType::kUnknown;
  if (size == 2 && exp_size == 5 && mant_size == 10) return DType::kF16;
  if (size == 2 && exp_size == 8 && mant_size == 7) return DType::kBF16;
  if (size == 4 && exp_size == 8 && mant_size == 23) return DType::kF32;
  if (size == 8 && exp_size == 11 && mant_size == 52) return DType::kF64;
  return DType::kUnknown;
}

void ParseDatatype(std::span<const uint8_t> body, ObjectInfo* o) {
  Le m(body);
  const uint64_t class_version = m.U(1);
  const uint64_t bits = m.U(3);
  const uint64_t size = m.U(4);
  if (m.bad()) return;
  o->has_type = true;
  o->type_size = size;
  switch (class_version & 0x0f) {
    case 0:
      o->dtype = FixedPointType(bits, size);
      break;
    case 1:
      o->dtype = FloatType(bits, size, m);
      break;
    default:
      o->dtype = DType::kUnknown;
  }
}

void ParseDataspace(std::span<const uint8_t> body, unsigned sl, ObjectInfo* o) {
  Le m(body);
  const uint64_t version = m.U(1), rank = m.U(1), flags = m.U(1);
  if (version == 1) {
    m.Skip(5);
  } else if (version == 2) {
    if (m.U(1) == 2) return;  // null: no data; scalar (0) has rank 0
  } else {
    return;
  }
  if (m.bad() || rank > kMaxDims) return;
  Dataspace s;
  for (uint64_t i = 0; i < rank; ++i) s.dims.push_back(m.U(sl));
  if (flags & 1) {
    for (uint64_t i = 0; i < rank; ++i) s.max_dims.push_back(m.U(sl));
  }
  if (m.bad()) return;
  s.present = true;
  o->space = std::move(s);
}

// Chunk dims as stored: `n` values of `width` bytes, the last being the
// element size, which is checked against the datatype later.
bool ReadChunkDims(Le& m, uint64_t n, unsigned width, Layout* l) {
  if (n < 2 || n > kMaxDims + 1) return false;
  for (uint64_t i = 0; i < n; ++i) l->chunk.push_back(m.U(width));
  l->size = l->chunk.back();  // element size, for the check
  l->chunk.pop_back();
  return !m.bad();
}

void ParseLayoutV4Chunked(Le& m, const Superblock& sb, Layout* l) {
  const uint64_t flags = m.U(1), n = m.U(1), width = m.U(1);
  if (m.bad() || width < 1 || width > 8 || !ReadChunkDims(m, n, static_cast<unsigned>(width), l)) return;
  l->index_type = static_cast<unsigned>(m.U(1));
  switch (l->index_type) {
    case 1:
      if (flags & 2) {
        l->filtered_single = true;
        m.Skip(sb.sl + 4);
      }
      break;
    case 2:
      break;
    case 3:
      l->page_bits = static_cast<unsigned>(m.U(1));
      break;
    case 4:
      m.Skip(5);
      break;
    case 5:
      m.Skip(6);
      break;
    default:
      return;
  }
  l->address = m.U(sb.so);
  if (!m.bad()) l->kind = Layout::kChunked;
}

void ParseLayout(std::span<const uint8_t> body, const Superblock& sb, ObjectInfo* o) {
  Le m(body);
  Layout l;
  l.version = static_cast<unsigned>(m.U(1));
  const uint64_t cls = m.U(1);
  o->layout.kind = Layout::kOther;
  if (m.bad() || l.version < 3 || l.version > 4) return;
  if (cls == 1) {
    l.address = m.U(sb.so);
    l.size = m.U(sb.sl);
    if (!m.bad()) l.kind = Layout::kContiguous;
  } else if (cls == 2 && l.version == 3) {
    const uint64_t n = m.U(1);
    l.address = m.U(sb.so);
    l.index_type = 0;
    if (!m.bad() && ReadChunkDims(m, n, 4, &l)) l.kind = Layout::kChunked;
  } else if (cls == 2) {
    ParseLayoutV4Chunked(m, sb, &l);
  }
  if (l.kind != Layout::kNone) o->layout = std::move(l);
}

// One link message from `m`, consumed whole (soft and external links too);
// hard links are added to `out`. False when it does not parse.
bool DecodeLink(Le& m, const Superblock& sb, std::vector<Link>* out) {
  const uint64_t version = m.U(1), flags = m.U(1);
  if (m.bad() || version != 1 || (flags & 0xe0)) return false;
  const uint64_t type = (flags & 0x08) ? m.U(1) : 0;
  if (flags & 0x04) m.Skip(8);
  if (flags & 0x10) m.Skip(1);
  const uint64_t name_len = m.U(1u << (flags & 3));
  if (m.bad() || name_len == 0 || name_len > kMaxNameBytes) return false;
  auto name = m.Bytes(name_len);
  if (type == 0) {
    const uint64_t addr = m.U(sb.so);
    if (!m.bad()) out->push_back({std::string(name.begin(), name.end()), addr});
  } else {
    m.Skip(m.U(2));  // soft or external: a length and its bytes
  }
  return !m.bad();
}

void ParseLink(std::span<const uint8_t> body, const Superblock& sb, ObjectInfo* o) {
  Le m(body);
  DecodeLink(m, sb, &o->links);
}

bool Undefined(uint64_t addr, unsigned so) {
  return so >= 8 ? addr == UINT64_MAX : addr == (uint64_t{1} << (8 * so)) - 1;
}

struct Continuation {
  uint64_t address, length;
};

void ParseMessage(unsigned type, std::span<const uint8_t> body, const Superblock& sb, ObjectInfo* o,
                  std::vector<Continuation>* more) {
  Le m(body);
  switch (type) {
    case 0x01:
      ParseDataspace(body, sb.sl, o);
      break;
    case 0x03:
      ParseDatatype(body, o);
      break;
    case 0x08:
      ParseLayout(body, sb, o);
      break;
    case 0x0b:
      o->filtered = true;
      break;
    case 0x06:
      ParseLink(body, sb, o);
      break;
    case 0x02: {  // link info: a defined fractal heap address means dense storage
      const uint64_t version = m.U(1), flags = m.U(1);
      if (flags & 1) m.Skip(8);
      const uint64_t heap = m.U(sb.so), names = m.U(sb.so);
      if (!m.bad() && version == 0 && !Undefined(heap, sb.so)) {
        o->dense_heap = heap, o->dense_names = names, o->dense_links = true;
      }
      break;
    }
    case 0x10: {
      const uint64_t addr = m.U(sb.so), len = m.U(sb.sl);
      if (!m.bad()) more->push_back({addr, len});
      break;
    }
    case 0x11: {
      o->btree = m.U(sb.so);
      o->heap = m.U(sb.so);
      o->symbol_table = !m.bad();
      break;
    }
    default:
      break;
  }
}

class Walker {
 public:
  Walker(const ByteSource& src, const Superblock& sb, FileLayout* out) : src_(src), sb_(sb), out_(out) {}

  Status WalkGroupOrDataset(uint64_t header, const std::string& path, int depth);
  const Counts& counts() const { return counts_; }
  bool too_big() const { return too_big_; }

 private:
  Result<uint64_t> Absolute(uint64_t addr, uint64_t len) const {
    if (Undefined(addr, sb_.so)) return Malformed("hdf5: undefined address");
    const auto abs = CheckedAdd(sb_.base, addr);
    if (!abs || !InRange(*abs, len, src_.size())) return Malformed("hdf5: address past the end of the file");
    return *abs;
  }
  Result<std::vector<uint8_t>> Block(uint64_t addr, uint64_t len, const char* what) const {
    if (len > kMaxBlockBytes) return Malformed(std::string("hdf5: ") + what + " too large");
    ASSIGN_OR_RETURN(uint64_t abs, Absolute(addr, len));
    return ReadBounded(src_, abs, len, what);
  }
  Status Messages(std::span<const uint8_t> b, unsigned version, bool crt_order, ObjectInfo* o,
                  std::vector<Continuation>* more);
  Result<ObjectInfo> ReadHeader(uint64_t addr);
  Status WalkSymbolTable(const ObjectInfo& o, const std::string& path, int depth);
  Status WalkGroupBTree(uint64_t node, const std::vector<uint8_t>& heap, const std::string& path, int depth,
                        int level_budget);
  Status Child(const std::string& path, std::string_view name, uint64_t addr, int depth);
  Result<std::vector<Link>> DenseLinks(uint64_t heap, uint64_t names);
  Status HeapIdsOf(uint64_t btree, unsigned offset_bytes, std::vector<uint64_t>* out);
  Status HeapIdsInNode(uint64_t node, uint64_t nrec, unsigned depth, const std::vector<uint64_t>& ptr_nrec_bytes,
                       const std::vector<uint64_t>& ptr_total_bytes, uint64_t rec_size, unsigned offset_bytes,
                       std::vector<uint64_t>* out);
  void LinksInDirectBlock(uint64_t addr, uint64_t size, uint64_t heap, unsigned offset_bytes,
                          const std::vector<uint64_t>& live, std::vector<Link>* out);
  void AddDataset(const ObjectInfo& o, const std::string& path);
  Status AddChunks(const ObjectInfo& o, const std::string& path, uint64_t chunk_bytes);
  Status WalkChunkBTree(uint64_t node, const ObjectInfo& o, const std::string& path, uint64_t chunk_bytes, int depth);
  Status WalkFixedArray(const ObjectInfo& o, const std::string& path, uint64_t chunk_bytes, uint64_t chunks);
  void AddRegion(const ObjectInfo& o, const std::string& name, const std::string& path, uint64_t addr, uint64_t len,
                 const std::vector<uint64_t>& shape);
  bool ExtendLastChunk(const ObjectInfo& o, const std::string& path, uint64_t abs, uint64_t len,
                       const std::vector<uint64_t>& shape);
  bool Budget() { return ++work_ <= kMaxEntries && !too_big_; }

  const ByteSource& src_;
  Superblock sb_;
  FileLayout* out_;
  Counts counts_;
  uint64_t work_ = 0;
  uint64_t layout_bytes_ = 0;
  bool too_big_ = false;
  std::unordered_set<uint64_t> seen_;
};

Status Walker::Messages(std::span<const uint8_t> b, unsigned version, bool crt_order, ObjectInfo* o,
                        std::vector<Continuation>* more) {
  Le m(b);
  uint64_t n = 0;
  const size_t prefix = version == 1 ? 8 : (crt_order ? 6 : 4);
  while (m.left() >= prefix) {
    if (++n > kMaxMessages) return Malformed("hdf5: too many header messages");
    const unsigned type = static_cast<unsigned>(m.U(version == 1 ? 2 : 1));
    const uint64_t size = m.U(2);
    const uint64_t flags = m.U(1);
    m.Skip(version == 1 ? 3 : (crt_order ? 2 : 0));
    auto body = m.Bytes(size);
    if (m.bad()) return Malformed("hdf5: header message past its chunk");
    // Shared messages (flag 2) point elsewhere: a committed datatype leaves
    // the dataset's type unknown.
    if (!(flags & 2)) ParseMessage(type, body, sb_, o, more);
  }
  return Status::Ok();
}

Result<ObjectInfo> Walker::ReadHeader(uint64_t addr) {
  ObjectInfo o;
  std::vector<Continuation> more;
  ASSIGN_OR_RETURN(std::vector<uint8_t> head, Block(addr, 16, "object header"));
  unsigned version = 0;
  bool crt_order = false;
  if (head[0] == 1) {
    version = 1;
    Le h(head, 8);
    const uint64_t size = h.U(4);
    ASSIGN_OR_RETURN(std::vector<uint8_t> body, Block(addr + 16, size, "object header"));
    RETURN_IF_ERROR(Messages(body, 1, false, &o, &more));
  } else {
    Le h(head);
    if (!h.Tag("OHDR") || h.U(1) != 2) return Malformed("hdf5: not an object header");
    version = 2;
    const uint64_t flags = h.U(1);
    crt_order = flags & 0x04;
    const uint64_t skip = ((flags & 0x20) ? 16 : 0) + ((flags & 0x10) ? 4 : 0);
    const unsigned width = 1u << (flags & 3);
    ASSIGN_OR_RETURN(std::vector<uint8_t> pre, Block(addr, 6 + skip + width, "object header"));
    Le p(pre, 6 + skip);
    const uint64_t size = p.U(width);
    if (p.bad()) return Malformed("hdf5: object header truncated");
    ASSIGN_OR_RETURN(std::vector<uint8_t> body, Block(addr + 6 + skip + width, size, "object header"));
    RETURN_IF_ERROR(Messages(body, 2, crt_order, &o, &more));
  }
  for (size_t i = 0; i < more.size(); ++i) {
    if (i >= kMaxContinuations) return Malformed("hdf5: too many header continuations");
    ASSIGN_OR_RETURN(std::vector<uint8_t> c, Block(more[i].address, more[i].length, "header continuation"));
    if (version == 1) {
      RETURN_IF_ERROR(Messages(c, 1, false, &o, &more));
      continue;
    }
    if (c.size() < 8 || std::memcmp(c.data(), "OCHK", 4) != 0) return Malformed("hdf5: bad continuation block");
    RETURN_IF_ERROR(Messages(std::span<const uint8_t>(c).subspan(4, c.size() - 8), 2, crt_order, &o, &more));
  }
  return o;
}

Status Walker::Child(const std::string& path, std::string_view name, uint64_t addr, int depth) {
  if (name.empty() || name.find('/') != std::string_view::npos) return Status::Ok();
  if (path.size() + 1 + name.size() > kMaxNameBytes) return Malformed("hdf5: object path too long");
  return WalkGroupOrDataset(addr, path + "/" + std::string(name), depth + 1);
}

// v1 B-tree of a group (node type 0): leaves point at symbol table nodes
// whose entries name the children through the local heap.
Status Walker::WalkGroupBTree(uint64_t node, const std::vector<uint8_t>& heap, const std::string& path, int depth,
                              int level_budget) {
  if (level_budget <= 0 || !Budget()) return Malformed("hdf5: group B-tree too deep or too large");
  ASSIGN_OR_RETURN(std::vector<uint8_t> hdr, Block(node, 8 + 2 * sb_.so, "group B-tree node"));
  Le h(hdr);
  if (!h.Tag("TREE") || h.U(1) != 0) return Malformed("hdf5: not a group B-tree node");
  const uint64_t level = h.U(1), entries = h.U(2);
  const uint64_t body_len = entries * (sb_.sl + sb_.so) + sb_.sl;
  ASSIGN_OR_RETURN(std::vector<uint8_t> body, Block(node + hdr.size(), body_len, "group B-tree node"));
  Le b(body);
  for (uint64_t i = 0; i < entries; ++i) {
    b.Skip(sb_.sl);
    const uint64_t child = b.U(sb_.so);
    if (b.bad()) return Malformed("hdf5: group B-tree node truncated");
    if (level > 0) {
      RETURN_IF_ERROR(WalkGroupBTree(child, heap, path, depth, level_budget - 1));
      continue;
    }
    ASSIGN_OR_RETURN(std::vector<uint8_t> sh, Block(child, 8, "symbol table node"));
    Le s(sh);
    if (!s.Tag("SNOD") || s.U(1) != 1) return Malformed("hdf5: not a symbol table node");
    s.Skip(1);
    const uint64_t syms = s.U(2);
    const uint64_t entry = 2 * sb_.so + 24;
    ASSIGN_OR_RETURN(std::vector<uint8_t> tab, Block(child + 8, syms * entry, "symbol table node"));
    Le t(tab);
    for (uint64_t k = 0; k < syms; ++k) {
      const uint64_t name_off = t.U(sb_.so), header = t.U(sb_.so);
      t.Skip(24);
      if (t.bad() || name_off >= heap.size()) return Malformed("hdf5: symbol table entry out of range");
      const char* name = reinterpret_cast<const char*>(heap.data() + name_off);
      RETURN_IF_ERROR(Child(path, std::string_view(name, strnlen(name, heap.size() - name_off)), header, depth));
    }
  }
  return Status::Ok();
}

Status Walker::WalkSymbolTable(const ObjectInfo& o, const std::string& path, int depth) {
  ASSIGN_OR_RETURN(std::vector<uint8_t> hh, Block(o.heap, 8 + 2 * sb_.sl + sb_.so, "local heap"));
  Le h(hh);
  if (!h.Tag("HEAP") || h.U(1) != 0) return Malformed("hdf5: not a local heap");
  h.Skip(3);
  const uint64_t size = h.U(sb_.sl);
  h.Skip(sb_.sl);
  const uint64_t data = h.U(sb_.so);
  if (h.bad()) return Malformed("hdf5: local heap truncated");
  ASSIGN_OR_RETURN(std::vector<uint8_t> heap, Block(data, size, "local heap data"));
  return WalkGroupBTree(o.btree, heap, path, depth, kMaxDepth);
}

void Walker::AddRegion(const ObjectInfo& o, const std::string& name, const std::string& path, uint64_t addr,
                       uint64_t len, const std::vector<uint64_t>& shape) {
  Result<uint64_t> abs = Absolute(addr, len);
  if (!abs.ok() || len == 0) {
    ++counts_.skipped;
    return;
  }
  // What the layout keeps in memory is bounded like every parser's.
  layout_bytes_ += sizeof(TensorRegion) + name.size() + path.size() + 8 * shape.size();
  if (layout_bytes_ > kMaxLayoutBytes) {
    too_big_ = true;
    return;
  }
  if (ExtendLastChunk(o, path, *abs, len, shape)) return;
  TensorRegion r;
  r.name = name;
  r.label = path;
  r.dtype = o.dtype;
  r.shape = shape;
  r.offset = *abs;
  r.length = len;
  r.order = static_cast<uint32_t>(out_->tensors.size());
  out_->tensors.push_back(std::move(r));
}

// libhdf5 allocates a dataset written at once chunk after chunk, so its
// chunks lie back to back in index order. Each coded as its own segment
// costs a segment's set-up per chunk (chunks=True picks chunks of tens of
// KB): one region per run of adjacent chunks instead, of shape
// [n * chunk[0], chunk[1], ...], whose rows are still rows of a chunk.
bool Walker::ExtendLastChunk(const ObjectInfo& o, const std::string& path, uint64_t abs, uint64_t len,
                             const std::vector<uint64_t>& shape) {
  if (out_->tensors.empty() || shape.empty()) return false;
  TensorRegion& last = out_->tensors.back();
  const bool adjacent = last.label == path && last.dtype == o.dtype && last.offset + last.length == abs;
  const bool same_rows =
      last.shape.size() == shape.size() && std::equal(shape.begin() + 1, shape.end(), last.shape.begin() + 1);
  if (!adjacent || !same_rows) return false;
  last.length += len;
  last.shape[0] += shape[0];
  return true;
}

std::string ChunkName(const std::string& path, std::span<const uint64_t> offsets) {
  std::string s = path + "[";
  for (size_t i = 0; i < offsets.size(); ++i) s += (i ? "," : "") + std::to_string(offsets[i]);
  return s + "]";
}

// v1 B-tree of raw data chunks (node type 1): a key is the chunk's stored
// size, filter mask and element offsets (rank + 1 of them).
Status Walker::WalkChunkBTree(uint64_t node, const ObjectInfo& o, const std::string& path, uint64_t chunk_bytes,
                              int depth) {
  if (depth <= 0 || !Budget()) return Malformed("hdf5: chunk B-tree too deep or too large");
  ASSIGN_OR_RETURN(std::vector<uint8_t> hdr, Block(node, 8 + 2 * sb_.so, "chunk B-tree node"));
  Le h(hdr);
  if (!h.Tag("TREE") || h.U(1) != 1) return Malformed("hdf5: not a chunk B-tree node");
  const uint64_t level = h.U(1), entries = h.U(2);
  const uint64_t rank = o.layout.chunk.size();
  const uint64_t key = 8 + 8 * (rank + 1);
  ASSIGN_OR_RETURN(std::vector<uint8_t> body, Block(node + hdr.size(), entries * (key + sb_.so) + key, "chunk B-tree"));
  Le b(body);
  for (uint64_t i = 0; i < entries; ++i) {
    const uint64_t stored = b.U(4);
    b.Skip(4);
    std::vector<uint64_t> offsets;
    for (uint64_t d = 0; d < rank; ++d) offsets.push_back(b.U(8));
    b.Skip(8);
    const uint64_t child = b.U(sb_.so);
    if (b.bad()) return Malformed("hdf5: chunk B-tree node truncated");
    if (level > 0) {
      RETURN_IF_ERROR(WalkChunkBTree(child, o, path, chunk_bytes, depth - 1));
    } else if (stored == chunk_bytes && Budget()) {
      AddRegion(o, ChunkName(path, offsets), path, child, chunk_bytes, o.layout.chunk);
    } else {
      ++counts_.skipped;
    }
  }
  return Status::Ok();
}

// Fixed array index (layout v4, fixed max dims): one address per chunk in
// row-major chunk order. Paged arrays (more chunks than 2^page_bits) are
// left to the generic path.
Status Walker::WalkFixedArray(const ObjectInfo& o, const std::string& path, uint64_t chunk_bytes, uint64_t chunks) {
  ASSIGN_OR_RETURN(std::vector<uint8_t> hb, Block(o.layout.address, 12 + sb_.sl + sb_.so, "fixed array header"));
  Le h(hb);
  if (!h.Tag("FAHD") || h.U(1) != 0 || h.U(1) != 0) return Malformed("hdf5: not an unfiltered fixed array header");
  const uint64_t entry = h.U(1), page_bits = h.U(1), count = h.U(sb_.sl), data = h.U(sb_.so);
  if (h.bad() || entry != sb_.so || count != chunks) return Malformed("hdf5: fixed array disagrees with its dataset");
  if (page_bits >= 64 || count > (uint64_t{1} << page_bits)) return Malformed("hdf5: paged fixed array");
  const uint64_t prefix = 6 + sb_.so;
  ASSIGN_OR_RETURN(std::vector<uint8_t> db, Block(data, prefix + count * entry, "fixed array data block"));
  Le d(db);
  if (!d.Tag("FADB")) return Malformed("hdf5: not a fixed array data block");
  d.Skip(prefix - 4);
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t addr = d.U(sb_.so);
    if (d.bad() || !Budget()) return Malformed("hdf5: fixed array truncated");
    if (!Undefined(addr, sb_.so))
      AddRegion(o, path + "[chunk " + std::to_string(i) + "]", path, addr, chunk_bytes, o.layout.chunk);
  }
  return Status::Ok();
}

// How many chunks cover `extent`, or nothing on overflow or a zero chunk dim.
std::optional<uint64_t> ChunkCount(const std::vector<uint64_t>& extent, const std::vector<uint64_t>& chunk) {
  uint64_t n = 1;
  for (size_t i = 0; i < chunk.size(); ++i) {
    if (chunk[i] == 0) return std::nullopt;
    const auto m = CheckedMul(n, extent[i] / chunk[i] + (extent[i] % chunk[i] != 0));
    if (!m) return std::nullopt;
    n = *m;
  }
  return n;
}

Status Walker::AddChunks(const ObjectInfo& o, const std::string& path, uint64_t chunk_bytes) {
  const Layout& l = o.layout;
  if (l.chunk.size() != o.space.dims.size() || Undefined(l.address, sb_.so)) return Status::Ok();
  const auto chunks = ChunkCount(o.space.dims, l.chunk);
  const bool fixed_max = o.space.max_dims.empty() || o.space.max_dims == o.space.dims;
  switch (l.index_type) {
    case 0:
      return WalkChunkBTree(l.address, o, path, chunk_bytes, kMaxDepth);
    case 1:
      if (!l.filtered_single) AddRegion(o, path, path, l.address, chunk_bytes, l.chunk);
      return Status::Ok();
    case 2:  // implicit: every chunk allocated, back to back
      if (!chunks || !fixed_max) return Malformed("hdf5: implicit chunk index of unknown extent");
      for (uint64_t i = 0; i < *chunks; ++i) {
        if (!Budget()) return Malformed("hdf5: too many chunks");
        const auto at = CheckedMul(i, chunk_bytes);
        if (!at || !CheckedAdd(l.address, *at)) return Malformed("hdf5: implicit chunks overflow");
        AddRegion(o, path + "[chunk " + std::to_string(i) + "]", path, l.address + *at, chunk_bytes, l.chunk);
      }
      return Status::Ok();
    case 3:
      if (!chunks) return Malformed("hdf5: fixed array of unknown extent");
      return WalkFixedArray(o, path, chunk_bytes, *chunks);
    default:
      ++counts_.other_layout;
      return Status::Ok();
  }
}

void Walker::AddDataset(const ObjectInfo& o, const std::string& path) {
  ++counts_.datasets;
  if (o.filtered) {
    ++counts_.filtered;
    return;
  }
  if (!o.has_type || o.dtype == DType::kUnknown || o.type_size != DTypeSize(o.dtype) || !o.space.present) {
    ++counts_.other_type;
    return;
  }
  const Layout& l = o.layout;
  if (l.kind == Layout::kContiguous) {
    const auto numel = NumElements(o.space.dims);
    const auto bytes = numel ? CheckedMul(*numel, o.type_size) : std::nullopt;
    if (!Undefined(l.address, sb_.so) && bytes == l.size)
      AddRegion(o, path, path, l.address, l.size, o.space.dims);
    else
      ++counts_.skipped;
    return;
  }
  if (l.kind != Layout::kChunked || l.size != o.type_size) {
    ++counts_.other_layout;
    return;
  }
  const auto numel = NumElements(l.chunk);
  const auto bytes = numel ? CheckedMul(*numel, o.type_size) : std::nullopt;
  if (!bytes || *bytes == 0) return;
  // A broken chunk index loses that dataset's chunks, not the file.
  if (Status s = AddChunks(o, path, *bytes); !s.ok()) {
    ++counts_.skipped;
    if (!out_->note.empty()) out_->note += "; ";
    out_->note += path + ": " + s.message();
  }
}

// Bytes libhdf5 uses to encode counts up to `n` (H5VM_limit_enc_size).
uint64_t EncodedSize(uint64_t n) {
  unsigned log2 = 0;
  while (n >> (log2 + 1)) ++log2;
  return log2 / 8 + 1;
}

// Dense link storage: the group's link messages are objects of a fractal
// heap, and its name index (a v2 B-tree of type 5: name hash + heap ID)
// lists the live ones. Heap IDs give each object's offset in the heap's
// address space; each direct block says where it starts in that space.
// Only a root direct block, or a root indirect block's direct children, are
// read (a group would need thousands of links for more).
void Walker::LinksInDirectBlock(uint64_t addr, uint64_t size, uint64_t heap, unsigned offset_bytes,
                                const std::vector<uint64_t>& live, std::vector<Link>* out) {
  Result<std::vector<uint8_t>> b = Block(addr, size, "fractal heap direct block");
  if (!b.ok()) return;
  Le m(*b);
  if (!m.Tag("FHDB") || m.U(1) != 0 || m.U(sb_.so) != heap) return;
  const uint64_t block_offset = m.U(offset_bytes);
  if (m.bad()) return;
  for (auto it = std::lower_bound(live.begin(), live.end(), block_offset); it != live.end(); ++it) {
    if (*it - block_offset >= size || !Budget()) return;
    Le obj(*b, *it - block_offset);
    DecodeLink(obj, sb_, out);
  }
}

Status Walker::HeapIdsInNode(uint64_t node, uint64_t nrec, unsigned depth, const std::vector<uint64_t>& ptr_nrec_bytes,
                             const std::vector<uint64_t>& ptr_total_bytes, uint64_t rec_size, unsigned offset_bytes,
                             std::vector<uint64_t>* out) {
  if (!Budget() || nrec > kMaxEntries) return Malformed("hdf5: name index too large");
  const uint64_t ptr = depth == 0 ? 0 : sb_.so + ptr_nrec_bytes[depth - 1] + ptr_total_bytes[depth - 1];
  ASSIGN_OR_RETURN(std::vector<uint8_t> b,
                   Block(node, 6 + nrec * rec_size + (depth ? (nrec + 1) * ptr : 0), "name index node"));
  Le m(b);
  if (!m.Tag(depth == 0 ? "BTLF" : "BTIN") || m.U(1) != 0 || m.U(1) != 5) return Malformed("hdf5: bad name index node");
  for (uint64_t i = 0; i < nrec; ++i) {
    Le r(m.Bytes(rec_size));
    r.Skip(4);  // name hash
    const uint64_t flags = r.U(1), offset = r.U(offset_bytes);
    if (m.bad() || r.bad()) return Malformed("hdf5: name index record truncated");
    if ((flags & 0x30) == 0) out->push_back(offset);  // managed objects only
  }
  for (uint64_t i = 0; depth > 0 && i <= nrec; ++i) {
    const uint64_t child = m.U(sb_.so), child_nrec = m.U(static_cast<unsigned>(ptr_nrec_bytes[depth - 1]));
    m.Skip(ptr_total_bytes[depth - 1]);
    if (m.bad()) return Malformed("hdf5: name index node truncated");
    RETURN_IF_ERROR(
        HeapIdsInNode(child, child_nrec, depth - 1, ptr_nrec_bytes, ptr_total_bytes, rec_size, offset_bytes, out));
  }
  return Status::Ok();
}

// The heap offsets of the live links, from the v2 B-tree header and the
// node geometry libhdf5 derives from it (H5B2__hdr_init).
Status Walker::HeapIdsOf(uint64_t btree, unsigned offset_bytes, std::vector<uint64_t>* out) {
  ASSIGN_OR_RETURN(std::vector<uint8_t> hb, Block(btree, 16 + sb_.so + 2 + sb_.sl, "name index header"));
  Le h(hb);
  if (!h.Tag("BTHD") || h.U(1) != 0 || h.U(1) != 5) return Malformed("hdf5: not a name index");
  const uint64_t node_size = h.U(4), rec_size = h.U(2), depth = h.U(2);
  h.Skip(2);
  const uint64_t root = h.U(sb_.so), root_nrec = h.U(2);
  if (h.bad() || rec_size < 5 + offset_bytes || node_size < 10 + rec_size || node_size > kMaxBlockBytes || depth > 8) {
    return Malformed("hdf5: name index not understood");
  }
  // Per depth: bytes of a child pointer's record count and total count.
  std::vector<uint64_t> nrec_bytes{EncodedSize((node_size - 10) / rec_size)}, total_bytes{0};
  uint64_t cum = (node_size - 10) / rec_size;
  for (uint64_t d = 1; d < depth; ++d) {
    const uint64_t ptr = sb_.so + nrec_bytes[d - 1] + total_bytes[d - 1];
    if (node_size < 10 + ptr) return Malformed("hdf5: name index nodes too small");
    const uint64_t max = (node_size - 10 - ptr) / (rec_size + ptr);
    const auto next = CheckedAdd(CheckedMul(max + 1, cum).value_or(UINT64_MAX), max);
    cum = next.value_or(UINT64_MAX);
    nrec_bytes.push_back(EncodedSize(max));
    total_bytes.push_back(EncodedSize(cum));
  }
  if (Undefined(root, sb_.so) || root_nrec == 0) return Status::Ok();
  RETURN_IF_ERROR(HeapIdsInNode(root, root_nrec, static_cast<unsigned>(depth), nrec_bytes, total_bytes, rec_size,
                                offset_bytes, out));
  std::sort(out->begin(), out->end());
  return Status::Ok();
}

Result<std::vector<Link>> Walker::DenseLinks(uint64_t heap, uint64_t names) {
  const uint64_t len = 4 + 1 + 2 + 2 + 1 + 4 + 12 * 8 + 2 + 2 * 8 + 2 + 2 + 8 + 2;
  ASSIGN_OR_RETURN(std::vector<uint8_t> hb, Block(heap, len, "fractal heap"));
  Le h(hb);
  if (!h.Tag("FRHP") || h.U(1) != 0) return Malformed("hdf5: not a fractal heap");
  h.Skip(2);
  const uint64_t filters = h.U(2);
  h.Skip(1 + 4 + sb_.sl + sb_.so + sb_.sl + sb_.so + 8 * sb_.sl);
  const uint64_t width = h.U(2), start = h.U(sb_.sl), max_direct = h.U(sb_.sl), max_heap_bits = h.U(2);
  h.Skip(2);
  const uint64_t root = h.U(sb_.so), rows = h.U(2);
  if (h.bad() || filters != 0 || width == 0 || width > 1024 || start == 0 || max_direct < start || max_heap_bits == 0 ||
      max_heap_bits > 64 || rows > 64) {
    return Malformed("hdf5: fractal heap not understood");
  }
  const unsigned offset_bytes = static_cast<unsigned>((max_heap_bits + 7) / 8);
  std::vector<uint64_t> live;
  RETURN_IF_ERROR(HeapIdsOf(names, offset_bytes, &live));
  std::vector<Link> out;
  if (rows == 0) {
    LinksInDirectBlock(root, start, heap, offset_bytes, live, &out);
    return out;
  }
  ASSIGN_OR_RETURN(std::vector<uint8_t> ib,
                   Block(root, 5 + sb_.so + offset_bytes + rows * width * sb_.so, "fractal heap indirect block"));
  Le in(ib);
  if (!in.Tag("FHIB") || in.U(1) != 0) return Malformed("hdf5: not a fractal heap indirect block");
  in.Skip(sb_.so + offset_bytes);
  for (uint64_t r = 0; r < rows; ++r) {
    const uint64_t size = r < 2 ? start : (r - 1 < 63 ? start << (r - 1) : 0);
    for (uint64_t k = 0; k < width; ++k) {
      const uint64_t child = in.U(sb_.so);
      if (in.bad()) return Malformed("hdf5: fractal heap indirect block truncated");
      if (size == 0 || size > max_direct || Undefined(child, sb_.so)) continue;
      LinksInDirectBlock(child, size, heap, offset_bytes, live, &out);
    }
  }
  return out;
}

Status Walker::WalkGroupOrDataset(uint64_t header, const std::string& path, int depth) {
  if (depth > kMaxDepth || !Budget()) return Malformed("hdf5: groups nested too deep or too many objects");
  if (!seen_.insert(header).second) return Status::Ok();  // a hard link to an object already walked
  ASSIGN_OR_RETURN(ObjectInfo o, ReadHeader(header));
  if (o.layout.kind != Layout::kNone) {
    AddDataset(o, path);
    return Status::Ok();
  }
  for (const Link& link : o.links) RETURN_IF_ERROR(Child(path, link.name, link.address, depth));
  if (o.dense_links) {
    Result<std::vector<Link>> dense = DenseLinks(o.dense_heap, o.dense_names);
    if (!dense.ok()) ++counts_.dense_groups;
    for (const Link& link : dense.ok() ? *dense : std::vector<Link>{}) {
      RETURN_IF_ERROR(Child(path, link.name, link.address, depth));
    }
  }
  if (o.symbol_table) RETURN_IF_ERROR(WalkSymbolTable(o, path, depth));
  return Status::Ok();
}

Result<Superblock> ReadSuperblock(const ByteSource& src, uint64_t at) {
  std::vector<uint8_t> b(std::min<uint64_t>(128, src.size() - at));
  RETURN_IF_ERROR(src.ReadAt(at, b));
  Le m(b, 8);
  Superblock sb;
  sb.base = at;
  const uint64_t version = m.U(1);
  if (version <= 1) {
    m.Skip(3);  // free space, root group and shared header versions
    m.Skip(1);
    sb.so = static_cast<unsigned>(m.U(1));
    sb.sl = static_cast<unsigned>(m.U(1));
    m.Skip(1 + 4 + 4 + (version == 1 ? 4 : 0));  // reserved, group K's, flags, indexed storage K
  } else if (version <= 3) {
    sb.so = static_cast<unsigned>(m.U(1));
    sb.sl = static_cast<unsigned>(m.U(1));
    m.Skip(1);
  } else {
    return Malformed("hdf5: superblock version " + std::to_string(version));
  }
  auto ok_size = [](unsigned s) { return s == 2 || s == 4 || s == 8; };
  if (m.bad() || !ok_size(sb.so) || !ok_size(sb.sl)) return Malformed("hdf5: bad superblock sizes");
  if (version <= 1) {
    m.Skip(4 * sb.so + sb.so);  // base, free space, end of file, driver info; root entry's link name offset
    sb.root = m.U(sb.so);
  } else {
    m.Skip(3 * sb.so);  // base, superblock extension, end of file
    sb.root = m.U(sb.so);
  }
  if (m.bad()) return Malformed("hdf5: superblock truncated");
  return sb;
}

}  // namespace

std::optional<uint64_t> FindHdf5Superblock(const ByteSource& src) {
  uint8_t sig[sizeof(kSignature)];
  for (uint64_t at = 0; at < src.size() && src.size() - at >= sizeof(sig); at = at == 0 ? 512 : at * 2) {
    if (!src.ReadAt(at, sig).ok()) return std::nullopt;
    if (std::memcmp(sig, kSignature, sizeof(sig)) == 0) return at;
  }
  return std::nullopt;
}

Result<FileLayout> ParseHdf5(const ByteSource& src) {
  const std::optional<uint64_t> at = FindHdf5Superblock(src);
  if (!at) return Malformed("hdf5: no signature");
  ASSIGN_OR_RETURN(Superblock sb, ReadSuperblock(src, *at));
  FileLayout l;
  l.format = "hdf5";
  l.lossy_allowed = false;
  Walker w(src, sb, &l);
  RETURN_IF_ERROR(w.WalkGroupOrDataset(sb.root, "", 0));
  if (w.too_big()) {
    return Malformed("hdf5: the datasets need more than " + std::to_string(kMaxLayoutBytes >> 20) + " MiB of layout");
  }
  const Counts& c = w.counts();
  std::string note = std::to_string(c.datasets) + " datasets, " + std::to_string(l.tensors.size()) + " regions";
  auto add = [&](uint64_t n, const char* what) {
    if (n) note += "; " + std::to_string(n) + " " + what;
  };
  add(c.filtered, "filtered datasets kept as metadata");
  add(c.other_type, "datasets of another type");
  add(c.other_layout, "datasets of another layout or chunk index");
  add(c.dense_groups, "groups in dense storage not understood");
  add(c.skipped, "datasets or chunks skipped (unallocated or disagreeing sizes)");
  l.note = l.note.empty() ? note : note + "; " + l.note;
  return l;
}

bool HoldsHdf5Member(const ByteSource& src, const ZipArchive& z) {
  for (const ZipEntry& e : z.entries) {
    if (e.method != 0 || e.comp_size != e.uncomp_size || e.comp_size < sizeof(kSignature)) continue;
    uint8_t sig[sizeof(kSignature)];
    if (src.ReadAt(e.data_offset, sig).ok() && std::memcmp(sig, kSignature, sizeof(sig)) == 0) return true;
  }
  return false;
}

Result<FileLayout> ParseZippedHdf5(const ByteSource& src, const ZipArchive& z) {
  FileLayout l;
  l.format = "keras";
  l.lossy_allowed = false;
  for (const ZipEntry& e : z.entries) {
    if (e.method != 0 || e.comp_size != e.uncomp_size) continue;
    SubSource member(src, e.data_offset, e.comp_size);
    uint8_t sig[sizeof(kSignature)];
    if (e.comp_size < sizeof(sig) || !member.ReadAt(0, sig).ok() || std::memcmp(sig, kSignature, sizeof(sig)) != 0) {
      continue;
    }
    Result<FileLayout> inner = ParseHdf5(member);
    if (!l.note.empty()) l.note += "; ";
    if (!inner.ok()) {
      l.note += e.name + ": " + inner.status().message();
      continue;
    }
    l.note += e.name + ": " + inner->note;
    for (TensorRegion& t : inner->tensors) {
      t.offset += e.data_offset;
      t.order = static_cast<uint32_t>(l.tensors.size());
      l.tensors.push_back(std::move(t));
    }
  }
  AppendZipCrcFields(z, l.tensors, &l.zip_crcs);
  SortZipCrcFields(&l.zip_crcs);
  return l;
}

}  // namespace ckptfs::formats
