// ChunkReadAhead (store/chunk_read_ahead.h) and PackReader::ReadAhead: bytes
// read ahead are the bytes a read gives; each chunk is read ahead at most
// once, and not after it was read; a failed read ahead leaves the reader to
// read the chunk itself; memory stays at kMaxHeld reads.
#include "store/chunk_read_ahead.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "store/pack.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using Bytes = std::vector<uint8_t>;

// Bytes in memory that count the reads at each offset, and fail the first
// read at chosen offsets.
class CountingBytes : public PackBytes {
 public:
  explicit CountingBytes(Bytes bytes, std::vector<uint64_t> fail_once = {})
      : bytes_(std::move(bytes)), fail_once_(fail_once.begin(), fail_once.end()) {}
  Result<uint64_t> Size() override { return bytes_.size(); }
  Status ReadExact(std::span<uint8_t> out, uint64_t off) const override {
    {
      std::lock_guard lk(mu_);
      ++reads_[off];
      if (fail_once_.erase(off) > 0) return Status::Error(EIO, "injected read failure");
    }
    if (off > bytes_.size() || bytes_.size() - off < out.size()) return Status::Error(EIO, "short read");
    std::memcpy(out.data(), bytes_.data() + off, out.size());
    return Status::Ok();
  }
  void Prefetch(uint64_t, uint64_t) const override {}
  int Reads(uint64_t off) const {
    std::lock_guard lk(mu_);
    auto it = reads_.find(off);
    return it == reads_.end() ? 0 : it->second;
  }

 private:
  const Bytes bytes_;
  mutable std::mutex mu_;
  mutable std::map<uint64_t, int> reads_;
  mutable std::set<uint64_t> fail_once_;
};

constexpr size_t kLen = 1000;

TEST(ChunkReadAheadTest, TakesWhatWasReadAheadOnce) {
  const Bytes all = test::RandomBytes(10 * kLen, 1);
  CountingBytes src(all);
  ChunkReadAhead ahead(&src, 10);
  ahead.Start(3, 3 * kLen, kLen);
  ahead.Start(3, 3 * kLen, kLen);  // started already: no second read
  Bytes out(kLen);
  ASSERT_TRUE(ahead.TakeInto(3, out));
  EXPECT_EQ(out, Bytes(all.begin() + 3 * kLen, all.begin() + 4 * kLen));
  EXPECT_EQ(src.Reads(3 * kLen), 1);
  EXPECT_FALSE(ahead.TakeInto(3, out));  // taken: read it yourself
  ahead.Start(3, 3 * kLen, kLen);        // and never again ahead
  EXPECT_FALSE(ahead.TakeInto(3, out));
  EXPECT_EQ(src.Reads(3 * kLen), 1);
}

TEST(ChunkReadAheadTest, ChunkAlreadyReadIsNotReadAhead) {
  CountingBytes src(test::RandomBytes(10 * kLen, 2));
  ChunkReadAhead ahead(&src, 10);
  Bytes out(kLen);
  EXPECT_FALSE(ahead.TakeInto(5, out));  // the reader reads chunk 5 itself
  ahead.Start(5, 5 * kLen, kLen);
  EXPECT_EQ(src.Reads(5 * kLen), 0);
  ahead.Start(10, 10 * kLen, kLen);  // out of range
  EXPECT_EQ(src.Reads(10 * kLen), 0);
}

TEST(ChunkReadAheadTest, HoldsAtMostMaxHeld) {
  CountingBytes src(test::RandomBytes(40 * kLen, 3));
  ChunkReadAhead ahead(&src, 40);
  const uint64_t tried = ChunkReadAhead::kMaxHeld + 2;
  for (uint64_t i = 0; i < tried; ++i) ahead.Start(i, i * kLen, kLen);
  Bytes out(kLen);
  for (uint64_t i = 0; i < tried; ++i) {
    EXPECT_EQ(ahead.TakeInto(i, out), i < ChunkReadAhead::kMaxHeld) << i;
    EXPECT_EQ(src.Reads(i * kLen), i < ChunkReadAhead::kMaxHeld ? 1 : 0) << i;
  }
}

// Chunk 0's read is never taken (a dedup hit needed no base): a reader far
// past it drops it, which makes room for another.
TEST(ChunkReadAheadTest, DropsReadsThatReadersWentFarPast) {
  CountingBytes src(test::RandomBytes(40 * kLen, 3));
  ChunkReadAhead ahead(&src, 40);
  ahead.Start(0, 0, kLen);
  ahead.Start(1, kLen, kLen);
  Bytes out(kLen);
  const uint64_t far = ChunkReadAhead::kStale + 1;  // past 0 by more than kStale, not past 1
  EXPECT_FALSE(ahead.TakeInto(far, out));
  const uint64_t more = ChunkReadAhead::kMaxHeld - 1;  // chunk 1 still holds a place
  for (uint64_t i = 1; i <= more; ++i) ahead.Start(far + i, (far + i) * kLen, kLen);
  for (uint64_t i = 1; i <= more; ++i) EXPECT_TRUE(ahead.TakeInto(far + i, out)) << far + i;
  EXPECT_FALSE(ahead.TakeInto(1, out));  // taking far + 1 dropped it in turn
}

TEST(ChunkReadAheadTest, FailedReadAheadLeavesTheReadToTheReader) {
  CountingBytes src(test::RandomBytes(10 * kLen, 4), {2 * kLen});
  ChunkReadAhead ahead(&src, 10);
  ahead.Start(2, 2 * kLen, kLen);
  Bytes out(kLen);
  EXPECT_FALSE(ahead.TakeInto(2, out));
  EXPECT_EQ(src.Reads(2 * kLen), 1);
}

// Through a pack: chunks read ahead decode to the file's bytes, each read
// once, and one whose read ahead failed is read again.
class PackReadAheadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = test::CompressibleBytes(6 * kChunk + 123, 5);
    test::WriteFileBytes(dir_.Sub("src"), file_);
    auto src = env_->OpenAt(AT_FDCWD, dir_.Sub("src"), O_RDONLY);
    auto dst = env_->OpenAt(AT_FDCWD, dir_.Sub("pack"), O_CREAT | O_TRUNC | O_RDWR, 0644);
    ASSERT_TRUE(src.ok() && dst.ok());
    ASSERT_OK(WritePack(env_, src->get(), file_.size(), dst->get(), kChunk, {}).status());
  }
  Bytes PackBytesOnDisk() { return test::ReadFileBytes(dir_.Sub("pack")); }

  static constexpr uint32_t kChunk = 64 << 10;
  test::TempDir dir_;
  Env* env_ = Env::Default();
  Bytes file_;
};

TEST_F(PackReadAheadTest, ChunksReadAheadDecodeToTheFile) {
  auto plain = PackReader::Open(std::make_unique<CountingBytes>(PackBytesOnDisk()), "plain");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  std::vector<uint64_t> fail;
  for (size_t i = 1; i < (*plain)->chunks().size(); ++i) fail.push_back((*plain)->chunks()[i].offset);
  // The first read of every chunk after the first fails: its read ahead
  // does, and the reader's own read then succeeds.
  for (bool failing : {false, true}) {
    auto src = std::make_unique<CountingBytes>(PackBytesOnDisk(), failing ? fail : std::vector<uint64_t>{});
    CountingBytes* counts = src.get();
    auto r = PackReader::Open(std::move(src), "pack");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    Bytes back, chunk;
    for (uint64_t i = 0; i < (*r)->chunks().size(); ++i) {
      (*r)->ReadAhead(i + 1);
      (*r)->ReadAhead(i + 2);
      ASSERT_OK((*r)->ReadChunk(i, &chunk));
      back.insert(back.end(), chunk.begin(), chunk.end());
    }
    EXPECT_EQ(back, file_) << failing;
    for (uint64_t i = 1; i < (*r)->chunks().size(); ++i) {
      EXPECT_EQ(counts->Reads((*r)->chunks()[i].offset), failing ? 2 : 1) << "chunk " << i;
    }
  }
}

}  // namespace
}  // namespace ckptfs
