#include "codec/formats/tf_bundle.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <functional>

#include "codec/formats/limits.h"
#include "base/le.h"

namespace ckptfs::formats {
namespace {

constexpr uint64_t kFooterSize = 48;  // two BlockHandles padded to 40 bytes, then the magic
constexpr uint64_t kTableMagic = 0xdb4775248b80fb57ull;
constexpr uint64_t kBlockTrailer = 5;  // compression type + masked CRC32C
constexpr uint32_t kMaxTfDims = 254;   // TensorShape::MaxDimensions()
constexpr uint32_t kMaxShards = 1u << 20;

constexpr std::array<uint32_t, 256> kCrc32cTable = [] {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? 0x82f63b78u : 0);
    t[i] = c;
  }
  return t;
}();

// ------------------------------------------------------------ varints

bool GetVarint64(std::span<const uint8_t> b, size_t* pos, uint64_t* v) {
  uint64_t r = 0;
  for (unsigned shift = 0; shift < 64 && *pos < b.size(); shift += 7) {
    uint8_t byte = b[(*pos)++];
    if (shift == 63 && byte > 1) return false;  // more than 64 bits
    r |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if (!(byte & 0x80)) {
      *v = r;
      return true;
    }
  }
  return false;
}

bool GetVarint32(std::span<const uint8_t> b, size_t* pos, uint32_t* v) {
  uint64_t r;
  size_t start = *pos;
  if (!GetVarint64(b, pos, &r) || *pos - start > 5 || r > UINT32_MAX) return false;
  *v = static_cast<uint32_t>(r);
  return true;
}

// ------------------------------------------------------------ protobuf wire format

struct ProtoField {
  uint32_t number = 0;
  uint8_t wire = 0;  // 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32
  uint64_t value = 0;
  std::span<const uint8_t> bytes;  // wire type 2
};

// Walks the fields of one message; groups (wire types 3/4) and field 0 are
// malformed. Unknown fields are returned like any other for the caller to skip.
class ProtoReader {
 public:
  explicit ProtoReader(std::span<const uint8_t> b) : b_(b) {}
  bool done() const { return pos_ >= b_.size(); }
  Status Next(ProtoField* f) {
    uint64_t tag;
    if (!GetVarint64(b_, &pos_, &tag) || tag > UINT32_MAX || (tag >> 3) == 0) return Malformed("bad protobuf tag");
    f->number = static_cast<uint32_t>(tag >> 3);
    f->wire = static_cast<uint8_t>(tag & 7);
    switch (f->wire) {
      case 0:
        if (!GetVarint64(b_, &pos_, &f->value)) return Malformed("bad protobuf varint");
        return Status::Ok();
      case 1:
      case 5: {
        size_t n = f->wire == 1 ? 8 : 4;
        if (b_.size() - pos_ < n) return Malformed("truncated protobuf fixed field");
        f->value = n == 8 ? le::Get64(b_, pos_) : le::Get32(b_, pos_);
        pos_ += n;
        return Status::Ok();
      }
      case 2: {
        uint64_t len;
        if (!GetVarint64(b_, &pos_, &len) || len > b_.size() - pos_) return Malformed("bad protobuf length");
        f->bytes = b_.subspan(pos_, len);
        pos_ += len;
        return Status::Ok();
      }
      default:
        return Malformed("unsupported protobuf wire type " + std::to_string(f->wire));
    }
  }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

Status ExpectWire(const ProtoField& f, uint8_t wire, const char* what) {
  if (f.wire == wire) return Status::Ok();
  return Malformed(std::string(what) + ": field " + std::to_string(f.number) + " has wire type " +
                   std::to_string(f.wire));
}

// int32/int64 fields are varints of the two's complement value.
int64_t AsInt64(uint64_t v) { return static_cast<int64_t>(v); }

// TensorShapeProto: repeated Dim dim = 2 {int64 size = 1; string name = 2}; bool unknown_rank = 3.
Status ParseShape(std::span<const uint8_t> b, TfBundleEntry* e) {
  ProtoReader r(b);
  ProtoField f;
  while (!r.done()) {
    RETURN_IF_ERROR(r.Next(&f));
    if (f.number == 2) {
      RETURN_IF_ERROR(ExpectWire(f, 2, "TensorShapeProto.dim"));
      if (e->shape.size() >= kMaxTfDims) return Malformed("tensor shape has too many dims");
      int64_t size = 0;
      ProtoReader dr(f.bytes);
      ProtoField df;
      while (!dr.done()) {
        RETURN_IF_ERROR(dr.Next(&df));
        if (df.number != 1) continue;
        RETURN_IF_ERROR(ExpectWire(df, 0, "TensorShapeProto.Dim.size"));
        size = AsInt64(df.value);
      }
      if (size < 0) e->shape_known = false;
      e->shape.push_back(size < 0 ? 0 : static_cast<uint64_t>(size));
    } else if (f.number == 3) {
      RETURN_IF_ERROR(ExpectWire(f, 0, "TensorShapeProto.unknown_rank"));
      if (f.value) e->shape_known = false;
    }
  }
  return Status::Ok();
}

// BundleEntryProto: dtype=1, shape=2, shard_id=3, offset=4, size=5, crc32c=6 (fixed32), slices=7.
Status ParseEntry(std::span<const uint8_t> b, uint32_t num_shards, TfBundleEntry* e) {
  ProtoReader r(b);
  ProtoField f;
  while (!r.done()) {
    RETURN_IF_ERROR(r.Next(&f));
    switch (f.number) {
      case 1:
        RETURN_IF_ERROR(ExpectWire(f, 0, "BundleEntryProto.dtype"));
        e->tf_dtype = AsInt64(f.value);
        break;
      case 2:
        RETURN_IF_ERROR(ExpectWire(f, 2, "BundleEntryProto.shape"));
        RETURN_IF_ERROR(ParseShape(f.bytes, e));
        break;
      case 3: {
        RETURN_IF_ERROR(ExpectWire(f, 0, "BundleEntryProto.shard_id"));
        int64_t s = AsInt64(f.value);
        if (s < 0 || s >= num_shards) return Malformed("shard_id " + std::to_string(s) + " out of range");
        e->shard_id = static_cast<uint32_t>(s);
        break;
      }
      case 4:
      case 5: {
        RETURN_IF_ERROR(ExpectWire(f, 0, f.number == 4 ? "BundleEntryProto.offset" : "BundleEntryProto.size"));
        if (AsInt64(f.value) < 0) return Malformed("negative tensor offset or size");
        (f.number == 4 ? e->offset : e->size) = f.value;
        break;
      }
      case 6:
        RETURN_IF_ERROR(ExpectWire(f, 5, "BundleEntryProto.crc32c"));
        e->masked_crc32c = static_cast<uint32_t>(f.value);
        break;
      case 7:
        RETURN_IF_ERROR(ExpectWire(f, 2, "BundleEntryProto.slices"));
        e->has_slices = true;
        break;
      default:
        break;
    }
  }
  if (e->offset > INT64_MAX - e->size) return Malformed("tensor offset + size overflows");
  e->dtype = TfDTypeToDType(e->tf_dtype);
  return Status::Ok();
}

// BundleHeaderProto: int32 num_shards = 1; Endianness endianness = 2; VersionDef version = 3 {int32 producer = 1}.
Status ParseHeader(std::span<const uint8_t> b, TfBundleIndex* idx) {
  ProtoReader r(b);
  ProtoField f;
  int64_t num_shards = 0, endianness = 0;
  while (!r.done()) {
    RETURN_IF_ERROR(r.Next(&f));
    if (f.number == 1) {
      RETURN_IF_ERROR(ExpectWire(f, 0, "BundleHeaderProto.num_shards"));
      num_shards = AsInt64(f.value);
    } else if (f.number == 2) {
      RETURN_IF_ERROR(ExpectWire(f, 0, "BundleHeaderProto.endianness"));
      endianness = AsInt64(f.value);
    } else if (f.number == 3) {
      RETURN_IF_ERROR(ExpectWire(f, 2, "BundleHeaderProto.version"));
      ProtoReader vr(f.bytes);
      ProtoField vf;
      while (!vr.done()) {
        RETURN_IF_ERROR(vr.Next(&vf));
        if (vf.number == 1 && vf.wire == 0) idx->producer = AsInt64(vf.value);
      }
    }
  }
  if (num_shards < 1 || num_shards > kMaxShards) return Malformed("bundle header: bad num_shards");
  if (endianness != 0 && endianness != 1) return Malformed("bundle header: bad endianness");
  idx->num_shards = static_cast<uint32_t>(num_shards);
  idx->big_endian = endianness == 1;
  return Status::Ok();
}

// ------------------------------------------------------------ SSTable

struct BlockHandle {
  uint64_t offset = 0;
  uint64_t size = 0;  // without the trailer
};

bool GetHandle(std::span<const uint8_t> b, size_t* pos, BlockHandle* h) {
  return GetVarint64(b, pos, &h->offset) && GetVarint64(b, pos, &h->size);
}

// Reads a block and checks its trailer. ENOTSUP for a compressed block.
Result<std::vector<uint8_t>> ReadBlock(const ByteSource& src, const BlockHandle& h, const char* what) {
  auto total = CheckedAdd(h.size, kBlockTrailer);
  if (!total) return Malformed(std::string(what) + " size overflows");
  ASSIGN_OR_RETURN(std::vector<uint8_t> b, ReadBounded(src, h.offset, *total, what));
  std::span<const uint8_t> s(b);
  uint32_t stored = le::Get32(s, h.size + 1);
  // Fuzzing builds skip the check so mutated blocks reach the parsers behind it.
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  if (Crc32c(s.first(h.size + 1)) != UnmaskCrc32c(stored)) return Malformed(std::string(what) + " CRC32C mismatch");
#else
  (void)stored;
#endif
  if (uint8_t type = b[h.size]; type != 0) {
    return Status::Error(ENOTSUP, std::string(what) + " is compressed (type " + std::to_string(type) + ")");
  }
  b.resize(h.size);
  return b;
}

using EntryFn = std::function<Status(const std::string& key, std::span<const uint8_t> value)>;

// Walks a block's entries in order. Checks the restart array against the
// entries (every restart point starts an entry with no shared prefix) and
// charges each decoded key to *key_budget, since prefix compression lets a
// few bytes expand into a long key.
Status ForEachEntry(std::span<const uint8_t> block, const char* what, uint64_t* key_budget, std::string* key,
                    const EntryFn& fn) {
  auto bad = [what](const char* why) { return Malformed(std::string(what) + ": " + why); };
  if (block.size() < 4) return bad("block shorter than its restart count");
  uint64_t num_restarts = le::Get32(block, block.size() - 4);
  if (num_restarts == 0 || num_restarts > (block.size() - 4) / 4) return bad("bad restart count");
  size_t limit = block.size() - 4 - 4 * num_restarts;
  auto restart = [&](uint64_t i) { return le::Get32(block, limit + 4 * i); };
  if (limit == 0) {
    // An empty block: LevelDB still writes the single restart point 0.
    if (num_restarts != 1 || restart(0) != 0) return bad("empty block with restart points");
    return Status::Ok();
  }
  for (uint64_t i = 0; i < num_restarts; ++i) {
    if (restart(i) >= limit || (i == 0 ? restart(i) != 0 : restart(i) <= restart(i - 1))) {
      return bad("bad restart point");
    }
  }
  size_t pos = 0;
  uint64_t next_restart = 0;
  while (pos < limit) {
    bool at_restart = next_restart < num_restarts && pos == restart(next_restart);
    if (next_restart < num_restarts && pos > restart(next_restart)) return bad("restart point inside an entry");
    uint32_t shared, non_shared, value_len;
    auto entries = block.first(limit);
    if (!GetVarint32(entries, &pos, &shared) || !GetVarint32(entries, &pos, &non_shared) ||
        !GetVarint32(entries, &pos, &value_len)) {
      return bad("bad entry header");
    }
    if (non_shared > limit - pos || value_len > limit - pos - non_shared) return bad("entry past end of block");
    if (shared > key->size() || (at_restart && shared != 0)) return bad("bad shared key prefix");
    uint64_t key_len = uint64_t{shared} + non_shared;
    if (key_len > kMaxNameBytes) return bad("key too long");
    if (key_len > *key_budget) return bad("decoded keys exceed the metadata budget");
    *key_budget -= key_len;
    key->resize(shared);
    key->append(reinterpret_cast<const char*>(block.data() + pos), non_shared);
    pos += non_shared;
    RETURN_IF_ERROR(fn(*key, block.subspan(pos, value_len)));
    pos += value_len;
    if (at_restart) ++next_restart;
  }
  if (next_restart != num_restarts) return bad("restart point past the last entry");
  return Status::Ok();
}

}  // namespace

uint32_t Crc32c(std::span<const uint8_t> data, uint32_t crc) {
  uint32_t c = ~crc;
  for (uint8_t b : data) c = kCrc32cTable[(c ^ b) & 0xff] ^ (c >> 8);
  return ~c;
}

DType TfDTypeToDType(int64_t tf_dtype) {
  switch (tf_dtype) {
    case 1:  // DT_FLOAT
      return DType::kF32;
    case 2:  // DT_DOUBLE
      return DType::kF64;
    case 3:   // DT_INT32
    case 13:  // DT_QINT32
      return DType::kI32;
    case 4:   // DT_UINT8
    case 12:  // DT_QUINT8
      return DType::kU8;
    case 5:   // DT_INT16
    case 15:  // DT_QINT16
      return DType::kI16;
    case 6:   // DT_INT8
    case 11:  // DT_QINT8
      return DType::kI8;
    case 8:  // DT_COMPLEX64
      return DType::kC64;
    case 9:  // DT_INT64
      return DType::kI64;
    case 10:  // DT_BOOL
      return DType::kBool;
    case 14:  // DT_BFLOAT16
      return DType::kBF16;
    case 16:  // DT_QUINT16
    case 17:  // DT_UINT16
      return DType::kU16;
    case 18:  // DT_COMPLEX128
      return DType::kC128;
    case 19:  // DT_HALF
      return DType::kF16;
    case 22:  // DT_UINT32
      return DType::kU32;
    case 23:  // DT_UINT64
      return DType::kU64;
    case 24:  // DT_FLOAT8_E5M2
      return DType::kF8E5M2;
    case 25:  // DT_FLOAT8_E4M3FN
      return DType::kF8E4M3;
    default:  // DT_STRING 7, DT_RESOURCE 20, DT_VARIANT 21, 4-bit and fnuz float8 types, *_REF
      return DType::kUnknown;
  }
}

bool HasTfIndexFooter(const ByteSource& src) {
  if (src.size() < kFooterSize) return false;
  uint8_t magic[8];
  return src.ReadAt(src.size() - 8, magic).ok() && le::Get64(magic, 0) == kTableMagic;
}

Result<TfBundleIndex> ReadTfBundleIndex(const ByteSource& src) {
  if (!HasTfIndexFooter(src)) return Malformed("no SSTable footer");
  uint8_t footer[kFooterSize];
  RETURN_IF_ERROR(src.ReadAt(src.size() - kFooterSize, footer));
  std::span<const uint8_t> handles = std::span<const uint8_t>(footer).first(kFooterSize - 8);
  size_t pos = 0;
  BlockHandle meta, index;
  if (!GetHandle(handles, &pos, &meta) || !GetHandle(handles, &pos, &index)) return Malformed("bad SSTable footer");
  const uint64_t table_end = src.size() - kFooterSize;
  auto inside = [&](const BlockHandle& h) {
    auto n = CheckedAdd(h.size, kBlockTrailer);
    return n && InRange(h.offset, *n, table_end);
  };
  if (!inside(meta) || !inside(index)) return Malformed("SSTable footer points past the table");

  // The metaindex is only checked (TF writes it empty, LevelDB may list filters).
  ASSIGN_OR_RETURN(std::vector<uint8_t> meta_block, ReadBlock(src, meta, "SSTable metaindex block"));
  ASSIGN_OR_RETURN(std::vector<uint8_t> index_block, ReadBlock(src, index, "SSTable index block"));

  // Prefix compression can expand keys; allow generous but bounded growth.
  uint64_t key_budget = std::min<uint64_t>(kMaxMetadataBytes, src.size() * 256 + (1u << 20));
  TfBundleIndex idx;
  bool have_header = false;
  std::string index_key, last_key;
  bool any_key = false;
  uint64_t next_block = 0;  // data blocks must come in file order, without overlap
  EntryFn on_entry = [&](const std::string& key, std::span<const uint8_t> value) -> Status {
    if (any_key && key <= last_key) return Malformed("SSTable keys not strictly increasing");
    any_key = true;
    last_key = key;
    if (key.empty()) {
      have_header = true;
      return ParseHeader(value, &idx);
    }
    if (!have_header) return Malformed("tensor entry before the bundle header");
    if (idx.entries.size() >= kMaxEntries) return Malformed("too many bundle entries");
    TfBundleEntry e;
    e.name = key;
    Status st = ParseEntry(value, idx.num_shards, &e);
    if (!st.ok()) return st.WithContext("entry " + key.substr(0, 200));
    idx.entries.push_back(std::move(e));
    return Status::Ok();
  };
  EntryFn on_index = [&](const std::string& sep, std::span<const uint8_t> value) -> Status {
    BlockHandle h;
    size_t p = 0;
    if (!GetHandle(value, &p, &h)) return Malformed("bad block handle in SSTable index");
    if (!inside(h) || h.offset < next_block) return Malformed("SSTable data block out of order or out of range");
    next_block = h.offset + h.size + kBlockTrailer;
    ASSIGN_OR_RETURN(std::vector<uint8_t> block, ReadBlock(src, h, "SSTable data block"));
    std::string key;
    RETURN_IF_ERROR(ForEachEntry(block, "SSTable data block", &key_budget, &key, on_entry));
    if (any_key && last_key > sep) return Malformed("SSTable index key below its block's last key");
    return Status::Ok();
  };
  std::string meta_key;
  RETURN_IF_ERROR(ForEachEntry(meta_block, "SSTable metaindex block", &key_budget, &meta_key,
                               [](const std::string&, std::span<const uint8_t>) { return Status::Ok(); }));
  RETURN_IF_ERROR(ForEachEntry(index_block, "SSTable index block", &key_budget, &index_key, on_index));
  if (!have_header) return Malformed("no bundle header entry");
  return idx;
}

Result<FileLayout> ParseTfIndex(const ByteSource& src) {
  FileLayout l;
  l.format = "tf-bundle-index";
  l.lossy_allowed = false;
  auto idx = ReadTfBundleIndex(src);
  if (!idx.ok()) {
    if (idx.status().code() != ENOTSUP) return idx.status();
    l.note = idx.status().message() + "; index kept as opaque bytes";
    return l;
  }
  l.note = std::to_string(idx->entries.size()) + " tensors in " + std::to_string(idx->num_shards) + " shard" +
           (idx->num_shards == 1 ? "" : "s");
  return l;
}

FileLayout TfDataLayout(const TfBundleIndex& index, uint32_t shard_id, uint64_t data_size) {
  FileLayout l;
  l.format = "tf-bundle-data";
  l.lossy_allowed = false;
  uint64_t metadata = 0, outside = 0;
  for (const TfBundleEntry& e : index.entries) {
    if (e.shard_id != shard_id || e.size == 0) continue;
    auto numel = NumElements(e.shape);
    auto bytes = numel ? CheckedMul(*numel, DTypeSize(e.dtype)) : std::nullopt;
    if (index.big_endian || e.has_slices || !e.shape_known || e.dtype == DType::kUnknown || bytes != e.size) {
      ++metadata;
      continue;
    }
    if (!InRange(e.offset, e.size, data_size)) {
      ++outside;
      continue;
    }
    l.tensors.push_back({e.name, e.dtype, e.shape, e.offset, e.size, e.name, static_cast<uint32_t>(l.tensors.size())});
  }
  std::stable_sort(l.tensors.begin(), l.tensors.end(),
                   [](const auto& a, const auto& b) { return a.offset < b.offset; });
  uint64_t overlapping = 0, end = 0;
  std::erase_if(l.tensors, [&](const TensorRegion& r) {
    if (r.offset < end) {
      ++overlapping;
      return true;
    }
    end = r.offset + r.length;
    return false;
  });
  auto add = [&](uint64_t n, const char* what) {
    if (n == 0) return;
    if (!l.note.empty()) l.note += "; ";
    l.note += std::to_string(n) + " " + what;
  };
  add(metadata, "entries kept as metadata (strings, variants, sliced, unknown dtype or big-endian)");
  add(outside, "entries past the end of the shard");
  add(overlapping, "overlapping entries dropped");
  return l;
}

namespace {

// Checks the CRC32C of an entry's bytes, read in pieces so a big entry
// never needs to be in memory at once.
bool EntryCrcMatches(const TfBundleEntry& e, const ByteSource& data) {
  constexpr uint64_t kPiece = 1u << 20;
  std::vector<uint8_t> buf(std::min(e.size, kPiece));
  uint32_t crc = 0;
  for (uint64_t done = 0; done < e.size;) {
    const uint64_t n = std::min(kPiece, e.size - done);
    if (!data.ReadAt(e.offset + done, std::span(buf).first(n)).ok()) return false;
    crc = Crc32c(std::span<const uint8_t>(buf).first(n), crc);
    done += n;
  }
  return MaskCrc32c(crc) == e.masked_crc32c;
}

bool ShardMatches(const TfBundleIndex& index, uint32_t shard, const ByteSource& data) {
  uint64_t end = 0;
  std::vector<const TfBundleEntry*> checkable;
  for (const TfBundleEntry& e : index.entries) {
    if (e.shard_id != shard || e.size == 0) continue;
    end = std::max(end, e.offset + e.size);  // ParseEntry rules out overflow
    // TF hashes a string tensor's lengths as u32s, not the varints on disk.
    if (e.dtype != DType::kUnknown && !e.has_slices) checkable.push_back(&e);
  }
  if (end != data.size() || checkable.empty()) return false;
  std::stable_sort(checkable.begin(), checkable.end(), [](auto* a, auto* b) { return a->size < b->size; });
  uint64_t checked = 0;
  for (const TfBundleEntry* e : checkable) {
    if (checked > 0 && checked + e->size > kTfShardCheckBytes) break;
    if (!EntryCrcMatches(*e, data)) return false;
    checked += e->size;
  }
  return true;
}

}  // namespace

std::optional<uint32_t> MatchTfDataShard(const TfBundleIndex& index, const ByteSource& data) {
  if (data.size() == 0) return std::nullopt;
  std::vector<bool> seen(index.num_shards, false);
  for (const TfBundleEntry& e : index.entries) {
    if (e.shard_id >= index.num_shards || seen[e.shard_id]) continue;
    seen[e.shard_id] = true;
    if (ShardMatches(index, e.shard_id, data)) return e.shard_id;
  }
  return std::nullopt;
}

std::optional<FileLayout> TfDataLayoutFromIndexes(const ByteSource& data, const std::vector<NamedTfIndex>& indexes) {
  for (const NamedTfIndex& idx : indexes) {
    const std::optional<uint32_t> shard = MatchTfDataShard(idx.index, data);
    if (!shard) continue;
    FileLayout l = TfDataLayout(idx.index, *shard, data.size());
    std::string where = "shard " + std::to_string(*shard) + " of " + std::to_string(idx.index.num_shards) +
                        " of the bundle indexed by " + idx.name;
    l.note = l.note.empty() ? where : where + "; " + l.note;
    return l;
  }
  return std::nullopt;
}

bool LooksLikeTfDataShardName(std::string_view name) {
  constexpr std::string_view kData = ".data-";
  for (size_t at = name.find(kData); at != std::string_view::npos; at = name.find(kData, at + 1)) {
    std::string_view rest = name.substr(at + kData.size());
    auto digits = [&rest](size_t n) {
      if (rest.size() < n) return false;
      for (size_t i = 0; i < n; ++i) {
        if (rest[i] < '0' || rest[i] > '9') return false;
      }
      rest.remove_prefix(n);
      return true;
    };
    if (digits(5) && rest.starts_with("-of-") && (rest.remove_prefix(4), digits(5))) return true;
  }
  return false;
}

}  // namespace ckptfs::formats
