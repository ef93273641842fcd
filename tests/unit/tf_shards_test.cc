// The store's side of TF data shards (seal/tf_shards.h): the .index is
// found among the file's siblings and tied to it by content; a file named
// like a shard waits for an index written after it.
#include "seal/tf_shards.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "codec/formats/tf_bundle.h"
#include "tests/unit/mem_siblings.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using Bytes = std::vector<uint8_t>;

std::string DataDir() {
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / "tf_bundle").string();
}

using test::MemSiblings;

struct RealBundle {
  Bytes index = test::ReadFileBytes(DataDir() + "/single/ckpt-1.index");
  Bytes data = test::ReadFileBytes(DataDir() + "/single/ckpt-1.data-00000-of-00001");
};

TEST(TfShardsTest, IndexAmongSiblingsGivesTheLayout) {
  RealBundle b;
  MemSiblings sib("ckpt-1.data-00000-of-00001");
  sib.Put("checkpoint", Bytes(100, 'c'));
  sib.Put("other.index", Bytes(64, 0));  // no footer
  sib.Put("ckpt-1.index", b.index);
  auto l = TfDataLayoutFromSiblings(SpanSource(b.data), sib, std::chrono::milliseconds(0));
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->format, "tf-bundle-data");
  EXPECT_FALSE(l->lossy_allowed);
  EXPECT_EQ(l->tensors.size(), 13u);
}

TEST(TfShardsTest, WaitsForAnIndexWrittenAfterTheData) {
  RealBundle b;
  MemSiblings sib("part-00000-of-00001.data-00000-of-00001.tempstate42");
  std::thread writer([&] {
    sib.WaitForRounds(2);
    sib.Put("part-00000-of-00001.index", b.index);
  });
  auto l = TfDataLayoutFromSiblings(SpanSource(b.data), sib, std::chrono::seconds(30));
  writer.join();
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->format, "tf-bundle-data");
}

TEST(TfShardsTest, NoMatchingIndexStaysGeneric) {
  RealBundle b;
  // A shard name with no index: gives up after the wait, not before.
  MemSiblings named("ckpt-9.data-00000-of-00001");
  named.Put("ckpt-9.index", Bytes(b.index.begin(), b.index.end() - 1));  // truncated: not an index
  const auto started = std::chrono::steady_clock::now();
  EXPECT_FALSE(TfDataLayoutFromSiblings(SpanSource(b.data), named, std::chrono::milliseconds(120)).has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(120));
  EXPECT_GE(named.rounds, 1);
  // An index of another bundle does not describe the file.
  Bytes other = b.data;
  auto idx = formats::ReadTfBundleIndex(SpanSource(b.index));
  ASSERT_TRUE(idx.ok());
  for (const formats::TfBundleEntry& e : idx->entries) {
    if (e.name.starts_with("f32/")) other[e.offset] ^= 0xff;  // a checked entry (strings are not)
  }
  MemSiblings mismatch("ckpt-1.data-00000-of-00001");
  mismatch.Put("ckpt-1.index", b.index);
  EXPECT_FALSE(TfDataLayoutFromSiblings(SpanSource(other), mismatch, std::chrono::milliseconds(0)).has_value());
  // A small file not named like a shard is not looked up at all.
  MemSiblings unnamed("blob.bin");
  unnamed.Put("ckpt-1.index", b.index);
  EXPECT_FALSE(TfDataLayoutFromSiblings(SpanSource(b.data), unnamed, std::chrono::seconds(30)).has_value());
  EXPECT_EQ(unnamed.rounds, 0);
}

}  // namespace
}  // namespace ckptfs
