#include "codec/formats/ocdbt.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "base/le.h"
#include "codec/formats/limits.h"
#include "codec/formats/tf_bundle.h"

namespace ckptfs::formats {
namespace {

using nlohmann::json;

constexpr uint32_t kManifestMagic = 0x0cdb3a2a;
constexpr uint32_t kBtreeMagic = 0x0cdb20de;
constexpr uint32_t kVersionTreeMagic = 0x0cdb1234;
// A B+tree node's magic as it lies in a file (big-endian).
constexpr uint8_t kBtreeMagicBytes[4] = {kBtreeMagic >> 24, (kBtreeMagic >> 16) & 0xff, (kBtreeMagic >> 8) & 0xff,
                                         kBtreeMagic & 0xff};
constexpr size_t kOuterHeader = 4 + 8;  // magic, length; then version and compression varints
constexpr size_t kCrcBytes = 4;
constexpr size_t kMinEncodedBytes = kOuterHeader + 2 + kCrcBytes;  // a manifest or node with an empty body
// OCDBT keeps B+tree heights and key lengths small; these bound hostile input.
constexpr unsigned kMaxHeight = 32;
constexpr uint64_t kMaxKeyLength = 65535;
constexpr uint64_t kMaxMetadataJson = 1u << 20;

// OcdbtCursor over decoded bytes: varints, fixed integers and byte strings.
class OcdbtCursor {
 public:
  explicit OcdbtCursor(std::span<const uint8_t> b) : b_(b) {}
  bool done() const { return pos_ >= b_.size(); }

  Result<uint64_t> Varint() {
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
      if (pos_ >= b_.size()) return Malformed("ocdbt: truncated varint");
      const uint8_t c = b_[pos_++];
      v |= static_cast<uint64_t>(c & 0x7f) << shift;
      if (!(c & 0x80)) return v;
    }
    return Malformed("ocdbt: varint too long");
  }
  Result<uint64_t> Bounded(uint64_t max, const char* what) {
    ASSIGN_OR_RETURN(uint64_t v, Varint());
    if (v > max) return Malformed(std::string("ocdbt: ") + what + " out of range");
    return v;
  }
  Result<uint8_t> Byte() {
    if (pos_ >= b_.size()) return Malformed("ocdbt: truncated");
    return b_[pos_++];
  }
  Result<uint64_t> Le64() {
    if (b_.size() - pos_ < 8) return Malformed("ocdbt: truncated");
    uint64_t v = 0;
    for (unsigned i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b_[pos_ + i]) << (8 * i);
    pos_ += 8;
    return v;
  }
  Result<std::string> Bytes(uint64_t n) {
    if (n > b_.size() - pos_) return Malformed("ocdbt: truncated");
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  Status Skip(uint64_t n) {
    if (n > b_.size() - pos_) return Malformed("ocdbt: truncated");
    pos_ += n;
    return Status::Ok();
  }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

Result<std::vector<uint8_t>> Zstd(std::span<const uint8_t> in, uint64_t cap) {
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> ctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  if (!ctx) return Status::Error(ENOMEM, "ocdbt: no zstd context");
  std::vector<uint8_t> out;
  ZSTD_inBuffer src{in.data(), in.size(), 0};
  size_t ret = 1;
  while (ret != 0) {
    if (out.size() >= cap) return Malformed("ocdbt: nodes decode past the layout cap");
    const size_t have = out.size();
    out.resize(std::min<uint64_t>(cap, std::max<size_t>(have * 2, 64 * 1024)));
    ZSTD_outBuffer dst{out.data() + have, out.size() - have, 0};
    ret = ZSTD_decompressStream(ctx.get(), &dst, &src);
    if (ZSTD_isError(ret)) return Malformed(std::string("ocdbt: zstd: ") + ZSTD_getErrorName(ret));
    out.resize(have + dst.pos);
    if (ret != 0 && src.pos == src.size && dst.pos == 0) return Malformed("ocdbt: truncated zstd frame");
  }
  if (src.pos != src.size) return Malformed("ocdbt: bytes after the compressed body");
  return out;
}

// The body of a manifest or node: header checked, decompressed.
Result<std::vector<uint8_t>> Body(std::span<const uint8_t> enc, uint32_t magic, uint64_t cap) {
  if (enc.size() < kMinEncodedBytes) return Malformed("ocdbt: too short");
  uint32_t m = 0;
  for (unsigned i = 0; i < 4; ++i) m = (m << 8) | enc[i];
  if (m != magic) return Malformed("ocdbt: bad magic");
  const uint64_t len = le::Get64(enc, 4);
  if (len != enc.size()) return Malformed("ocdbt: length field does not match");
  OcdbtCursor c(enc.subspan(kOuterHeader, enc.size() - kOuterHeader - kCrcBytes));
  ASSIGN_OR_RETURN(uint64_t version, c.Varint());
  ASSIGN_OR_RETURN(uint64_t compression, c.Varint());
  if (version != 0 || compression > 1) return Malformed("ocdbt: unknown version or compression");
  const size_t header = kOuterHeader + 2;  // both varints are one byte, as checked
  std::span<const uint8_t> body = enc.subspan(header, enc.size() - header - kCrcBytes);
  if (compression == 0) {
    if (body.size() > cap) return Malformed("ocdbt: nodes past the layout cap");
    return std::vector<uint8_t>(body.begin(), body.end());
  }
  return Zstd(body, cap);
}

struct FileTable {
  std::vector<std::string> paths;  // full paths from the database root
  std::vector<std::string> bases;  // the transitive path of nodes read from each
};

// Data file table: prefix-compressed (base path, relative path) pairs.
// Paths come out as full paths from the database root.
Result<FileTable> DataFileTable(OcdbtCursor& c, const std::string& transitive) {
  ASSIGN_OR_RETURN(uint64_t n, c.Bounded(kMaxEntries, "data file count"));
  std::vector<uint64_t> prefix(n, 0), suffix(n), base(n);
  for (uint64_t i = 1; i < n; ++i) {
    ASSIGN_OR_RETURN(prefix[i], c.Bounded(kMaxKeyLength, "path prefix"));
  }
  for (uint64_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(suffix[i], c.Bounded(kMaxKeyLength, "path suffix"));
  }
  for (uint64_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(base[i], c.Bounded(kMaxKeyLength, "base path"));
  }
  FileTable t;
  std::string prev;
  for (uint64_t i = 0; i < n; ++i) {
    if (prefix[i] > prev.size()) return Malformed("ocdbt: path prefix longer than the previous path");
    ASSIGN_OR_RETURN(std::string s, c.Bytes(suffix[i]));
    std::string path = prev.substr(0, prefix[i]) + s;
    if (base[i] > path.size()) return Malformed("ocdbt: base path longer than the path");
    if (transitive.size() + path.size() > kMaxKeyLength) return Malformed("ocdbt: data file path too long");
    t.bases.push_back(transitive + path.substr(0, base[i]));
    t.paths.push_back(transitive + path);
    prev = std::move(path);
  }
  return t;
}

Result<OcdbtRef> FileOf(const FileTable& table, uint64_t id) {
  if (id >= table.paths.size()) return Malformed("ocdbt: data file id out of range");
  OcdbtRef r;
  r.path = table.paths[id];
  r.base = table.bases[id];
  return r;
}

// Relative keys of n entries (prefix-compressed); for interior nodes also
// each child's subtree common prefix length.
Result<std::vector<std::string>> Keys(OcdbtCursor& c, uint64_t n, std::vector<uint64_t>* subtree_common) {
  std::vector<uint64_t> prefix(n, 0), suffix(n);
  for (uint64_t i = 1; i < n; ++i) {
    ASSIGN_OR_RETURN(prefix[i], c.Bounded(kMaxKeyLength, "key prefix"));
  }
  for (uint64_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(suffix[i], c.Bounded(kMaxKeyLength, "key suffix"));
  }
  if (subtree_common) {
    subtree_common->resize(n);
    for (uint64_t i = 0; i < n; ++i) {
      ASSIGN_OR_RETURN((*subtree_common)[i], c.Bounded(kMaxKeyLength, "subtree prefix"));
    }
  }
  std::vector<std::string> keys(n);
  for (uint64_t i = 0; i < n; ++i) {
    const std::string& prev = i == 0 ? keys[0] : keys[i - 1];
    if (prefix[i] > prev.size()) return Malformed("ocdbt: key prefix longer than the previous key");
    ASSIGN_OR_RETURN(std::string s, c.Bytes(suffix[i]));
    keys[i] = prev.substr(0, prefix[i]) + s;
    if (keys[i].size() > kMaxKeyLength) return Malformed("ocdbt: key too long");
    if (subtree_common && (*subtree_common)[i] > keys[i].size()) return Malformed("ocdbt: subtree prefix too long");
  }
  return keys;
}

Status LeafEntries(OcdbtCursor& c, uint64_t n, const std::string& prefix, const FileTable& files,
                   OcdbtNode* node) {
  ASSIGN_OR_RETURN(std::vector<std::string> keys, Keys(c, n, nullptr));
  std::vector<uint64_t> lengths(n);
  std::vector<uint8_t> kinds(n);
  for (uint64_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(lengths[i], c.Varint());
  }
  for (uint64_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(kinds[i], c.Byte());
    if (kinds[i] > 1) return Malformed("ocdbt: unknown value kind");
  }
  node->entries.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    if (prefix.size() + keys[i].size() > kMaxKeyLength) return Malformed("ocdbt: key too long");
    node->entries[i].key = prefix + keys[i];
    if (kinds[i] != 1) continue;
    ASSIGN_OR_RETURN(uint64_t id, c.Varint());
    ASSIGN_OR_RETURN(node->entries[i].ref, FileOf(files, id));
    node->entries[i].ref->length = lengths[i];
  }
  for (uint64_t i = 0; i < n; ++i) {
    if (kinds[i] == 1) {
      ASSIGN_OR_RETURN(node->entries[i].ref->offset, c.Varint());
    }
  }
  for (uint64_t i = 0; i < n; ++i) {
    if (kinds[i] == 0) {
      ASSIGN_OR_RETURN(node->entries[i].value, c.Bytes(lengths[i]));
    }
  }
  return Status::Ok();
}

Status InteriorEntries(OcdbtCursor& c, uint64_t n, const std::string& prefix, const FileTable& files,
                       OcdbtNode* node) {
  std::vector<uint64_t> common;
  ASSIGN_OR_RETURN(std::vector<std::string> keys, Keys(c, n, &common));
  node->children.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    if (prefix.size() + common[i] > kMaxKeyLength) return Malformed("ocdbt: key too long");
    node->children[i].prefix = prefix + keys[i].substr(0, common[i]);
    ASSIGN_OR_RETURN(uint64_t id, c.Varint());
    ASSIGN_OR_RETURN(node->children[i].node, FileOf(files, id));
  }
  for (uint64_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(node->children[i].node.offset, c.Varint());
  }
  for (uint64_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(node->children[i].node.length, c.Varint());
  }
  return Status::Ok();  // the statistics columns that follow are not needed
}

// The version entries of a manifest: the last (latest) root.
Result<OcdbtRoot> LatestVersion(OcdbtCursor& c, const FileTable& files) {
  ASSIGN_OR_RETURN(uint64_t n, c.Bounded(1u << 16, "version count"));
  if (n == 0) return Malformed("ocdbt: manifest lists no versions");
  for (uint64_t i = 0; i < n; ++i) RETURN_IF_ERROR(c.Varint().status());  // generation numbers
  std::vector<uint8_t> heights(n);
  for (uint64_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(heights[i], c.Byte());
  }
  std::vector<uint64_t> ids(n), offsets(n), lengths(n);
  for (uint64_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(ids[i], c.Varint());
  }
  for (uint64_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(offsets[i], c.Varint());
  }
  for (uint64_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(lengths[i], c.Varint());
  }
  OcdbtRoot root;
  ASSIGN_OR_RETURN(root.node, FileOf(files, ids[n - 1]));
  root.node.offset = offsets[n - 1];
  root.node.length = lengths[n - 1];
  root.height = heights[n - 1];
  if (root.height > kMaxHeight) return Malformed("ocdbt: tree too high");
  return root;
}

Result<std::vector<uint8_t>> ReadRange(const OcdbtOpener& open, const OcdbtRef& ref, uint64_t cap) {
  if (ref.length > cap) return Malformed("ocdbt: " + ref.path + " range too large");
  ASSIGN_OR_RETURN(std::shared_ptr<const ByteSource> src, open(ref.path));
  if (!InRange(ref.offset, ref.length, src->size())) return Malformed("ocdbt: range past the end of " + ref.path);
  std::vector<uint8_t> out(ref.length);
  RETURN_IF_ERROR(src->ReadAt(ref.offset, out));
  return out;
}

}  // namespace

Result<OcdbtRoot> ReadOcdbtManifest(const ByteSource& manifest) {
  if (manifest.size() > kMaxMetadataBytes) return Malformed("ocdbt: manifest too large");
  std::vector<uint8_t> enc(manifest.size());
  RETURN_IF_ERROR(manifest.ReadAt(0, enc));
  ASSIGN_OR_RETURN(std::vector<uint8_t> body, Body(enc, kManifestMagic, kMaxLayoutBytes));
  OcdbtCursor c(body);
  RETURN_IF_ERROR(c.Skip(16));  // uuid
  ASSIGN_OR_RETURN(uint8_t kind, c.Byte());
  if (kind != 0) return Malformed("ocdbt: numbered manifests are not read");
  RETURN_IF_ERROR(c.Varint().status());  // max inline value bytes
  RETURN_IF_ERROR(c.Varint().status());  // max decoded node bytes
  RETURN_IF_ERROR(c.Byte().status());    // version tree arity
  ASSIGN_OR_RETURN(uint64_t method, c.Varint());
  if (method == 1) RETURN_IF_ERROR(c.Skip(4));  // zstd level
  if (method > 1) return Malformed("ocdbt: unknown compression method");
  ASSIGN_OR_RETURN(FileTable files, DataFileTable(c, ""));
  return LatestVersion(c, files);
}

namespace {

// A node, decoding at most *budget bytes (taken from it).
Result<OcdbtNode> DecodeNode(std::span<const uint8_t> encoded, const std::string& prefix, const std::string& base_path,
                             uint64_t* budget) {
  ASSIGN_OR_RETURN(std::vector<uint8_t> body, Body(encoded, kBtreeMagic, *budget));
  *budget -= body.size();
  OcdbtCursor c(body);
  OcdbtNode node;
  ASSIGN_OR_RETURN(node.height, c.Byte());
  ASSIGN_OR_RETURN(FileTable files, DataFileTable(c, base_path));
  ASSIGN_OR_RETURN(uint64_t n, c.Bounded(kMaxEntries, "entry count"));
  if (n == 0) return Malformed("ocdbt: empty node");
  if (node.height == 0) {
    RETURN_IF_ERROR(LeafEntries(c, n, prefix, files, &node));
  } else {
    RETURN_IF_ERROR(InteriorEntries(c, n, prefix, files, &node));
  }
  return node;
}

}  // namespace

Result<OcdbtNode> DecodeOcdbtNode(std::span<const uint8_t> encoded, const std::string& prefix,
                                  const std::string& base_path) {
  uint64_t budget = kMaxLayoutBytes;
  return DecodeNode(encoded, prefix, base_path, &budget);
}

Result<std::vector<OcdbtEntry>> ListOcdbt(const OcdbtRoot& root, const OcdbtOpener& open) {
  std::vector<OcdbtEntry> out;
  uint64_t budget = kMaxLayoutBytes;  // decoded bytes of every node together
  uint64_t key_bytes = 0;
  struct Pending {
    OcdbtChild at;
    unsigned height;
  };
  std::vector<Pending> stack{{OcdbtChild{"", root.node}, root.height}};
  while (!stack.empty()) {
    Pending p = std::move(stack.back());
    stack.pop_back();
    if (p.at.node.length > budget) return Malformed("ocdbt: tree larger than the layout cap");
    budget -= p.at.node.length;
    ASSIGN_OR_RETURN(std::vector<uint8_t> enc, ReadRange(open, p.at.node, kMaxLayoutBytes));
    ASSIGN_OR_RETURN(OcdbtNode node, DecodeNode(enc, p.at.prefix, p.at.node.base, &budget));
    if (node.height != p.height) return Malformed("ocdbt: node height differs from its parent's record");
    for (OcdbtEntry& e : node.entries) {
      // Keys inherit their parents' prefixes: bounded as they come out.
      key_bytes += e.key.size() + e.value.size();
      out.push_back(std::move(e));
    }
    if (out.size() > kMaxEntries || key_bytes > kMaxLayoutBytes) return Malformed("ocdbt: too many keys");
    // Pushed in reverse so children come off the stack in key order.
    for (auto it = node.children.rbegin(); it != node.children.rend(); ++it) {
      if (p.height == 0) break;
      stack.push_back({std::move(*it), p.height - 1});
    }
  }
  return out;
}

namespace {

struct NodeSpan {
  uint64_t length = 0;
  uint8_t height = 0;
};

// Whether `bytes` begins with a B+tree node (magic and CRC32C agree, and
// it decodes) no longer than `bytes`.
std::optional<NodeSpan> NodeAt(std::span<const uint8_t> bytes) {
  if (bytes.size() < kMinEncodedBytes) return std::nullopt;
  if (std::memcmp(bytes.data(), kBtreeMagicBytes, sizeof(kBtreeMagicBytes)) != 0) return std::nullopt;
  const uint64_t len = le::Get64(bytes, 4);
  if (len < kMinEncodedBytes || len > bytes.size()) return std::nullopt;
  std::span<const uint8_t> node = bytes.first(len);
  if (Crc32c(node.first(len - kCrcBytes)) != le::Get32(node, len - kCrcBytes)) return std::nullopt;
  Result<OcdbtNode> decoded = DecodeOcdbtNode(node, "", "");
  if (!decoded.ok()) return std::nullopt;
  return NodeSpan{len, decoded->height};
}

// The last B+tree node among the last kMaxTailNodeSearch bytes of `src`;
// with `at_end`, only one that ends the file or its zero padding.
Result<OcdbtRoot> LastNode(const ByteSource& src, const std::string& path, bool at_end) {
  const uint64_t size = src.size();
  const uint64_t span = std::min<uint64_t>(size, kMaxTailNodeSearch);
  std::vector<uint8_t> tail(span);
  RETURN_IF_ERROR(src.ReadAt(size - span, tail));
  // TensorStore pads a data file with zeros to a multiple of 4 KiB after
  // the last node: the node ends at or after the last nonzero byte, and at
  // most kMaxOcdbtPadding before the end.
  size_t nonzero_end = span;
  while (nonzero_end > 0 && tail[nonzero_end - 1] == 0) --nonzero_end;
  // From the end: the last node starts at the magic whose length field
  // reaches to the end of the file, or into its padding.
  for (size_t i = span >= kMinEncodedBytes ? span - kMinEncodedBytes + 1 : 0; i-- > 0;) {
    std::optional<NodeSpan> node = NodeAt(std::span<const uint8_t>(tail).subspan(i));
    if (!node) continue;
    if (at_end && (i + node->length < nonzero_end || span - (i + node->length) >= kMaxOcdbtPadding)) continue;
    OcdbtRoot root;
    root.node.path = path;
    root.node.offset = size - span + i;
    root.node.length = node->length;
    root.height = node->height;
    return root;
  }
  return Malformed("ocdbt: " + path + (at_end ? " does not end with a B+tree node" : " holds no B+tree node"));
}

}  // namespace

Result<OcdbtRoot> OcdbtTailNode(const ByteSource& src, const std::string& path) {
  return LastNode(src, path, /*at_end=*/true);
}

Result<OcdbtRoot> OcdbtLastNode(const ByteSource& src, const std::string& path) {
  return LastNode(src, path, /*at_end=*/false);
}

namespace {

// The length field of the node header at `off`, when the node it announces
// fits in `src` and `max_length`.
Result<std::optional<uint64_t>> NodeLengthField(const ByteSource& src, uint64_t off, uint64_t max_length) {
  uint8_t header[kOuterHeader];
  if (src.size() - off < sizeof(header)) return std::optional<uint64_t>();
  RETURN_IF_ERROR(src.ReadAt(off, header));
  const uint64_t len = le::Get64(header, 4);
  if (len < kMinEncodedBytes || len > max_length || len > src.size() - off) return std::optional<uint64_t>();
  return std::optional<uint64_t>(len);
}

}  // namespace

Result<std::vector<OcdbtRef>> FindOcdbtNodes(const ByteSource& src, uint64_t from, uint64_t to, uint64_t max_length) {
  constexpr uint64_t kWindow = 1u << 20;
  std::vector<OcdbtRef> found;
  to = std::min(to, src.size());
  std::vector<uint8_t> window;
  for (uint64_t at = from; at < to; at += kWindow) {
    const uint64_t starts = std::min(to - at, kWindow);  // magics starting in this window
    window.resize(std::min(src.size() - at, starts + sizeof(kBtreeMagicBytes) - 1));
    RETURN_IF_ERROR(src.ReadAt(at, window));
    for (size_t i = 0; i < starts;) {
      const void* hit = memmem(window.data() + i, window.size() - i, kBtreeMagicBytes, sizeof(kBtreeMagicBytes));
      if (hit == nullptr) break;
      i = static_cast<size_t>(static_cast<const uint8_t*>(hit) - window.data());
      if (i >= starts) break;
      const uint64_t off = at + i++;
      ASSIGN_OR_RETURN(std::optional<uint64_t> length, NodeLengthField(src, off, max_length));
      if (!length) continue;
      std::vector<uint8_t> node(*length);
      RETURN_IF_ERROR(src.ReadAt(off, node));
      if (NodeAt(node)) found.push_back(OcdbtRef{.path = "", .offset = off, .length = *length, .base = ""});
    }
  }
  return found;
}

bool LooksLikeOcdbtDataName(std::string_view name) {
  return name.size() == 32 &&
         std::all_of(name.begin(), name.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool StartsWithOcdbtNode(const ByteSource& src) {
  uint8_t head[4];
  if (src.size() < sizeof(head) || !src.ReadAt(0, head).ok()) return false;
  const uint32_t m = (uint32_t{head[0]} << 24) | (uint32_t{head[1]} << 16) | (uint32_t{head[2]} << 8) | head[3];
  return m == kBtreeMagic || m == kVersionTreeMagic;
}

// ---- zarr array metadata and chunks ----

namespace {

DType ZarrDType(std::string t) {
  // zarr2 "<f4" / "|u1" (big-endian arrays are not tensor regions), zarr3 "float32".
  if (!t.empty() && (t[0] == '<' || t[0] == '|')) t = t.substr(1);
  static const std::pair<const char*, DType> kMap[] = {
      {"f2", DType::kF16},      {"f4", DType::kF32},      {"f8", DType::kF64},      {"bfloat16", DType::kBF16},
      {"i1", DType::kI8},       {"i2", DType::kI16},      {"i4", DType::kI32},      {"i8", DType::kI64},
      {"u1", DType::kU8},       {"u2", DType::kU16},      {"u4", DType::kU32},      {"u8", DType::kU64},
      {"b1", DType::kBool},     {"float16", DType::kF16}, {"float32", DType::kF32}, {"float64", DType::kF64},
      {"int8", DType::kI8},     {"int16", DType::kI16},   {"int32", DType::kI32},   {"int64", DType::kI64},
      {"uint8", DType::kU8},    {"uint16", DType::kU16},  {"uint32", DType::kU32},  {"uint64", DType::kU64},
      {"bool", DType::kBool}};
  for (const auto& [name, d] : kMap) {
    if (t == name) return d;
  }
  return DType::kUnknown;
}

Result<std::vector<uint64_t>> Dims(const json& v) {
  if (!v.is_array() || v.size() > kMaxDims) return Malformed("zarr: bad shape");
  std::vector<uint64_t> d;
  for (const json& x : v) {
    if (!x.is_number_unsigned()) return Malformed("zarr: bad dimension");
    d.push_back(x.get<uint64_t>());
  }
  return d;
}

// How one array's chunks are stored, when they are raw little-endian
// elements; why not otherwise.
struct ZarrArray {
  DType dtype = DType::kUnknown;
  std::vector<uint64_t> chunk;  // the shape of one raw chunk
  // zarr3 sharding: one value is a shard of inner chunks with an index.
  bool sharded = false;
  uint64_t inner_per_shard = 1;
  bool index_at_end = true;
  std::string why_not;  // non-empty: chunks are not raw (compressed, filtered, big-endian, order F)
};

// The bytes of one raw chunk; nothing when that is zero or overflows 64
// bits (a wrapped product once matched small values and files, giving
// tensors whose shape did not fit their bytes: fuzz_zarr_chunk).
std::optional<uint64_t> RawChunkBytes(const ZarrArray& a) {
  const std::optional<uint64_t> n = NumElements(a.chunk);
  const std::optional<uint64_t> bytes = n ? CheckedMul(*n, DTypeSize(a.dtype)) : std::nullopt;
  if (!bytes || *bytes == 0) return std::nullopt;
  return bytes;
}

ZarrArray Zarr2(const json& m) {
  ZarrArray a;
  const json compressor = m.value("compressor", json());
  if (!compressor.is_null()) a.why_not = "compressed (" + compressor.value("id", "?") + ")";
  if (!m.value("filters", json()).is_null()) a.why_not = "filtered";
  if (m.value("order", "C") != "C") a.why_not = "order F";
  a.dtype = ZarrDType(m.value("dtype", ""));
  Result<std::vector<uint64_t>> c = Dims(m.value("chunks", json()));
  if (c.ok()) a.chunk = *c;
  if (!c.ok()) a.why_not = "bad chunks";
  return a;
}

// zarr3: raw when the codec chain is "bytes" (little endian) alone, or a
// sharding_indexed codec whose inner chain is that.
bool RawBytesChain(const json& codecs) {
  if (!codecs.is_array() || codecs.size() != 1 || !codecs[0].is_object()) return false;
  const json& c = codecs[0];
  if (c.value("name", "") != "bytes") return false;
  const json cfg = c.value("configuration", json::object());
  return !cfg.is_object() || cfg.value("endian", "little") == "little";
}

ZarrArray NotRaw(ZarrArray a, std::string why) {
  a.why_not = std::move(why);
  return a;
}

ZarrArray Zarr3(const json& m) {
  ZarrArray a;
  a.dtype = ZarrDType(m.value("data_type", ""));
  const json grid = m.value("chunk_grid", json::object()).value("configuration", json::object());
  Result<std::vector<uint64_t>> outer = Dims(grid.value("chunk_shape", json()));
  if (!outer.ok()) return NotRaw(std::move(a), "bad chunk grid");
  a.chunk = *outer;
  const json codecs = m.value("codecs", json());
  if (RawBytesChain(codecs)) return a;
  if (!codecs.is_array() || codecs.size() != 1 || codecs[0].value("name", "") != "sharding_indexed") {
    return NotRaw(std::move(a), "compressed");
  }
  const json cfg = codecs[0].value("configuration", json::object());
  Result<std::vector<uint64_t>> inner = Dims(cfg.value("chunk_shape", json()));
  if (!inner.ok() || inner->size() != a.chunk.size()) return NotRaw(std::move(a), "bad shard chunks");
  if (!RawBytesChain(cfg.value("codecs", json()))) return NotRaw(std::move(a), "compressed");
  const json ic = cfg.value("index_codecs", json());
  if (!ic.is_array() || ic.size() != 2 || ic[1].value("name", "") != "crc32c") return NotRaw(std::move(a), "shard index codecs");
  a.sharded = true;
  a.index_at_end = cfg.value("index_location", "end") == "end";
  for (size_t i = 0; i < a.chunk.size(); ++i) {
    if ((*inner)[i] == 0) return NotRaw(std::move(a), "bad shard chunks");
    const uint64_t across = a.chunk[i] / (*inner)[i] + (a.chunk[i] % (*inner)[i] != 0);
    if (across > kMaxEntries || a.inner_per_shard * across > kMaxEntries) {  // both <= kMaxEntries: no overflow
      return NotRaw(std::move(a), "too many chunks per shard");
    }
    a.inner_per_shard *= across;
  }
  a.chunk = *inner;
  return a;
}

struct LayoutBuilder {
  const std::string& self;
  uint64_t self_size;
  const OcdbtOpener& open;
  FileLayout* out;
  uint32_t order = 0;
  std::map<std::string, uint64_t> compressed;  // why -> chunks, for the note

  Result<std::string> Value(const OcdbtEntry& e) {
    if (!e.ref) return e.value;
    ASSIGN_OR_RETURN(std::vector<uint8_t> v, ReadRange(open, *e.ref, kMaxMetadataJson));
    return std::string(v.begin(), v.end());
  }

  void Add(const std::string& key, const std::string& array, const ZarrArray& a, uint64_t off, uint64_t len) {
    TensorRegion t;
    t.name = key;
    t.label = array + key.substr(array.size());
    t.dtype = a.dtype;
    t.shape = a.chunk;
    t.offset = off;
    t.length = len;
    t.order = order++;
    out->tensors.push_back(std::move(t));
  }

  // One value of `array` lying in this file.
  Status Chunk(const OcdbtEntry& e, const std::string& array, const ZarrArray& a) {
    if (!a.why_not.empty() || a.dtype == DType::kUnknown) {
      ++compressed[a.why_not.empty() ? "unknown dtype" : a.why_not];
      return Status::Ok();
    }
    const std::optional<uint64_t> raw_bytes = RawChunkBytes(a);
    if (!raw_bytes) {
      ++compressed["of no raw chunk size"];
      return Status::Ok();
    }
    const uint64_t chunk_bytes = *raw_bytes;
    if (!a.sharded) {
      if (e.ref->length == chunk_bytes) Add(e.key, array, a, e.ref->offset, e.ref->length);
      return Status::Ok();
    }
    // A shard: inner chunks, then (or before them) their index of
    // (offset, length) pairs and its CRC32C.
    const uint64_t index_bytes = a.inner_per_shard * 16 + kCrcBytes;
    if (e.ref->length < index_bytes) return Status::Ok();
    const uint64_t index_off = e.ref->offset + (a.index_at_end ? e.ref->length - index_bytes : 0);
    ASSIGN_OR_RETURN(std::vector<uint8_t> index,
                     ReadRange(open, OcdbtRef{e.ref->path, index_off, index_bytes, ""}, kMaxLayoutBytes));
    OcdbtCursor c(index);
    for (uint64_t i = 0; i < a.inner_per_shard; ++i) {
      ASSIGN_OR_RETURN(uint64_t off, c.Le64());
      ASSIGN_OR_RETURN(uint64_t len, c.Le64());
      if (off == UINT64_MAX && len == UINT64_MAX) continue;  // chunk absent (fill value)
      if (len != chunk_bytes || !InRange(off, len, e.ref->length)) continue;
      Add(e.key + "#" + std::to_string(i), array, a, e.ref->offset + off, len);
    }
    return Status::Ok();
  }
};

// The array a key belongs to and whether the key is that array's metadata.
std::pair<std::string, std::string> SplitKey(const std::string& key) {
  const size_t slash = key.find('/');
  if (slash == std::string::npos) return {key, ""};
  return {key.substr(0, slash), key.substr(slash + 1)};
}

}  // namespace

Result<FileLayout> OcdbtDataLayout(const std::vector<OcdbtEntry>& keys, const std::string& self, uint64_t self_size,
                                   const OcdbtOpener& open) {
  FileLayout l;
  l.format = "orbax-ocdbt";
  LayoutBuilder b{self, self_size, open, &l, 0, {}};
  std::map<std::string, ZarrArray> arrays;
  bool referenced = false;
  for (const OcdbtEntry& e : keys) {
    const auto [array, rest] = SplitKey(e.key);
    if (rest != ".zarray" && rest != "zarr.json") continue;
    Result<std::string> text = b.Value(e);
    if (!text.ok()) continue;
    json m = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!m.is_object()) continue;
    // value() throws on a member of the wrong type: such metadata is not Orbax's.
    try {
      arrays[array] = rest == ".zarray" ? Zarr2(m) : Zarr3(m);
    } catch (const json::exception&) {
      continue;
    }
  }
  for (const OcdbtEntry& e : keys) {
    if (!e.ref || e.ref->path != self) continue;
    if (!InRange(e.ref->offset, e.ref->length, self_size)) return Malformed("ocdbt: value past the end of " + self);
    referenced = true;
    const auto [array, rest] = SplitKey(e.key);
    auto it = arrays.find(array);
    if (rest.empty() || rest == ".zarray" || rest == "zarr.json" || rest.starts_with(".z") || it == arrays.end()) continue;
    RETURN_IF_ERROR(b.Chunk(e, array, it->second));
  }
  if (!referenced) return Malformed("ocdbt: no key of the latest version lies in " + self);
  for (const auto& [array, meta] : arrays) l.save_arrays.push_back(array);
  for (const auto& [why, n] : b.compressed) {
    if (!l.note.empty()) l.note += "; ";
    l.note += std::to_string(n) + " chunks " + why + " (left as bytes)";
  }
  return l;
}

bool LooksLikeZarrChunkName(std::string_view name) {
  if (name.empty() || name.size() > 256 || name.front() == '.' || name.back() == '.') return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (c == '.' && name[i - 1] == '.') return false;
    if (c != '.' && (c < '0' || c > '9')) return false;
  }
  return true;
}

Result<FileLayout> ZarrChunkFileLayout(std::string_view zarray, const std::string& array, const std::string& key,
                                       uint64_t size) {
  if (zarray.size() > kMaxMetadataJson) return Malformed("zarr: .zarray too large");
  if (!LooksLikeZarrChunkName(key)) return Malformed("zarr: " + key + " is not a chunk name");
  json m = json::parse(zarray, nullptr, /*allow_exceptions=*/false);
  if (!m.is_object() || !m.contains("zarr_format") || m["zarr_format"] != 2) return Malformed("zarr: not a v2 .zarray");
  ZarrArray a;
  try {  // value() throws on a member of the wrong type
    if (m.value("dimension_separator", ".") != ".") return Malformed("zarr: nested chunk keys");
    a = Zarr2(m);
  } catch (const json::exception&) {
    return Malformed("zarr: bad .zarray");
  }
  const size_t dims = static_cast<size_t>(std::count(key.begin(), key.end(), '.')) + 1;
  if (dims != std::max<size_t>(a.chunk.size(), 1)) return Malformed("zarr: " + key + " has the wrong rank");
  FileLayout l;
  l.format = "zarr-chunk";
  l.lossy_allowed = false;
  if (!a.why_not.empty() || a.dtype == DType::kUnknown) {
    l.note = "chunk " + (a.why_not.empty() ? std::string("of unknown dtype") : a.why_not) + " (left as bytes)";
    return l;
  }
  if (RawChunkBytes(a) != size) {
    l.note = "chunk of " + std::to_string(size) + " bytes is not one raw chunk";
    return l;
  }
  TensorRegion t;
  t.name = array + "/" + key;
  t.label = t.name;
  t.dtype = a.dtype;
  t.shape = a.chunk;
  t.offset = 0;
  t.length = size;
  l.tensors.push_back(std::move(t));
  return l;
}

}  // namespace ckptfs::formats
