// TensorFlow bundle reader: the .index SSTable and the BundleEntryProtos in
// it. Real bundles written by TF 2.21 live in tests/data/tf_bundle (gen.py
// there regenerates them); hostile variants come from a small SSTable
// writer below. When a Python with TensorFlow is around, a fresh checkpoint
// is also checked against what TF itself reads back.
#include "codec/formats/tf_bundle.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "codec/formats/layout.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using Bytes = std::vector<uint8_t>;
using formats::ReadTfBundleIndex;
using formats::TfBundleEntry;
using formats::TfBundleIndex;
using formats::TfDataLayout;

const std::string kSuffix = "/.ATTRIBUTES/VARIABLE_VALUE";

std::string DataDir() {
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / "tf_bundle").string();
}

FileLayout Detect(const Bytes& b) { return DetectLayout(SpanSource(b)); }

Result<TfBundleIndex> Read(const Bytes& b) { return ReadTfBundleIndex(SpanSource(b)); }

std::span<const uint8_t> Span(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

// ---------------------------------------------------------------- builders

void PutVarint(Bytes* b, uint64_t v) {
  while (v >= 0x80) {
    b->push_back(uint8_t(v | 0x80));
    v >>= 7;
  }
  b->push_back(uint8_t(v));
}
void PutFixed32(Bytes* b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b->push_back(uint8_t(v >> (8 * i)));
}
void PutFixed64(Bytes* b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b->push_back(uint8_t(v >> (8 * i)));
}

// Protobuf message writer.
struct Proto {
  Bytes b;
  Proto& Varint(uint32_t field, uint64_t v) {
    PutVarint(&b, uint64_t{field} << 3), PutVarint(&b, v);
    return *this;
  }
  Proto& Fixed32(uint32_t field, uint32_t v) {
    PutVarint(&b, (uint64_t{field} << 3) | 5), PutFixed32(&b, v);
    return *this;
  }
  Proto& Fixed64(uint32_t field, uint64_t v) {
    PutVarint(&b, (uint64_t{field} << 3) | 1), PutFixed64(&b, v);
    return *this;
  }
  Proto& Bytes_(uint32_t field, const Bytes& v) {
    PutVarint(&b, (uint64_t{field} << 3) | 2), PutVarint(&b, v.size());
    b.insert(b.end(), v.begin(), v.end());
    return *this;
  }
};

Bytes Header(int64_t num_shards, int64_t endianness = 0) {
  return Proto().Varint(1, uint64_t(num_shards)).Varint(2, uint64_t(endianness)).Bytes_(3, Proto().Varint(1, 1).b).b;
}

struct EntrySpec {
  int64_t dtype = 1;
  std::vector<int64_t> shape;
  int64_t shard = 0;
  int64_t offset = 0;
  int64_t size = 0;
  uint32_t crc = 0;
  bool slices = false;
};

Bytes EntryProto(const EntrySpec& s) {
  Proto shape;
  for (int64_t d : s.shape) shape.Bytes_(2, Proto().Varint(1, uint64_t(d)).b);
  Proto p;
  p.Varint(1, uint64_t(s.dtype)).Bytes_(2, shape.b);
  if (s.shard) p.Varint(3, uint64_t(s.shard));
  if (s.offset) p.Varint(4, uint64_t(s.offset));
  if (s.size) p.Varint(5, uint64_t(s.size));
  p.Fixed32(6, s.crc);
  if (s.slices) p.Bytes_(7, Bytes{});
  return p.b;
}

// LevelDB table writer: prefix-compressed blocks with restart points, an
// empty metaindex, an index block of last keys, and the 48-byte footer.
struct TableOptions {
  size_t block_size = 4096;
  int restart_interval = 16;
  uint8_t compression = 0;
  bool corrupt_crc = false;
};

class TableWriter {
 public:
  explicit TableWriter(TableOptions o = {}) : o_(o) {}
  void Add(const std::string& key, const Bytes& value) {
    if (count_ % o_.restart_interval == 0) restarts_.push_back(uint32_t(block_.size()));
    size_t shared = 0;
    if (count_ % o_.restart_interval != 0) {
      while (shared < std::min(key.size(), last_.size()) && key[shared] == last_[shared]) ++shared;
    }
    PutVarint(&block_, shared), PutVarint(&block_, key.size() - shared), PutVarint(&block_, value.size());
    block_.insert(block_.end(), key.begin() + shared, key.end());
    block_.insert(block_.end(), value.begin(), value.end());
    last_ = key;
    ++count_;
    if (block_.size() >= o_.block_size) FlushData();
  }
  Bytes Finish() {
    FlushData();
    Bytes meta_handle = WriteBlock(FinishBlock({}, {0}));
    Bytes index_handle = WriteBlock(index_.Take());
    Bytes footer = meta_handle;
    footer.insert(footer.end(), index_handle.begin(), index_handle.end());
    footer.resize(40, 0);
    PutFixed64(&footer, 0xdb4775248b80fb57ull);
    out_.insert(out_.end(), footer.begin(), footer.end());
    return out_;
  }

 private:
  // A plain block builder for the index (restart interval 1, as LevelDB's).
  struct IndexBlock {
    Bytes b;
    std::vector<uint32_t> restarts;
    void Add(const std::string& key, const Bytes& value) {
      restarts.push_back(uint32_t(b.size()));
      PutVarint(&b, 0), PutVarint(&b, key.size()), PutVarint(&b, value.size());
      b.insert(b.end(), key.begin(), key.end());
      b.insert(b.end(), value.begin(), value.end());
    }
    Bytes Take() { return FinishBlock(b, restarts.empty() ? std::vector<uint32_t>{0} : restarts); }
  };
  static Bytes FinishBlock(Bytes b, const std::vector<uint32_t>& restarts) {
    for (uint32_t r : restarts) PutFixed32(&b, r);
    PutFixed32(&b, uint32_t(restarts.size()));
    return b;
  }
  Bytes WriteBlock(const Bytes& contents) {
    Bytes handle;
    PutVarint(&handle, out_.size()), PutVarint(&handle, contents.size());
    out_.insert(out_.end(), contents.begin(), contents.end());
    out_.push_back(o_.compression);
    uint32_t crc = formats::Crc32c(std::span(out_).subspan(out_.size() - contents.size() - 1));
    PutFixed32(&out_, formats::MaskCrc32c(crc) ^ (o_.corrupt_crc ? 1 : 0));
    return handle;
  }
  void FlushData() {
    if (count_ == 0) return;
    index_.Add(last_, WriteBlock(FinishBlock(block_, restarts_)));
    block_.clear(), restarts_.clear(), count_ = 0;
  }
  TableOptions o_;
  Bytes out_, block_;
  std::vector<uint32_t> restarts_;
  std::string last_;
  size_t count_ = 0;
  IndexBlock index_;
};

Bytes BuildIndex(const std::map<std::string, EntrySpec>& entries, int64_t num_shards, TableOptions o = {}) {
  TableWriter w(o);
  w.Add("", Header(num_shards));
  for (const auto& [name, spec] : entries) w.Add(name, EntryProto(spec));
  return w.Finish();
}

// ---------------------------------------------------------------- crc32c

TEST(TfBundleTest, Crc32cKnownVectors) {
  EXPECT_EQ(formats::Crc32c(Span("123456789")), 0xe3069283u);
  EXPECT_EQ(formats::Crc32c(Bytes(32, 0)), 0x8a9136aau);
  EXPECT_EQ(formats::Crc32c(Bytes(32, 0xff)), 0x62a8ab43u);
  EXPECT_EQ(formats::Crc32c(Span("56789"), formats::Crc32c(Span("1234"))), 0xe3069283u);
  for (uint32_t c : {0u, 1u, 0xe3069283u, 0xffffffffu}) EXPECT_EQ(formats::UnmaskCrc32c(formats::MaskCrc32c(c)), c);
}

TEST(TfBundleTest, DTypeMapping) {
  using formats::TfDTypeToDType;
  EXPECT_EQ(TfDTypeToDType(1), DType::kF32);
  EXPECT_EQ(TfDTypeToDType(2), DType::kF64);
  EXPECT_EQ(TfDTypeToDType(3), DType::kI32);
  EXPECT_EQ(TfDTypeToDType(4), DType::kU8);
  EXPECT_EQ(TfDTypeToDType(5), DType::kI16);
  EXPECT_EQ(TfDTypeToDType(6), DType::kI8);
  EXPECT_EQ(TfDTypeToDType(7), DType::kUnknown);  // DT_STRING
  EXPECT_EQ(TfDTypeToDType(9), DType::kI64);
  EXPECT_EQ(TfDTypeToDType(10), DType::kBool);
  EXPECT_EQ(TfDTypeToDType(14), DType::kBF16);
  EXPECT_EQ(TfDTypeToDType(17), DType::kU16);
  EXPECT_EQ(TfDTypeToDType(19), DType::kF16);
  EXPECT_EQ(TfDTypeToDType(21), DType::kUnknown);  // DT_VARIANT
  EXPECT_EQ(TfDTypeToDType(22), DType::kU32);
  EXPECT_EQ(TfDTypeToDType(23), DType::kU64);
  EXPECT_EQ(TfDTypeToDType(101), DType::kUnknown);  // DT_FLOAT_REF
  EXPECT_EQ(TfDTypeToDType(-1), DType::kUnknown);
}

// ---------------------------------------------------------------- real TF files

struct Want {
  std::string name;
  int64_t tf_dtype;
  DType dtype;
  std::vector<uint64_t> shape;
};

// CRC32C as TF's BundleWriter computes it. For DT_STRING the data is
// varint lengths, a masked CRC of the lengths, then the bytes, but the CRC
// hashes each length as a u32 rather than as the varint on disk.
uint32_t TfCrc(const TfBundleEntry& e, std::span<const uint8_t> d) {
  if (e.tf_dtype != 7) return formats::Crc32c(d);
  uint64_t n = 1;
  for (uint64_t x : e.shape) n *= x;
  uint32_t crc = 0;
  size_t pos = 0;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t len = 0;
    for (int shift = 0; pos < d.size(); shift += 7) {
      len |= uint64_t(d[pos] & 0x7f) << shift;
      if (!(d[pos++] & 0x80)) break;
    }
    uint8_t le32[4] = {uint8_t(len), uint8_t(len >> 8), uint8_t(len >> 16), uint8_t(len >> 24)};
    crc = formats::Crc32c(le32, crc);
  }
  if (pos + 4 > d.size()) return ~formats::UnmaskCrc32c(e.masked_crc32c);
  EXPECT_EQ(formats::UnmaskCrc32c(uint32_t(d[pos] | d[pos + 1] << 8 | d[pos + 2] << 16 | uint32_t(d[pos + 3]) << 24)),
            crc)
      << e.name << ": length checksum";
  return formats::Crc32c(d.subspan(pos), crc);
}

// Every entry's bytes in its shard match the CRC32C TF stored for them.
void CheckCrcs(const TfBundleIndex& idx, const std::vector<Bytes>& shards) {
  for (const TfBundleEntry& e : idx.entries) {
    if (e.has_slices) continue;
    ASSERT_LT(e.shard_id, shards.size()) << e.name;
    const Bytes& d = shards[e.shard_id];
    ASSERT_LE(e.offset + e.size, d.size()) << e.name;
    EXPECT_EQ(formats::MaskCrc32c(TfCrc(e, std::span(d).subspan(e.offset, e.size))), e.masked_crc32c) << e.name;
  }
}

TEST(TfBundleTest, RealSingleShardBundle) {
  Bytes index = test::ReadFileBytes(DataDir() + "/single/ckpt-1.index");
  Bytes data = test::ReadFileBytes(DataDir() + "/single/ckpt-1.data-00000-of-00001");
  ASSERT_FALSE(index.empty());
  auto idx = Read(index);
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  EXPECT_EQ(idx->num_shards, 1u);
  EXPECT_FALSE(idx->big_endian);
  EXPECT_EQ(idx->producer, 1);
  // As tf.train.list_variables and get_variable_to_dtype_map report them.
  const std::vector<Want> want = {
      {"_CHECKPOINTABLE_OBJECT_GRAPH", 7, DType::kUnknown, {}},
      {"bf16" + kSuffix, 14, DType::kBF16, {3}},
      {"c64" + kSuffix, 8, DType::kC64, {2}},
      {"f16" + kSuffix, 19, DType::kF16, {2, 2}},
      {"f32" + kSuffix, 1, DType::kF32, {4, 3}},
      {"f64" + kSuffix, 2, DType::kF64, {3}},
      {"flag" + kSuffix, 10, DType::kBool, {}},
      {"i16" + kSuffix, 5, DType::kI16, {2}},
      {"i32" + kSuffix, 3, DType::kI32, {2, 2, 2}},
      {"i64" + kSuffix, 9, DType::kI64, {5}},
      {"i8" + kSuffix, 6, DType::kI8, {2, 3}},
      {"save_counter" + kSuffix, 9, DType::kI64, {}},
      {"scalar" + kSuffix, 1, DType::kF32, {}},
      {"text" + kSuffix, 7, DType::kUnknown, {}},
      {"u8" + kSuffix, 4, DType::kU8, {7}},
  };
  ASSERT_EQ(idx->entries.size(), want.size());
  uint64_t total = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const TfBundleEntry& e = idx->entries[i];
    EXPECT_EQ(e.name, want[i].name);
    EXPECT_EQ(e.tf_dtype, want[i].tf_dtype) << e.name;
    EXPECT_EQ(e.dtype, want[i].dtype) << e.name;
    EXPECT_EQ(e.shape, want[i].shape) << e.name;
    EXPECT_TRUE(e.shape_known) << e.name;
    EXPECT_EQ(e.shard_id, 0u);
    EXPECT_FALSE(e.has_slices);
    if (e.dtype != DType::kUnknown) {
      uint64_t n = 1;
      for (uint64_t d : e.shape) n *= d;
      EXPECT_EQ(e.size, n * DTypeSize(e.dtype)) << e.name;
    }
    total += e.size;
  }
  // TF writes tensors back to back (data_alignment 1): the sizes tile the shard.
  EXPECT_EQ(total, data.size());
  ASSERT_NO_FATAL_FAILURE(CheckCrcs(*idx, {data}));

  FileLayout l = Detect(index);
  EXPECT_EQ(l.format, "tf-bundle-index");
  EXPECT_FALSE(l.lossy_allowed);
  EXPECT_TRUE(l.tensors.empty());
  EXPECT_EQ(l.note, "15 tensors in 1 shard");

  FileLayout dl = TfDataLayout(*idx, 0, data.size());
  EXPECT_EQ(dl.format, "tf-bundle-data");
  EXPECT_FALSE(dl.lossy_allowed);
  EXPECT_EQ(dl.tensors.size(), 13u);  // all but the two strings
  EXPECT_NE(dl.note.find("2 entries kept as metadata"), std::string::npos) << dl.note;
  uint64_t end = 0;
  for (const TensorRegion& r : dl.tensors) {
    EXPECT_GE(r.offset, end);
    end = r.offset + r.length;
    if (r.name == "f32" + kSuffix) {
      EXPECT_EQ(r.dtype, DType::kF32);
      ASSERT_EQ(r.length, 48u);
      for (int k = 0; k < 12; ++k) {
        float f;
        std::memcpy(&f, data.data() + r.offset + 4 * k, 4);
        EXPECT_EQ(f, float(k));
      }
    }
  }
  // Same result through a file descriptor.
  int fd = ::open((DataDir() + "/single/ckpt-1.index").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  auto from_fd = ReadTfBundleIndex(FdSource(fd));
  ::close(fd);
  ASSERT_TRUE(from_fd.ok());
  EXPECT_EQ(from_fd->entries.size(), want.size());
  // A data file that is too short keeps the entries past its end as metadata.
  FileLayout short_dl = TfDataLayout(*idx, 0, 100);
  EXPECT_LT(short_dl.tensors.size(), 13u);
  EXPECT_NE(short_dl.note.find("past the end"), std::string::npos);
  EXPECT_TRUE(TfDataLayout(*idx, 1, data.size()).tensors.empty());
}

TEST(TfBundleTest, RealShardedBundleWithSlices) {
  std::string dir = DataDir() + "/sharded/";
  Bytes index = test::ReadFileBytes(dir + "sh-1.index");
  auto idx = Read(index);
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  ASSERT_EQ(idx->num_shards, 3u);
  std::vector<Bytes> shards;
  for (int s = 0; s < 3; ++s)
    shards.push_back(test::ReadFileBytes(dir + "sh-1.data-0000" + std::to_string(s) + "-of-00003"));
  ASSERT_NO_FATAL_FAILURE(CheckCrcs(*idx, shards));
  // "w" [16, 12] f32 is split in two [8, 12] slices, stored under binary
  // slice keys; its own entry only lists the slices.
  int slices = 0;
  const TfBundleEntry* parent = nullptr;
  for (const TfBundleEntry& e : idx->entries) {
    if (e.name == "w" + kSuffix) parent = &e;
    if (!e.name.empty() && e.name[0] == '\0') {
      ++slices;
      EXPECT_EQ(e.dtype, DType::kF32);
      EXPECT_EQ(e.shape, (std::vector<uint64_t>{8, 12}));
      EXPECT_EQ(e.size, 8u * 12 * 4);
    }
  }
  ASSERT_NE(parent, nullptr);
  EXPECT_TRUE(parent->has_slices);
  EXPECT_EQ(parent->shape, (std::vector<uint64_t>{16, 12}));
  EXPECT_EQ(parent->size, 0u);
  EXPECT_EQ(slices, 2);
  EXPECT_EQ(Detect(index).note, std::to_string(idx->entries.size()) + " tensors in 3 shards");
  std::set<std::string> seen;
  for (uint32_t s = 0; s < 3; ++s) {
    FileLayout dl = TfDataLayout(*idx, s, shards[s].size());
    for (const TensorRegion& r : dl.tensors) {
      EXPECT_TRUE(seen.insert(r.name).second) << "region in two shards";
      EXPECT_NE(r.name, "w" + kSuffix);
    }
  }
  EXPECT_EQ(seen.size(), 5u);  // b, h, save_counter and the two slices of w
}

// A data shard is tied to its index by content: extent and CRC32C.
TEST(TfBundleTest, DataShardsMatchTheirIndexByContent) {
  std::string dir = DataDir() + "/sharded/";
  auto sharded = Read(test::ReadFileBytes(dir + "sh-1.index"));
  auto single = Read(test::ReadFileBytes(DataDir() + "/single/ckpt-1.index"));
  ASSERT_TRUE(sharded.ok() && single.ok());
  std::vector<Bytes> shards;
  for (int s = 0; s < 3; ++s)
    shards.push_back(test::ReadFileBytes(dir + "sh-1.data-0000" + std::to_string(s) + "-of-00003"));
  Bytes single_data = test::ReadFileBytes(DataDir() + "/single/ckpt-1.data-00000-of-00001");
  for (uint32_t s = 0; s < 3; ++s) {
    EXPECT_EQ(formats::MatchTfDataShard(*sharded, SpanSource(shards[s])), std::optional<uint32_t>(s));
    EXPECT_EQ(formats::MatchTfDataShard(*single, SpanSource(shards[s])), std::nullopt);
  }
  EXPECT_EQ(formats::MatchTfDataShard(*single, SpanSource(single_data)), std::optional<uint32_t>(0));
  EXPECT_EQ(formats::MatchTfDataShard(*sharded, SpanSource(single_data)), std::nullopt);

  std::vector<formats::NamedTfIndex> indexes = {{"sh-1.index", *sharded}, {"ckpt-1.index", *single}};
  auto l = formats::TfDataLayoutFromIndexes(SpanSource(single_data), indexes);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->format, "tf-bundle-data");
  EXPECT_FALSE(l->lossy_allowed);
  EXPECT_EQ(l->tensors.size(), 13u);
  EXPECT_EQ(l->note.rfind("shard 0 of 1 of the bundle indexed by ckpt-1.index", 0), 0u) << l->note;

  // Same size, one bit flipped in any tensor that is checked: no match, and
  // the file stays unknown (generic), never rejected.
  Bytes flipped = single_data;
  const TfBundleEntry* smallest = nullptr;
  for (const TfBundleEntry& e : single->entries)
    if (e.dtype != DType::kUnknown && e.size > 0 && (!smallest || e.size < smallest->size)) smallest = &e;
  ASSERT_NE(smallest, nullptr);
  flipped[smallest->offset] ^= 1;
  EXPECT_EQ(formats::MatchTfDataShard(*single, SpanSource(flipped)), std::nullopt);
  EXPECT_FALSE(formats::TfDataLayoutFromIndexes(SpanSource(flipped), indexes).has_value());
  // Longer or shorter than the entries' extent: no match.
  Bytes longer = single_data;
  longer.push_back(0);
  EXPECT_EQ(formats::MatchTfDataShard(*single, SpanSource(longer)), std::nullopt);
  Bytes shorter(single_data.begin(), single_data.end() - 1);
  EXPECT_EQ(formats::MatchTfDataShard(*single, SpanSource(shorter)), std::nullopt);
  EXPECT_EQ(formats::MatchTfDataShard(*single, SpanSource(Bytes{})), std::nullopt);
  // By content alone, the data shard is unknown.
  EXPECT_EQ(Detect(single_data).format, "unknown");
}

// A shard whose only entries are strings cannot be checked: no match.
TEST(TfBundleTest, ShardOfStringsOnlyDoesNotMatch) {
  Bytes data(16, 'x');
  EntrySpec text{.dtype = 7, .shape = {}, .offset = 0, .size = 16,
                 .crc = formats::MaskCrc32c(formats::Crc32c(data))};
  auto idx = Read(BuildIndex({{"text", text}}, 1));
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  EXPECT_EQ(formats::MatchTfDataShard(*idx, SpanSource(data)), std::nullopt);
  EntrySpec f32{.dtype = 1, .shape = {4}, .offset = 0, .size = 16, .crc = formats::MaskCrc32c(formats::Crc32c(data))};
  auto idx2 = Read(BuildIndex({{"w", f32}}, 1));
  ASSERT_TRUE(idx2.ok());
  EXPECT_EQ(formats::MatchTfDataShard(*idx2, SpanSource(data)), std::optional<uint32_t>(0));
}

TEST(TfBundleTest, DataShardNames) {
  EXPECT_TRUE(formats::LooksLikeTfDataShardName("ckpt-1.data-00000-of-00001"));
  EXPECT_TRUE(formats::LooksLikeTfDataShardName("part-00000-of-00001.data-00000-of-00001.tempstate123"));
  EXPECT_TRUE(formats::LooksLikeTfDataShardName("model.data-00002-of-00003"));
  EXPECT_FALSE(formats::LooksLikeTfDataShardName("ckpt-1.index"));
  EXPECT_FALSE(formats::LooksLikeTfDataShardName("x.data-0000-of-00001"));
  EXPECT_FALSE(formats::LooksLikeTfDataShardName("x.data-00000-of-0001"));
  EXPECT_FALSE(formats::LooksLikeTfDataShardName(".data-"));
  EXPECT_FALSE(formats::LooksLikeTfDataShardName(""));
}

// Truncated and bit-flipped real indexes never crash and never pass as a
// bundle with different contents.
TEST(TfBundleTest, RealIndexTruncationsAndFlips) {
  Bytes index = test::ReadFileBytes(DataDir() + "/single/ckpt-1.index");
  ASSERT_FALSE(index.empty());
  for (size_t n = 0; n < index.size(); ++n) {
    Bytes pre(index.begin(), index.begin() + n);
    EXPECT_FALSE(Read(pre).ok()) << n;
    FileLayout l = Detect(pre);
    EXPECT_TRUE(l.tensors.empty());
  }
  std::mt19937_64 rng(7);
  auto full = Read(index);
  ASSERT_TRUE(full.ok());
  for (int i = 0; i < 3000; ++i) {
    Bytes b = index;
    b[rng() % b.size()] ^= uint8_t(1u << (rng() % 8));
    auto r = Read(b);
    // Only bytes no CRC covers (footer padding, unused varint bits) may flip unnoticed.
    if (r.ok()) {
      EXPECT_EQ(r->entries.size(), full->entries.size());
    }
    EXPECT_TRUE(Detect(b).tensors.empty());
  }
}

// ---------------------------------------------------------------- synthetic tables

TEST(TfBundleTest, SyntheticMultiBlockTable) {
  std::map<std::string, EntrySpec> entries;
  const int64_t kDTypes[] = {1, 2, 3, 9, 14, 19, 10, 7};
  uint64_t off[4] = {};
  for (int i = 0; i < 300; ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model/layer_%03d/kernel/.ATTRIBUTES/VARIABLE_VALUE", i);
    EntrySpec s;
    s.dtype = kDTypes[i % 8];
    s.shape = {i % 5 + 1, 3};
    s.shard = i % 4;
    unsigned es = DTypeSize(formats::TfDTypeToDType(s.dtype));
    s.size = int64_t(s.shape[0] * s.shape[1] * (es ? es : 1));
    s.offset = int64_t(off[s.shard]);
    s.crc = uint32_t(i);
    off[s.shard] += uint64_t(s.size);
    entries[name] = s;
  }
  Bytes b = BuildIndex(entries, 4, {.block_size = 512, .restart_interval = 3});
  auto idx = Read(b);
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  EXPECT_EQ(idx->num_shards, 4u);
  ASSERT_EQ(idx->entries.size(), entries.size());
  size_t i = 0;
  for (const auto& [name, s] : entries) {
    const TfBundleEntry& e = idx->entries[i++];
    EXPECT_EQ(e.name, name);
    EXPECT_EQ(e.tf_dtype, s.dtype);
    EXPECT_EQ(e.shape, (std::vector<uint64_t>{uint64_t(s.shape[0]), uint64_t(s.shape[1])}));
    EXPECT_EQ(e.shard_id, uint32_t(s.shard));
    EXPECT_EQ(e.offset, uint64_t(s.offset));
    EXPECT_EQ(e.size, uint64_t(s.size));
    EXPECT_EQ(e.masked_crc32c, s.crc);
  }
  EXPECT_EQ(Detect(b).note, "300 tensors in 4 shards");
  // Shard 2 holds 75 entries; its DT_STRING ones stay metadata.
  size_t want = std::count_if(entries.begin(), entries.end(),
                              [](const auto& kv) { return kv.second.shard == 2 && kv.second.dtype != 7; });
  FileLayout dl = TfDataLayout(*idx, 2, off[2]);
  EXPECT_EQ(dl.tensors.size(), want) << dl.note;
  EXPECT_GT(want, 50u);
}

TEST(TfBundleTest, CompressedTableIsABundleWeCannotRead) {
  Bytes b = BuildIndex({{"a", {.shape = {2}, .size = 8}}}, 1, {.compression = 1});
  auto idx = Read(b);
  ASSERT_FALSE(idx.ok());
  EXPECT_EQ(idx.status().code(), ENOTSUP);
  FileLayout l = Detect(b);
  EXPECT_EQ(l.format, "tf-bundle-index");
  EXPECT_FALSE(l.lossy_allowed);
  EXPECT_TRUE(l.tensors.empty());
  EXPECT_NE(l.note.find("compressed"), std::string::npos) << l.note;
}

TEST(TfBundleTest, MalformedTablesAreRejected) {
  auto expect_bad = [](const Bytes& b, const char* what) {
    auto r = Read(b);
    EXPECT_FALSE(r.ok()) << what;
    if (!r.ok()) {
      EXPECT_NE(r.status().code(), ENOTSUP) << what;
    }
    FileLayout l = Detect(b);
    EXPECT_EQ(l.format, "unknown") << what;
    EXPECT_TRUE(l.tensors.empty()) << what;
  };
  EntrySpec ok{.shape = {2}, .size = 8};
  expect_bad(BuildIndex({{"a", ok}}, 1, {.corrupt_crc = true}), "bad crc");
  {
    TableWriter w;  // no header entry
    w.Add("a", EntryProto(ok));
    expect_bad(w.Finish(), "no header");
  }
  {
    TableWriter w;  // keys out of order
    w.Add("", Header(1));
    w.Add("b", EntryProto(ok));
    w.Add("a", EntryProto(ok));
    expect_bad(w.Finish(), "unsorted");
  }
  {
    TableWriter w;  // duplicate key
    w.Add("", Header(1));
    w.Add("a", EntryProto(ok));
    w.Add("a", EntryProto(ok));
    expect_bad(w.Finish(), "duplicate");
  }
  expect_bad(BuildIndex({{"a", {.shape = {2}, .shard = 1, .size = 8}}}, 1), "shard out of range");
  expect_bad(BuildIndex({{"a", {.shape = {2}, .size = -8}}}, 1), "negative size");
  expect_bad(BuildIndex({{"a", {.shape = {2}, .offset = -1, .size = 8}}}, 1), "negative offset");
  expect_bad(BuildIndex({{"a", {.shape = {2}, .offset = INT64_MAX, .size = 8}}}, 1), "offset+size overflow");
  expect_bad(BuildIndex({{"a", ok}}, 0), "zero shards");
  expect_bad(BuildIndex({{"a", ok}}, -3), "negative shards");
  {
    TableWriter w;  // dtype sent as a fixed32, a wire-type mismatch
    w.Add("", Header(1));
    w.Add("a", Proto().Fixed32(1, 1).b);
    expect_bad(w.Finish(), "wire type");
  }
  {
    TableWriter w;  // a group (wire type 3)
    w.Add("", Header(1));
    w.Add("a", Bytes{(1 << 3) | 3});
    expect_bad(w.Finish(), "group");
  }
  {
    TableWriter w;  // length-delimited field running past the value
    w.Add("", Header(1));
    w.Add("a", Bytes{(2 << 3) | 2, 50, 1});
    expect_bad(w.Finish(), "long field");
  }
  {
    TableWriter w;  // an 11-byte varint
    w.Add("", Header(1));
    Bytes v = {(4 << 3)};
    v.insert(v.end(), 10, 0xff);
    v.push_back(1);
    w.Add("a", v);
    expect_bad(w.Finish(), "long varint");
  }
  {
    Bytes b = BuildIndex({{"a", ok}}, 1);  // footer handles that do not decode
    std::fill(b.end() - 48, b.end() - 8, 0xff);
    expect_bad(b, "footer");
    b = BuildIndex({{"a", ok}}, 1);  // index handle pointing past the table
    b[b.size() - 46] = 0x7f;
    expect_bad(b, "footer offset");
  }
  {
    Bytes shape;  // 255 dims
    for (int i = 0; i < 255; ++i) {
      Bytes d = Proto().Varint(1, 1).b;
      Proto p;
      p.Bytes_(2, d);
      shape.insert(shape.end(), p.b.begin(), p.b.end());
    }
    TableWriter w;
    w.Add("", Header(1));
    w.Add("a", Proto().Varint(1, 1).Bytes_(2, shape).b);
    expect_bad(w.Finish(), "too many dims");
  }
}

TEST(TfBundleTest, UnknownShapesAndDTypesStayMetadata) {
  TableWriter w;
  w.Add("", Header(1));
  w.Add("a_neg", EntryProto({.dtype = 1, .shape = {-1, 2}, .offset = 0, .size = 8}));
  w.Add("b_rank", Proto().Varint(1, 1).Bytes_(2, Proto().Varint(3, 1).b).Varint(4, 8).Varint(5, 8).b);
  w.Add("c_str", EntryProto({.dtype = 7, .shape = {2}, .offset = 16, .size = 8}));
  w.Add("d_mismatch", EntryProto({.dtype = 1, .shape = {3}, .offset = 24, .size = 8}));
  w.Add("e_ok", EntryProto({.dtype = 1, .shape = {2}, .offset = 32, .size = 8}));
  w.Add("f_slices", EntryProto({.dtype = 1, .shape = {2}, .offset = 40, .size = 8, .slices = true}));
  w.Add("g_overlap", EntryProto({.dtype = 1, .shape = {2}, .offset = 36, .size = 8}));
  auto idx = Read(w.Finish());
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  ASSERT_EQ(idx->entries.size(), 7u);
  EXPECT_FALSE(idx->entries[0].shape_known);
  EXPECT_FALSE(idx->entries[1].shape_known);
  FileLayout dl = TfDataLayout(*idx, 0, 64);
  ASSERT_EQ(dl.tensors.size(), 1u) << dl.note;
  EXPECT_EQ(dl.tensors[0].name, "e_ok");
  EXPECT_NE(dl.note.find("5 entries kept as metadata"), std::string::npos) << dl.note;
  EXPECT_NE(dl.note.find("1 overlapping"), std::string::npos) << dl.note;
  // Big-endian bundles: the bytes are not in our element order.
  TableWriter be;
  be.Add("", Header(1, 1));
  be.Add("ok", EntryProto({.dtype = 1, .shape = {2}, .size = 8}));
  auto bidx = Read(be.Finish());
  ASSERT_TRUE(bidx.ok());
  EXPECT_TRUE(bidx->big_endian);
  EXPECT_TRUE(TfDataLayout(*bidx, 0, 64).tensors.empty());
}

// Prefix compression lets each 4-byte entry repeat a 60 KB key; the reader
// must give up on the budget rather than build gigabytes of names.
TEST(TfBundleTest, PrefixCompressionBombFailsFast) {
  TableWriter w({.block_size = 1 << 30, .restart_interval = 1 << 30});
  w.Add("", Header(1));
  std::string key(60004, 'k');
  for (uint32_t i = 0; i < 3000; ++i) {
    for (int k = 0; k < 4; ++k) key[60000 + k] = char(i >> (24 - 8 * k));
    w.Add(key, Bytes{});
  }
  Bytes b = w.Finish();
  auto t0 = std::chrono::steady_clock::now();
  auto r = Read(b);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("budget"), std::string::npos) << r.status().message();
  EXPECT_LT(secs, 5.0);
}

// ---------------------------------------------------------------- live TensorFlow

constexpr const char* kTfGenerator = R"PY(
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np, tensorflow as tf
out = sys.argv[1]
tf.random.set_seed(1)
model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(32), tf.keras.layers.Dense(4)])
opt = tf.keras.optimizers.Adam()
x = tf.random.normal([8, 16])
with tf.GradientTape() as t:
    loss = tf.reduce_sum(model(x))
opt.apply_gradients(zip(t.gradient(loss, model.trainable_variables), model.trainable_variables))
extra = {"h": tf.Variable(tf.random.normal([5, 7], dtype=tf.float16)),
         "bf": tf.Variable(tf.cast(tf.random.normal([9]), tf.bfloat16)),
         "ids": tf.Variable(tf.range(11, dtype=tf.int64)), "u8": tf.Variable(tf.ones([3, 3], tf.uint8))}
path = tf.train.Checkpoint(model=model, opt=opt, **extra).save(os.path.join(out, "ck"))
reader = tf.train.load_checkpoint(path)
dtypes = reader.get_variable_to_dtype_map()
man = open(os.path.join(out, "manifest.txt"), "w")
man.write("%s\n" % path)
for i, (name, shape) in enumerate(tf.train.list_variables(path)):
    dt = dtypes[name]
    blob = "-"
    if dt != tf.string:
        blob = os.path.join(out, "blob%d.bin" % i)
        open(blob, "wb").write(np.ascontiguousarray(reader.get_tensor(name)).tobytes())
    man.write("%s\t%d\t%s\t%s\n" % (name, dt.as_datatype_enum, ",".join(map(str, shape)) or "-", blob))
man.close()
)PY";

std::string TfPython() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("CKPTFS_TF_PYTHON")) candidates.push_back(env);
  candidates.push_back(
      (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / ".venv-pypi/bin/python").string());
  candidates.push_back("/tmp/pypi-probe/venv/bin/python");
  for (const std::string& py : candidates) {
    if (::access(py.c_str(), X_OK) != 0) continue;
    std::string cmd = "TF_CPP_MIN_LOG_LEVEL=3 " + py + " -c 'import tensorflow' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return py;
  }
  return "";
}

TEST(TfBundleRealFilesTest, MatchesWhatTensorFlowReads) {
  std::string py = TfPython();
  if (py.empty()) GTEST_SKIP() << "no Python with tensorflow (set CKPTFS_TF_PYTHON)";
  test::TempDir dir;
  std::string script = dir.Sub("gen.py");
  test::WriteFileBytes(script, Bytes(kTfGenerator, kTfGenerator + std::strlen(kTfGenerator)));
  ASSERT_EQ(
      std::system(("TF_CPP_MIN_LOG_LEVEL=3 " + py + " " + script + " " + dir.path() + " >/dev/null 2>&1").c_str()), 0);
  Bytes m = test::ReadFileBytes(dir.Sub("manifest.txt"));
  std::istringstream man(std::string(m.begin(), m.end()));
  std::string prefix;
  std::getline(man, prefix);
  Bytes index = test::ReadFileBytes(prefix + ".index");
  Bytes data = test::ReadFileBytes(prefix + ".data-00000-of-00001");
  auto idx = Read(index);
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  std::map<std::string, const TfBundleEntry*> by_name;
  uint64_t total = 0;
  for (const TfBundleEntry& e : idx->entries) by_name[e.name] = &e, total += e.size;
  EXPECT_EQ(total, data.size());
  FileLayout dl = TfDataLayout(*idx, 0, data.size());
  std::map<std::string, const TensorRegion*> regions;
  for (const TensorRegion& r : dl.tensors) regions[r.name] = &r;
  std::string line;
  size_t n = 0, compared = 0;
  while (std::getline(man, line)) {
    std::istringstream f(line);
    std::string name, shape_s, blob;
    int64_t dtype;
    f >> name >> dtype >> shape_s >> blob;
    ++n;
    ASSERT_TRUE(by_name.count(name)) << name;
    const TfBundleEntry& e = *by_name[name];
    EXPECT_EQ(e.tf_dtype, dtype) << name;
    std::vector<uint64_t> shape;
    if (shape_s != "-") {
      std::istringstream ss(shape_s);
      for (std::string d; std::getline(ss, d, ',');) shape.push_back(std::stoull(d));
    }
    EXPECT_EQ(e.shape, shape) << name;
    if (blob == "-") continue;
    Bytes want = test::ReadFileBytes(blob);
    EXPECT_EQ(e.size, want.size()) << name;
    ASSERT_TRUE(regions.count(name)) << name << " has no region: " << dl.note;
    const TensorRegion& r = *regions[name];
    EXPECT_EQ(Bytes(data.begin() + r.offset, data.begin() + r.offset + r.length), want) << name;
    ++compared;
  }
  EXPECT_EQ(n, idx->entries.size());
  EXPECT_GE(compared, 10u);
}

}  // namespace
}  // namespace ckptfs
