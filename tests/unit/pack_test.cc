#include "store/pack.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "base/hash.h"
#include "base/le.h"
#include "base/env.h"
#include "tests/unit/fault_env.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using test::CompressibleBytes;
using test::MemBases;
using test::RandomBytes;
using test::TempDir;

class PackTest : public ::testing::Test {
 protected:
  // Writes `content` as a pack at dir/name; returns the stats.
  Result<PackStats> Write(const std::vector<uint8_t>& content, uint32_t chunk_size, const std::string& name = "p",
                          const std::atomic<bool>* cancel = nullptr, uint64_t size_override = UINT64_MAX,
                          std::span<const TensorRange> tensors = {}, ChunkPlanner* planner = nullptr) {
    test::WriteFileBytes(dir_.Sub("src"), content);
    ASSIGN_OR_RETURN(UniqueFd src, env_->OpenAt(AT_FDCWD, dir_.Sub("src"), O_RDONLY));
    ASSIGN_OR_RETURN(UniqueFd dst, env_->OpenAt(AT_FDCWD, dir_.Sub(name), O_CREAT | O_TRUNC | O_RDWR, 0644));
    uint64_t size = size_override == UINT64_MAX ? content.size() : size_override;
    return WritePack(env_, src.get(), size, dst.get(), chunk_size, {}, cancel, tensors, planner);
  }
  // Rewrites the header's version field (offset 8) and its checksum (offset
  // 56: XXH3-64 of bytes 0..55, seed kSeedHeader), as store/pack_writer.cc writes them.
  static uint64_t Get64(const std::vector<uint8_t>& b, size_t off) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | b[off + i];
    return v;
  }
  static void Put64(std::vector<uint8_t>& b, size_t off, uint64_t v) {
    for (int i = 0; i < 8; ++i) b[off + i] = static_cast<uint8_t>(v >> (8 * i));
  }
  // Rewrites a version 3 pack as an older build wrote it: without the meta
  // block and the header fields that locate it.
  void DowngradeTo(uint32_t version, const std::string& name = "p") {
    std::vector<uint8_t> b = test::ReadFileBytes(dir_.Sub(name));
    const uint64_t meta_off = Get64(b, 40), meta_len = b[48] | b[49] << 8 | b[50] << 16 | uint64_t{b[51]} << 24;
    ASSERT_GT(meta_len, 0u);
    b.erase(b.begin() + meta_off, b.begin() + meta_off + meta_len);
    Put64(b, b.size() - 32, Get64(b, b.size() - 32) - meta_len);  // footer: table offset
    std::fill(b.begin() + 40, b.begin() + 56, 0);
    test::WriteFileBytes(dir_.Sub(name), b);
    SetHeaderVersion(version, name);
  }
  void SetHeaderVersion(uint32_t version, const std::string& name = "p") {
    std::vector<uint8_t> b = test::ReadFileBytes(dir_.Sub(name));
    ASSERT_GE(b.size(), kPackHeaderSize);
    for (int i = 0; i < 4; ++i) b[8 + i] = static_cast<uint8_t>(version >> (8 * i));
    const uint64_t sum = Checksum64(std::span<const uint8_t>(b.data(), 56), kSeedHeader);
    for (int i = 0; i < 8; ++i) b[56 + i] = static_cast<uint8_t>(sum >> (8 * i));
    test::WriteFileBytes(dir_.Sub(name), b);
  }
  Result<std::shared_ptr<PackReader>> Open(const std::string& name = "p") {
    ASSIGN_OR_RETURN(UniqueFd fd, env_->OpenAt(AT_FDCWD, dir_.Sub(name), O_RDONLY));
    return PackReader::Open(env_, std::move(fd), name);
  }
  Result<std::vector<uint8_t>> ReadAll(const PackReader& r, BaseSource* bases = nullptr) {
    std::vector<uint8_t> out, chunk;
    for (uint64_t i = 0; i < r.chunks().size(); ++i) {
      RETURN_IF_ERROR(r.ReadChunk(i, &chunk, bases));
      out.insert(out.end(), chunk.begin(), chunk.end());
    }
    return out;
  }
  void RoundTrip(const std::vector<uint8_t>& content, uint32_t chunk_size) {
    Result<PackStats> st = Write(content, chunk_size);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ(st->logical_size, content.size());
    EXPECT_EQ(st->chunk_count, (content.size() + chunk_size - 1) / chunk_size);
    EXPECT_EQ(st->stored_size, test::ReadFileBytes(dir_.Sub("p")).size());
    Result<std::shared_ptr<PackReader>> r = Open();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ((*r)->header().logical_size, content.size());
    EXPECT_EQ((*r)->header().chunk_size, chunk_size);
    EXPECT_EQ((*r)->stored_size(), st->stored_size);
    Result<std::vector<uint8_t>> back = ReadAll(**r);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, content);
    EXPECT_TRUE((*r)->VerifyAll().ok());
  }

  Env* env_ = Env::Default();
  TempDir dir_;
};

// Stores chunk 0 as a ref to pack kBase at `offset` (negative: a leading window).
class FirstChunkRef : public ChunkPlanner {
 public:
  static constexpr ObjectId kBase = 7;
  explicit FirstChunkRef(int64_t offset) : offset_(offset) {}
  std::optional<ChunkPlan> PlanRef(uint64_t offset, std::span<const uint8_t>, uint64_t,
                                   std::span<const TensorRange>) override {
    if (offset != 0) return std::nullopt;
    ChunkPlan p{ChunkCodec::kRef, std::vector<uint8_t>(kBaseRefSize), kBase, 0};
    le::Put64(p.payload, 0, kBase);
    le::Put64(p.payload, 8, static_cast<uint64_t>(offset_));
    return p;
  }
  std::optional<ChunkPlan> PlanDelta(uint64_t, std::span<const uint8_t>, std::span<const TensorRange>,
                                     const std::function<size_t()>&) override {
    return std::nullopt;
  }

 private:
  int64_t offset_;
};

// Asks for the chunk's standalone size twice per chunk, then declines.
class AskingPlanner : public ChunkPlanner {
 public:
  std::vector<size_t> sizes;
  std::optional<ChunkPlan> PlanRef(uint64_t, std::span<const uint8_t>, uint64_t,
                                   std::span<const TensorRange>) override {
    return std::nullopt;
  }
  std::optional<ChunkPlan> PlanDelta(uint64_t, std::span<const uint8_t>, std::span<const TensorRange>,
                                     const std::function<size_t()>& standalone_size) override {
    sizes.push_back(standalone_size());
    sizes.push_back(standalone_size());
    return std::nullopt;
  }
};

// A planner that asks for the standalone size gets the size the chunk is
// stored at, however often it asks, and the chunks are stored as they are
// without a planner.
TEST_F(PackTest, StandaloneSizeIsTheStoredSize) {
  const std::vector<uint8_t> content = test::MixedContent(4096, 31);
  ASSERT_TRUE(Write(content, 4096, "plain").ok());
  AskingPlanner planner;
  Result<PackStats> st = Write(content, 4096, "p", nullptr, UINT64_MAX, {}, &planner);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  auto plain = Open("plain"), planned = Open();
  ASSERT_TRUE(plain.ok() && planned.ok());
  const auto& chunks = (*planned)->chunks();
  size_t asked = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].codec, (*plain)->chunks()[i].codec) << i;
    if (chunks[i].codec == ChunkCodec::kZero) continue;  // never planned
    ASSERT_LT(asked + 1, planner.sizes.size());
    EXPECT_EQ(planner.sizes[asked], chunks[i].stored_len) << i;
    EXPECT_EQ(planner.sizes[asked + 1], chunks[i].stored_len) << i;
    asked += 2;
  }
  EXPECT_EQ(asked, planner.sizes.size());
  EXPECT_EQ((*planned)->stored_size(), (*plain)->stored_size());
  Result<std::vector<uint8_t>> back = ReadAll(**planned);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, content);
}

TEST_F(PackTest, EmptyFile) {
  RoundTrip({}, 4096);
  auto bytes = test::ReadFileBytes(dir_.Sub("p"));
  EXPECT_EQ(bytes.size(), kPackHeaderSize + 40u + kPackFooterSize);  // header, empty meta block, footer
  EXPECT_EQ(std::memcmp(bytes.data(), "CKPTPACK", 8), 0);
  EXPECT_EQ(std::memcmp(bytes.data() + bytes.size() - 8, "CKPTEND1", 8), 0);
}

TEST_F(PackTest, SinglePartialChunk) { RoundTrip(RandomBytes(100, 1), 4096); }
TEST_F(PackTest, ExactMultipleOfChunk) { RoundTrip(CompressibleBytes(4096 * 3, 2), 4096); }
TEST_F(PackTest, OneByte) { RoundTrip({42}, 4096); }

TEST_F(PackTest, MultiChunkMixed) {
  std::vector<uint8_t> content = test::MixedContent(4096, 3);
  std::vector<uint8_t> more = test::MixedContent(4096, 9);
  content.insert(content.end(), more.begin(), more.end() - 100);
  RoundTrip(content, 4096);
  auto r = Open();
  ASSERT_TRUE(r.ok());
  const auto& c = (*r)->chunks();
  EXPECT_EQ(c[0].codec, ChunkCodec::kZstd);
  EXPECT_EQ(c[1].codec, ChunkCodec::kRaw);
  EXPECT_EQ(c[2].codec, ChunkCodec::kZero);
  EXPECT_EQ(c[2].stored_len, 0u);
}

TEST_F(PackTest, SparseFileCostsAlmostNothing) {
  std::vector<uint8_t> content(4096 * 64, 0);
  content[4096 * 10 + 5] = 1;
  RoundTrip(content, 4096);
  auto r = Open();
  ASSERT_TRUE(r.ok());
  // Header + one tiny zstd chunk + meta (9 bytes a chunk) + table + footer.
  EXPECT_LT((*r)->stored_size(), 64u + 200u + 40u + 64u * (kPackTableEntrySize + 9u) + 32u);
}

// The holes of a sparse source are zero chunks that are never read nor
// hashed (kPackFlagHoles): only the chunks holding data are read, with one
// worker or several, and the pack reads back as the file.
TEST_F(PackTest, HolesOfASparseSourceAreNeverRead) {
  constexpr uint64_t kChunks = 64, kSize = 4096 * kChunks;
  std::vector<uint8_t> model(kSize, 0);
  {
    Result<UniqueFd> src = env_->OpenAt(AT_FDCWD, dir_.Sub("src"), O_CREAT | O_TRUNC | O_RDWR, 0644);
    ASSERT_TRUE(src.ok());
    ASSERT_TRUE(env_->Ftruncate(src->get(), kSize).ok());
    for (uint64_t off : {uint64_t{4096 * 10 + 5}, kSize - 1}) {
      model[off] = 0x58;
      ASSERT_TRUE(env_->PWriteAll(src->get(), std::span<const uint8_t>(&model[off], 1), off).ok());
    }
  }
  for (unsigned workers : {1u, 3u}) {
    FaultEnv counting;
    Result<UniqueFd> src = env_->OpenAt(AT_FDCWD, dir_.Sub("src"), O_RDONLY);
    Result<UniqueFd> dst = env_->OpenAt(AT_FDCWD, dir_.Sub("p"), O_CREAT | O_TRUNC | O_RDWR, 0644);
    ASSERT_TRUE(src.ok() && dst.ok());
    Result<PackStats> st = WritePack(&counting, src->get(), kSize, dst->get(), 4096, {}, nullptr, {},
                                     PackWorkers{workers, {}});
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ(counting.calls(FaultEnv::kPRead), 2u) << workers << " worker(s)";
    Result<std::shared_ptr<PackReader>> r = Open();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ((*r)->header().flags, kPackFlagHoles);
    for (uint64_t i = 0; i < kChunks; ++i) {
      const bool data = i == 10 || i == kChunks - 1;
      EXPECT_EQ((*r)->chunks()[i].codec == ChunkCodec::kZero, !data) << "chunk " << i;
    }
    Result<std::vector<uint8_t>> back = ReadAll(**r);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_TRUE(*back == model);
    EXPECT_TRUE((*r)->VerifyAll().ok());
  }
}

// A size past kMaxPackChunks chunks, which any user can give a file
// (truncate -s 8E), is EFBIG before anything is allocated for its table.
TEST_F(PackTest, MoreChunksThanAPackHoldsIsEfbig) {
  for (uint64_t size : {kMaxPackChunks * 4096 + 1, uint64_t{1} << 62}) {
    Result<PackStats> st = Write({}, 4096, "p", nullptr, size);
    ASSERT_FALSE(st.ok()) << size;
    EXPECT_EQ(st.status().code(), EFBIG) << st.status().ToString();
  }
}

// Header flags: kPackFlagHoles is read; any other bit is corruption, as an
// unknown version is.
TEST_F(PackTest, UnknownHeaderFlagsAreRejected) {
  ASSERT_TRUE(Write(RandomBytes(5000, 16), 4096).ok());
  for (uint32_t flags : {kPackFlagHoles, 2u, 0x80000000u}) {
    std::vector<uint8_t> b = test::ReadFileBytes(dir_.Sub("p"));
    le::Put32(b, 20, flags);
    le::Put64(b, 56, Checksum64(std::span<const uint8_t>(b.data(), 56), kSeedHeader));
    test::WriteFileBytes(dir_.Sub("p"), b);
    auto r = Open();
    EXPECT_EQ(r.ok(), flags == kPackFlagHoles) << "flags " << flags;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("unknown header flags"), std::string::npos);
    }
  }
}

TEST_F(PackTest, LittleEndianLayout) {
  std::vector<uint8_t> content = RandomBytes(5000, 4);
  ASSERT_TRUE(Write(content, 4096).ok());
  auto b = test::ReadFileBytes(dir_.Sub("p"));
  auto u64 = [&](size_t off) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | b[off + i];
    return v;
  };
  EXPECT_EQ(u64(24), 5000u);  // logical size
  EXPECT_EQ(u64(32), 2u);     // chunk count
  const uint64_t table_offset = u64(b.size() - 32);
  EXPECT_EQ(u64(40), 64u + 5000u);                   // meta block after two raw chunks
  EXPECT_EQ(table_offset, 64u + 5000u + 40u + 18u);  // meta: 40 fixed + 9 per chunk
  EXPECT_EQ(u64(table_offset), 64u);                 // first chunk's payload offset
  EXPECT_EQ(table_offset + 2 * kPackTableEntrySize + kPackFooterSize, b.size());
}

TEST_F(PackTest, ShrunkSourceIsAnError) {
  std::vector<uint8_t> content = RandomBytes(10000, 5);
  Result<PackStats> st = Write(content, 4096, "p", nullptr, 12000);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), EAGAIN);
  EXPECT_NE(st.status().message().find("shrank"), std::string::npos);
}

TEST_F(PackTest, CancelAborts) {
  std::atomic<bool> cancel{true};
  Result<PackStats> st = Write(RandomBytes(10000, 6), 4096, "p", &cancel);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), ECANCELED);
}

TEST_F(PackTest, ZeroChunkSizeRejected) { EXPECT_EQ(Write({1, 2}, 0).status().code(), EINVAL); }

TEST_F(PackTest, ChunkIndexOutOfRange) {
  ASSERT_TRUE(Write(RandomBytes(100, 7), 4096).ok());
  auto r = Open();
  ASSERT_TRUE(r.ok());
  std::vector<uint8_t> out;
  EXPECT_EQ((*r)->ReadChunk(1, &out).code(), EINVAL);
}

TEST_F(PackTest, PayloadCorruptionNamesPackChunkAndOffset) {
  std::vector<uint8_t> content = RandomBytes(4096 * 3, 8);
  ASSERT_TRUE(Write(content, 4096).ok());
  auto bytes = test::ReadFileBytes(dir_.Sub("p"));
  bytes[64 + 4096 * 2 + 17] ^= 0x10;  // inside chunk 2 (raw)
  test::WriteFileBytes(dir_.Sub("p"), bytes);
  auto r = Open();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<uint8_t> out;
  EXPECT_TRUE((*r)->ReadChunk(0, &out).ok());
  Status s = (*r)->ReadChunk(2, &out);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), EIO);
  EXPECT_NE(s.message().find("pack p: chunk 2 (offset 8192): stored checksum mismatch"), std::string::npos)
      << s.message();
  EXPECT_TRUE(out.empty());
  EXPECT_FALSE((*r)->VerifyAll().ok());
}

// Every byte of a pack is covered by a checksum or a consistency check: a
// flipped bit anywhere must make Open or ReadChunk fail, and no chunk may
// ever come back with wrong bytes.
TEST_F(PackTest, BitFlipsAnywhereAreDetected) {
  const uint32_t chunk = 1024;
  std::vector<uint8_t> content = test::MixedContent(chunk, 10);
  ASSERT_TRUE(Write(content, chunk).ok());
  const std::vector<uint8_t> good = test::ReadFileBytes(dir_.Sub("p"));
  ASSERT_LT(good.size(), 4000u);  // keep the loop fast
  std::vector<std::vector<uint8_t>> want;
  for (size_t off = 0; off < content.size(); off += chunk) {
    want.emplace_back(content.begin() + off, content.begin() + std::min<size_t>(content.size(), off + chunk));
  }

  auto fd = env_->OpenAt(AT_FDCWD, dir_.Sub("p"), O_RDWR);
  ASSERT_TRUE(fd.ok());
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t pos = 0; pos < good.size(); ++pos) {
      const uint8_t mask = static_cast<uint8_t>(1u << ((pos * (pass ? 5 : 1) + pass) % 8));
      uint8_t b = good[pos] ^ mask;
      ASSERT_EQ(::pwrite(fd->get(), &b, 1, static_cast<off_t>(pos)), 1);

      bool detected = false;
      Result<std::shared_ptr<PackReader>> r = Open();
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), EIO) << r.status().ToString();
        detected = true;
      } else {
        // A damaged meta block leaves the chunks readable: it says so.
        if (!(*r)->meta_status().ok()) detected = true;
        std::vector<uint8_t> out;
        for (uint64_t i = 0; i < (*r)->chunks().size(); ++i) {
          Status s = (*r)->ReadChunk(i, &out);
          if (!s.ok()) {
            detected = true;
            EXPECT_NE(s.message().find("pack p: chunk " + std::to_string(i)), std::string::npos) << s.message();
          } else {
            ASSERT_EQ(out, want[i]) << "wrong bytes returned after flipping byte " << pos;
          }
        }
      }
      EXPECT_TRUE(detected) << "flip at byte " << pos << " went unnoticed";
      ASSERT_EQ(::pwrite(fd->get(), &good[pos], 1, static_cast<off_t>(pos)), 1);
    }
  }
}

TEST_F(PackTest, TruncationAndAppendAreDetected) {
  ASSERT_TRUE(Write(test::MixedContent(1024, 11), 1024).ok());
  const std::vector<uint8_t> good = test::ReadFileBytes(dir_.Sub("p"));
  for (size_t len = 0; len < good.size(); ++len) {
    test::WriteFileBytes(dir_.Sub("p"), std::vector<uint8_t>(good.begin(), good.begin() + len));
    EXPECT_FALSE(Open().ok()) << "truncated to " << len;
  }
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  test::WriteFileBytes(dir_.Sub("p"), longer);
  EXPECT_FALSE(Open().ok());
}

// ---- format versions -----------------------------------------------------------

// f32 weights drawn from a normal distribution: chunks of them take kTensor.
std::vector<uint8_t> FloatWeights(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<uint8_t> b;
  for (size_t i = 0; i < n; ++i) {
    uint32_t x = std::bit_cast<uint32_t>(dist(rng));
    for (int k = 0; k < 4; ++k) b.push_back(static_cast<uint8_t>(x >> (8 * k)));
  }
  return b;
}

// A base window that starts before its base (a file whose tensors moved
// back) reads zeros there, and only such a pack is version 5.
TEST_F(PackTest, LeadingBaseWindowReadsZerosBeforeTheBase) {
  MemBases bases;
  const std::vector<uint8_t>& base = bases.packs[FirstChunkRef::kBase] = RandomBytes(6000, 21);
  std::vector<uint8_t> content(64, 0);
  content.insert(content.end(), base.begin(), base.begin() + 4096 - 64);
  const std::vector<uint8_t> tail = RandomBytes(1000, 22);
  content.insert(content.end(), tail.begin(), tail.end());
  FirstChunkRef planner(-64);
  Result<PackStats> st = Write(content, 4096, "p", nullptr, UINT64_MAX, {}, &planner);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->ref_chunks, 1u);
  auto r = Open();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->header().version, kPackLeadingBaseVersion);
  EXPECT_EQ((*r)->chunks()[0].codec, ChunkCodec::kRef);
  Result<std::vector<uint8_t>> back = ReadAll(**r, &bases);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, content);
}

// Malformed windows: one that starts a whole chunk or more before its base
// is corruption; in a pack below version 5 a negative offset is past the
// end of any base, an error as it always was.
TEST_F(PackTest, MalformedLeadingBaseWindowsAreErrors) {
  MemBases bases;
  bases.packs[FirstChunkRef::kBase] = RandomBytes(6000, 23);
  const std::vector<uint8_t> content = RandomBytes(5000, 24);
  auto write = [&](int64_t offset) {
    FirstChunkRef planner(offset);
    ASSERT_TRUE(Write(content, 4096, "p", nullptr, UINT64_MAX, {}, &planner).ok());
  };
  std::vector<uint8_t> chunk;
  for (int64_t lead : {int64_t{4096}, int64_t{5000}, int64_t{1} << 62}) {
    SCOPED_TRACE(lead);
    write(-lead);
    auto r = Open();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const Status s = (*r)->ReadChunk(0, &chunk, &bases);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), EIO) << s.ToString();
    EXPECT_NE(s.message().find("offset -" + std::to_string(lead)), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("bytes before pack"), std::string::npos) << s.message();
    EXPECT_TRUE(chunk.empty());
  }
  write(-64);
  SetHeaderVersion(4);
  auto r = Open();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Status s = (*r)->ReadChunk(0, &chunk, &bases);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("is outside base pack"), std::string::npos) << s.message();
}

// New packs are version 4 (meta block, lossy chunks) unless they need 5;
// versions 1 to 3 are still read.
TEST_F(PackTest, NewPacksAreVersion4WithMeta) {
  std::vector<uint8_t> content = FloatWeights(3 * 1024, 16);
  const std::vector<TensorRange> tensors = {{0, content.size(), DType::kF32}};
  ASSERT_TRUE(Write(content, 4096, "p", nullptr, UINT64_MAX, tensors).ok());
  auto r = Open();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->header().version, 4u);
  EXPECT_EQ(kPackPlainVersion, 4u);
  EXPECT_EQ(kPackFormatVersion, 5u);
  EXPECT_EQ(kPackMinReadableVersion, 1u);
  const PackMeta& m = (*r)->meta();
  ASSERT_EQ(m.tensors.size(), 1u);
  EXPECT_EQ(m.tensors[0].length, content.size());
  ASSERT_EQ(m.chunk_hash.size(), 3u);
  EXPECT_EQ(m.chunk_hash[1], ChunkContentHash(std::span<const uint8_t>(content).subspan(4096, 4096)));
  EXPECT_EQ(m.max_depth(), 0u);
  EXPECT_TRUE(m.bases.empty());
}

TEST_F(PackTest, Version2PackIsStillReadable) {
  std::vector<uint8_t> content = FloatWeights(3 * 1024, 17);
  const std::vector<TensorRange> tensors = {{0, content.size(), DType::kF32}};
  ASSERT_TRUE(Write(content, 4096, "p", nullptr, UINT64_MAX, tensors).ok());
  DowngradeTo(2);
  auto r = Open();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->header().version, 2u);
  Result<std::vector<uint8_t>> back = ReadAll(**r);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, content);
}

// A meta block is an index over the chunks: when it is corrupt the reader
// says so (its references are unknown) and the chunks still read.
TEST_F(PackTest, CorruptMetaBlockIsReportedAndChunksStillRead) {
  const std::vector<uint8_t> content = RandomBytes(5000, 18);
  ASSERT_TRUE(Write(content, 4096).ok());
  std::vector<uint8_t> b = test::ReadFileBytes(dir_.Sub("p"));
  b[Get64(b, 40) + 9] ^= 1;  // sealed_ns, covered by the meta checksum
  test::WriteFileBytes(dir_.Sub("p"), b);
  auto r = Open();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Status& meta = (*r)->meta_status();
  ASSERT_FALSE(meta.ok());
  EXPECT_NE(meta.message().find("meta block: corruption: pack meta block: checksum mismatch"), std::string::npos)
      << meta.message();
  EXPECT_TRUE((*r)->meta().bases.empty());
  EXPECT_OK((*r)->VerifyAll());
}

// A version 1 pack (raw, zstd and zero chunks only) written by an older
// build is still read.
TEST_F(PackTest, Version1PackIsStillReadable) {
  std::vector<uint8_t> content = test::MixedContent(4096, 13);
  ASSERT_TRUE(Write(content, 4096).ok());
  DowngradeTo(1);
  auto r = Open();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->header().version, 1u);
  std::set<ChunkCodec> codecs;
  for (const ChunkEntry& e : (*r)->chunks()) codecs.insert(e.codec);
  EXPECT_EQ(codecs, (std::set<ChunkCodec>{ChunkCodec::kRaw, ChunkCodec::kZstd, ChunkCodec::kZero}));
  Result<std::vector<uint8_t>> back = ReadAll(**r);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, content);
  EXPECT_TRUE((*r)->VerifyAll().ok());
}

// kTensor did not exist in version 1: a v1 table naming it is corrupt.
TEST_F(PackTest, Version1PackWithTensorChunkIsRejected) {
  std::vector<uint8_t> content = FloatWeights(3 * 1024, 14);  // three 4 KiB chunks of f32
  const std::vector<TensorRange> tensors = {{0, content.size(), DType::kF32}};
  ASSERT_TRUE(Write(content, 4096, "p", nullptr, UINT64_MAX, tensors).ok());
  {
    auto r = Open();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    size_t tensor_chunks = 0;
    for (const ChunkEntry& e : (*r)->chunks()) tensor_chunks += e.codec == ChunkCodec::kTensor;
    ASSERT_GT(tensor_chunks, 0u) << "the test needs a kTensor chunk";
    Result<std::vector<uint8_t>> back = ReadAll(**r);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, content);
  }
  DowngradeTo(1);
  auto r = Open();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), EIO);
  EXPECT_NE(r.status().message().find("pack p: chunk 0: tensor chunk in a version 1 pack"), std::string::npos)
      << r.status().message();
}

TEST_F(PackTest, UnknownVersionsAreRejected) {
  ASSERT_TRUE(Write(RandomBytes(5000, 15), 4096).ok());
  for (uint32_t v : {6u, 0u, 0xffffffffu}) {
    SetHeaderVersion(v);
    auto r = Open();
    ASSERT_FALSE(r.ok()) << "version " << v;
    EXPECT_EQ(r.status().code(), EIO);
    EXPECT_NE(r.status().message().find("format version " + std::to_string(v) +
                                        " is not supported (this build reads 1 to 5)"),
              std::string::npos)
        << r.status().message();
  }
  SetHeaderVersion(3);  // a version 3 pack: same layout, no lossy chunks
  EXPECT_TRUE(Open().ok());
}

}  // namespace
}  // namespace ckptfs
