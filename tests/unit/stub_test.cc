#include "store/stub.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <array>
#include <cstring>

#include "base/env.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using test::TempDir;

class StubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto fd = env_->OpenAt(AT_FDCWD, dir_.Sub("stub"), O_CREAT | O_RDWR, 0644);
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    fd_ = std::move(fd).value();
  }
  void FlipByte(uint64_t off, uint8_t mask = 0x01) {
    uint8_t b = 0;
    ASSERT_EQ(::pread(fd_.get(), &b, 1, static_cast<off_t>(off)), 1);
    b ^= mask;
    ASSERT_EQ(::pwrite(fd_.get(), &b, 1, static_cast<off_t>(off)), 1);
  }

  Env* env_ = Env::Default();
  TempDir dir_;
  UniqueFd fd_;
};

TEST(StubSlotTest, EncodeDecodeRoundTrip) {
  StubRecord rec{.gen = 7, .state = StubState::kStaged, .size = 123456789, .object = 0xdeadbeefcafe};
  std::array<uint8_t, kStubSlotSize> slot;
  EncodeStubSlot(rec, slot);
  EXPECT_EQ(std::memcmp(slot.data(), "CKST", 4), 0);
  EXPECT_EQ(slot[4], 1);  // version, little-endian
  EXPECT_EQ(slot[5], 0);
  EXPECT_EQ(slot[6], static_cast<uint8_t>(StubState::kStaged));
  EXPECT_EQ(slot[8], 7);  // gen, little-endian
  Result<StubRecord> back = DecodeStubSlot(slot);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, rec);
}

TEST(StubSlotTest, EveryBitFlipIsDetected) {
  StubRecord rec{.gen = 3, .state = StubState::kSealed, .size = 4096, .object = 42};
  std::array<uint8_t, kStubSlotSize> slot;
  EncodeStubSlot(rec, slot);
  for (size_t bit = 0; bit < kStubSlotSize * 8; ++bit) {
    auto bad = slot;
    bad[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    EXPECT_FALSE(DecodeStubSlot(bad).ok()) << "bit " << bit;
  }
}

TEST(StubSlotTest, RejectsInconsistentRecords) {
  std::array<uint8_t, kStubSlotSize> slot;
  EncodeStubSlot({.gen = 1, .state = StubState::kStaged, .size = 5, .object = 0}, slot);
  EXPECT_FALSE(DecodeStubSlot(slot).ok());  // staged without a staging file
  EncodeStubSlot({.gen = 1, .state = StubState::kSealed, .size = 5, .object = 0}, slot);
  EXPECT_FALSE(DecodeStubSlot(slot).ok());  // non-empty without a pack
  EncodeStubSlot({.gen = 0, .state = StubState::kSealed, .size = 0, .object = 0}, slot);
  EXPECT_FALSE(DecodeStubSlot(slot).ok());  // gen 0 is never written
  EncodeStubSlot({.gen = 1, .state = StubState::kSealed, .size = 0, .object = 0}, slot);
  EXPECT_TRUE(DecodeStubSlot(slot).ok());  // empty file
}

TEST_F(StubTest, EmptyStubIsEmptySealedFile) {
  Result<StubRecord> rec = ReadStub(env_, fd_.get());
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(*rec, StubRecord{});
}

TEST_F(StubTest, WritesAlternateSlots) {
  StubRecord cur{};
  Result<StubRecord> r1 = WriteStub(env_, fd_.get(), cur, {.state = StubState::kStaged, .size = 10, .object = 5});
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->gen, 1u);
  struct stat st;
  ASSERT_EQ(::fstat(fd_.get(), &st), 0);
  EXPECT_EQ(st.st_size, 128);  // gen 1 lives in slot 1
  EXPECT_EQ(*ReadStub(env_, fd_.get()), *r1);

  Result<StubRecord> r2 = WriteStub(env_, fd_.get(), *r1, {.state = StubState::kSealed, .size = 10, .object = 9});
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->gen, 2u);
  EXPECT_EQ(*ReadStub(env_, fd_.get()), *r2);

  Result<StubRecord> r3 = WriteStub(env_, fd_.get(), *r2, {.state = StubState::kSealed, .size = 0, .object = 0});
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(*ReadStub(env_, fd_.get()), *r3);
}

TEST_F(StubTest, TornSlotFallsBackToOlderRecord) {
  Result<StubRecord> r1 = WriteStub(env_, fd_.get(), {}, {.state = StubState::kStaged, .size = 10, .object = 5});
  Result<StubRecord> r2 = WriteStub(env_, fd_.get(), *r1, {.state = StubState::kSealed, .size = 10, .object = 9});
  ASSERT_TRUE(r2.ok());
  // Damage the newer record (gen 2, slot 0) as a torn write would.
  FlipByte(20);
  Result<StubRecord> rec = ReadStub(env_, fd_.get());
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(*rec, *r1);

  // Now the older one too: nothing trustworthy is left.
  FlipByte(64 + 20);
  rec = ReadStub(env_, fd_.get());
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.status().code(), EIO);
  EXPECT_NE(rec.status().message().find("corruption"), std::string::npos);
  EXPECT_NE(rec.status().message().find("slot 0"), std::string::npos);
  EXPECT_NE(rec.status().message().find("slot 1"), std::string::npos);
}

TEST_F(StubTest, HalfWrittenSlotKeepsOldRecord) {
  Result<StubRecord> r1 = WriteStub(env_, fd_.get(), {}, {.state = StubState::kStaged, .size = 10, .object = 5});
  Result<StubRecord> r2 = WriteStub(env_, fd_.get(), *r1, {.state = StubState::kSealed, .size = 10, .object = 9});
  ASSERT_TRUE(r2.ok());
  // Gen 3 goes to slot 1; only its first half reaches the file.
  std::array<uint8_t, kStubSlotSize> slot;
  EncodeStubSlot({.gen = 3, .state = StubState::kSealed, .size = 0, .object = 0}, slot);
  ASSERT_EQ(::pwrite(fd_.get(), slot.data(), 32, 64), 32);
  EXPECT_EQ(*ReadStub(env_, fd_.get()), *r2);
}

TEST_F(StubTest, OddLengths) {
  // Zero-filled (extended but never written) reads as an empty file.
  ASSERT_EQ(::ftruncate(fd_.get(), 128), 0);
  EXPECT_EQ(*ReadStub(env_, fd_.get()), StubRecord{});
  // Too short to hold a slot.
  ASSERT_EQ(::ftruncate(fd_.get(), 10), 0);
  ASSERT_EQ(::pwrite(fd_.get(), "garbage", 7, 0), 7);
  EXPECT_FALSE(ReadStub(env_, fd_.get()).ok());
  // One slot is fine when it is valid.
  ASSERT_EQ(::ftruncate(fd_.get(), 0), 0);
  std::array<uint8_t, kStubSlotSize> slot;
  StubRecord rec{.gen = 2, .state = StubState::kSealed, .size = 0, .object = 0};
  EncodeStubSlot(rec, slot);
  ASSERT_EQ(::pwrite(fd_.get(), slot.data(), slot.size(), 0), 64);
  EXPECT_EQ(*ReadStub(env_, fd_.get()), rec);
}

TEST_F(StubTest, RecordInWrongSlotIsRejected) {
  std::array<uint8_t, kStubSlotSize> slot;
  EncodeStubSlot({.gen = 2, .state = StubState::kSealed, .size = 0, .object = 0}, slot);
  ASSERT_EQ(::pwrite(fd_.get(), slot.data(), slot.size(), 64), 64);  // gen 2 belongs in slot 0
  EXPECT_FALSE(ReadStub(env_, fd_.get()).ok());
}

}  // namespace
}  // namespace ckptfs
