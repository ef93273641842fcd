// Identical input, identical reconstruction (store/same_input.h): the
// input digest, the meta block's input section, and finding a pack sealed
// from the same input in the index.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <string>
#include <vector>

#include "base/hash.h"
#include "base/le.h"
#include "base/sync_point.h"
#include "store/pack_index.h"
#include "store/pack_meta.h"
#include "store/same_input.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

class VectorSource : public ByteSource {
 public:
  explicit VectorSource(std::vector<uint8_t> b) : b_(std::move(b)) {}
  uint64_t size() const override { return b_.size(); }
  Status ReadAt(uint64_t off, std::span<uint8_t> out) const override {
    if (off > b_.size() || b_.size() - off < out.size()) return Status::Error(EIO, "past the end");
    std::memcpy(out.data(), b_.data() + off, out.size());
    return Status::Ok();
  }

 private:
  std::vector<uint8_t> b_;
};

TEST(SameInputDigest, CoversThePolicyAndEveryByteReadInPieces) {
  // Bigger than one read piece (1 MiB), and not a multiple of it.
  const std::vector<uint8_t> bytes = test::RandomBytes((3u << 20) + 12345, 7);
  const VectorSource file(bytes);
  auto d = LossyInputDigest(file, "lossy");
  ASSERT_TRUE(d.ok()) << d.status().message();
  // What the format says it is: XXH3-128 of the domain and policy texts,
  // each ended by a NUL, then the file's bytes, in one go.
  std::string prefix = std::string("ckptfs lossy input 1") + '\0' + "lossy" + '\0';
  std::vector<uint8_t> whole(prefix.begin(), prefix.end());
  whole.insert(whole.end(), bytes.begin(), bytes.end());
  const XXH128_hash_t want = XXH3_128bits(whole.data(), whole.size());
  EXPECT_EQ(*d, (Digest128{want.low64, want.high64}));
  EXPECT_EQ(*LossyInputDigest(VectorSource(bytes), "lossy"), *d);
  EXPECT_NE(*LossyInputDigest(file, "lossy=steps:3"), *d);
  std::vector<uint8_t> other = bytes;
  other[(2u << 20) + 1] ^= 1;
  EXPECT_NE(*LossyInputDigest(VectorSource(other), "lossy"), *d);
  EXPECT_NE(*LossyInputDigest(VectorSource({}), "lossy"), *d);
}

PackMeta Meta(std::optional<InputDigest> input, bool lossy = true) {
  PackMeta m;
  m.sealed_ns = 5;
  m.chunk_hash = {11, 12};
  m.chunk_depth = {0, 1};
  if (lossy) m.lossy = LossyInfo{};
  m.input = input;
  return m;
}

TEST(SameInputMeta, InputSectionRoundTripsBesideTheLossySection) {
  const InputDigest in{{0x1122334455667788ull, 0x99aabbccddeeff00ull}, 42};
  for (bool lossy : {true, false}) {
    auto m = DecodePackMeta(EncodePackMeta(Meta(in, lossy)), 2);
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->lossy.has_value(), lossy);
    ASSERT_TRUE(m->input);
    EXPECT_EQ(*m->input, in);
  }
  // Packs from before the section: none, and the lossy section still reads.
  auto old = DecodePackMeta(EncodePackMeta(Meta(std::nullopt)), 2);
  ASSERT_TRUE(old.ok()) << old.status().message();
  EXPECT_TRUE(old->lossy && !old->input);
  // An unknown section version is corruption, not a guess.
  std::vector<uint8_t> bad = EncodePackMeta(Meta(in));
  le::Put32(bad, bad.size() - 8 - 32 + 4, 2);
  le::Put64(bad, bad.size() - 8, Checksum64(std::span(bad).first(bad.size() - 8), kSeedMeta));
  auto b = DecodePackMeta(bad, 2);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("input section"), std::string::npos) << b.status().message();
}

TEST(SameInputIndex, FindsALivePackOfTheSameInputAndSizePinned) {
  const Digest128 d{1, 2}, other{1, 3};
  PackIndex index;
  index.Add(10, Meta(InputDigest{d, 0}), 1000, 256);
  index.AddRoot(10);
  EXPECT_FALSE(index.FindSameInput(other, 1000));
  EXPECT_FALSE(index.FindSameInput(d, 999));
  auto found = index.FindSameInput(d, 1000);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->pack, 10u);
  EXPECT_EQ(found->chunk_size, 256u);
  EXPECT_TRUE(found->lossy);
  // The copy (all refs to pack 10) is indexed; its file and the original's
  // are deleted: the pin keeps 10, then the copy's reference does.
  PackMeta copy = Meta(InputDigest{d, 10});
  copy.bases = {10};
  index.Add(20, copy, 1000, 256);
  index.AddRoot(20);
  EXPECT_TRUE(index.DropRoot(10).empty());
  EXPECT_TRUE(index.Unpin(10).empty()) << "the copy still refers to pack 10";
  // Found still, as the original, not the copy that refers to it.
  found = index.FindSameInput(d, 1000);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->pack, 10u);
  EXPECT_TRUE(index.Unpin(10).empty());
  const std::vector<ObjectId> dead = index.DropRoot(20);
  EXPECT_EQ(dead, (std::vector<ObjectId>{20, 10}));
  EXPECT_FALSE(index.FindSameInput(d, 1000));
}

TEST(SameInputIndex, APackNoFileOrPackHoldsIsNotFound) {
  // Published, not yet named by its stub (or on its way out): pinning and
  // unpinning it would delete it under its file.
  PackIndex index;
  index.Add(10, Meta(InputDigest{{1, 2}, 0}), 1000, 256);
  EXPECT_FALSE(index.FindSameInput({1, 2}, 1000));
  index.AddRoot(10);
  EXPECT_TRUE(index.FindSameInput({1, 2}, 1000));
}

TEST(SameInputSeals, ASecondSealOfTheSameInputWaitsForTheFirst) {
  if (!SyncPoint::kCompiledIn) GTEST_SKIP() << "built with -DCKPTFS_SYNC_POINTS=OFF";
  SameInputSeals seals;
  auto first = seals.Acquire({1, 2}, nullptr);
  ASSERT_TRUE(first.ok());
  auto other = seals.Acquire({1, 3}, nullptr);  // another input: no wait
  ASSERT_TRUE(other.ok());
  std::atomic<bool> second_held{false};
  std::atomic<bool> released{false};
  {
    // The first is released only once the second is waiting for it.
    ScopedSyncPoints points({{"SameInputSeals::Acquire:Waiting", "SameInputSealsTest:Release"}});
    std::thread t([&] {
      auto second = seals.Acquire({1, 2}, nullptr);
      EXPECT_TRUE(second.ok());
      EXPECT_TRUE(released.load()) << "held while the first seal still held it";
      second_held = true;
    });
    CKPTFS_SYNC_POINT("SameInputSealsTest:Release");
    EXPECT_FALSE(second_held.load());
    released = true;  // the waiter may only see it from here on
    first->reset();
    t.join();
  }
  EXPECT_TRUE(second_held.load());
  // A waiter whose seal is cancelled stops waiting.
  auto held = seals.Acquire({5, 6}, nullptr);
  ASSERT_TRUE(held.ok());
  std::atomic<bool> cancel{true};
  auto cancelled = seals.Acquire({5, 6}, &cancel);
  ASSERT_FALSE(cancelled.ok());
  EXPECT_EQ(cancelled.status().code(), ECANCELED);
}

}  // namespace
}  // namespace ckptfs
