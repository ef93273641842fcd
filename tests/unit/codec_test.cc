#include <gtest/gtest.h>

#include <vector>

#include "codec/chunk_codec.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using test::CompressibleBytes;
using test::RandomBytes;

void ExpectRoundTrip(const std::vector<uint8_t>& raw, ChunkCodec want) {
  std::vector<uint8_t> stored;
  ChunkCodec codec = EncodeChunk(raw, {}, &stored);
  EXPECT_EQ(codec, want) << "size " << raw.size();
  if (codec == ChunkCodec::kZero) {
    EXPECT_TRUE(stored.empty());
  } else if (codec == ChunkCodec::kZstd) {
    EXPECT_LT(stored.size(), raw.size());
  } else {
    EXPECT_EQ(stored, raw);
  }
  std::vector<uint8_t> back(raw.size(), 0xAA);
  Status s = DecodeChunk(codec, stored, back);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(back, raw);
}

TEST(CodecTest, ZeroChunksStoreNothing) {
  for (size_t n : {1u, 7u, 63u, 64u, 65u, 4096u, 4099u, 1u << 20}) {
    ExpectRoundTrip(std::vector<uint8_t>(n, 0), ChunkCodec::kZero);
  }
}

TEST(CodecTest, AlmostZeroIsNotZero) {
  for (size_t n : {1u, 9u, 64u, 4097u}) {
    for (size_t pos : {size_t{0}, n / 2, n - 1}) {
      std::vector<uint8_t> raw(n, 0);
      raw[pos] = 1;
      std::vector<uint8_t> stored;
      EXPECT_NE(EncodeChunk(raw, {}, &stored), ChunkCodec::kZero) << n << " " << pos;
      std::vector<uint8_t> back(n);
      ASSERT_TRUE(DecodeChunk(EncodeChunk(raw, {}, &stored), stored, back).ok());
      EXPECT_EQ(back, raw);
    }
  }
}

TEST(CodecTest, RandomStaysRaw) {
  for (size_t n : {1u, 13u, 4096u, 65537u}) ExpectRoundTrip(RandomBytes(n, n), ChunkCodec::kRaw);
}

TEST(CodecTest, CompressibleUsesZstd) {
  for (size_t n : {1000u, 4096u, 4097u, 100003u}) ExpectRoundTrip(CompressibleBytes(n, n), ChunkCodec::kZstd);
}

TEST(CodecTest, LevelsAllRoundTrip) {
  std::vector<uint8_t> raw = CompressibleBytes(50000, 1);
  for (int level : {1, 3, 9, 19}) {
    std::vector<uint8_t> stored;
    ASSERT_EQ(EncodeChunk(raw, {.zstd_level = level}, &stored), ChunkCodec::kZstd);
    std::vector<uint8_t> back(raw.size());
    ASSERT_TRUE(DecodeChunk(ChunkCodec::kZstd, stored, back).ok());
    EXPECT_EQ(back, raw);
  }
}

TEST(CodecTest, CorruptZstdIsAnError) {
  std::vector<uint8_t> raw = CompressibleBytes(20000, 2);
  std::vector<uint8_t> stored;
  ASSERT_EQ(EncodeChunk(raw, {}, &stored), ChunkCodec::kZstd);
  std::vector<uint8_t> back(raw.size());

  std::vector<uint8_t> truncated(stored.begin(), stored.end() - 5);
  Status s = DecodeChunk(ChunkCodec::kZstd, truncated, back);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), EIO);
  EXPECT_NE(s.message().find("zstd"), std::string::npos) << s.message();

  std::vector<uint8_t> bad_magic = stored;
  bad_magic[0] ^= 0xff;
  EXPECT_FALSE(DecodeChunk(ChunkCodec::kZstd, bad_magic, back).ok());

  EXPECT_FALSE(DecodeChunk(ChunkCodec::kZstd, {}, back).ok());
}

TEST(CodecTest, LengthMismatchesAreErrors) {
  std::vector<uint8_t> raw = CompressibleBytes(20000, 3);
  std::vector<uint8_t> stored;
  ASSERT_EQ(EncodeChunk(raw, {}, &stored), ChunkCodec::kZstd);
  std::vector<uint8_t> small(raw.size() - 1), big(raw.size() + 1);
  EXPECT_FALSE(DecodeChunk(ChunkCodec::kZstd, stored, small).ok());
  EXPECT_FALSE(DecodeChunk(ChunkCodec::kZstd, stored, big).ok());

  std::vector<uint8_t> r = RandomBytes(100, 4);
  std::vector<uint8_t> out(99);
  EXPECT_FALSE(DecodeChunk(ChunkCodec::kRaw, r, out).ok());
  std::vector<uint8_t> z(10);
  EXPECT_FALSE(DecodeChunk(ChunkCodec::kZero, r, z).ok());
  EXPECT_FALSE(DecodeChunk(static_cast<ChunkCodec>(77), r, z).ok());
}

TEST(CodecTest, Names) {
  EXPECT_STREQ(ChunkCodecName(ChunkCodec::kRaw), "raw");
  EXPECT_STREQ(ChunkCodecName(ChunkCodec::kZstd), "zstd");
  EXPECT_STREQ(ChunkCodecName(ChunkCodec::kZero), "zero");
}

}  // namespace
}  // namespace ckptfs
