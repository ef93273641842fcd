// ONNX external data files (seal/onnx_external.h, formats::OnnxExternalLayout):
// a headerless file gets its tensors from the sibling model that names it.
// tests/data/onnx/ext.onnx + ext.onnx.data come from onnx.save(...,
// save_as_external_data=True); model.onnx holds the same tensors as raw_data.
#include "seal/onnx_external.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "codec/formats/onnx.h"
#include "tests/unit/mem_siblings.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using Bytes = std::vector<uint8_t>;

std::string DataDir() {
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / "onnx").string();
}

using test::MemSiblings;

TEST(OnnxExternalTest, ModelNamesItsTensorsInTheDataFile) {
  const Bytes model = test::ReadFileBytes(DataDir() + "/ext.onnx");
  const Bytes data = test::ReadFileBytes(DataDir() + "/ext.onnx.data");
  const Bytes inline_model = test::ReadFileBytes(DataDir() + "/model.onnx");
  auto refs = formats::ReadOnnxExternalTensors(SpanSource(model));
  ASSERT_TRUE(refs.ok()) << refs.status().message();
  ASSERT_EQ(refs->size(), 4u);  // "typed" has float_data, which onnx.save keeps inline
  EXPECT_EQ((*refs)[0].location, "ext.onnx.data");
  auto l = formats::OnnxExternalLayout(*refs, "ext.onnx.data", data.size());
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->format, "onnx-external");
  EXPECT_FALSE(l->lossy_allowed);
  // Each region holds the bytes the inline model has as that tensor's raw_data.
  const FileLayout in = DetectLayout(SpanSource(inline_model));
  ASSERT_EQ(l->tensors.size(), in.tensors.size());
  for (size_t i = 0; i < in.tensors.size(); ++i) {
    const TensorRegion& e = l->tensors[i];
    const TensorRegion& r = in.tensors[i];
    EXPECT_EQ(e.name, r.name);
    EXPECT_EQ(e.dtype, r.dtype);
    EXPECT_EQ(e.shape, r.shape);
    ASSERT_EQ(e.length, r.length);
    EXPECT_TRUE(
        std::equal(data.begin() + e.offset, data.begin() + e.offset + e.length, inline_model.begin() + r.offset))
        << e.name;
  }
  test::ExpectRegionsInOrder(*l, data.size());
}

TEST(OnnxExternalTest, OtherNameOrShorterFileIsNotTheModels) {
  const Bytes model = test::ReadFileBytes(DataDir() + "/ext.onnx");
  const uint64_t size = test::ReadFileBytes(DataDir() + "/ext.onnx.data").size();
  auto refs = formats::ReadOnnxExternalTensors(SpanSource(model));
  ASSERT_TRUE(refs.ok());
  EXPECT_FALSE(formats::OnnxExternalLayout(*refs, "other.bin", size).has_value());
  EXPECT_FALSE(formats::OnnxExternalLayout(*refs, "", size).has_value());
  EXPECT_FALSE(formats::OnnxExternalLayout(*refs, "ext.onnx.data", size - 1).has_value());
  EXPECT_TRUE(formats::OnnxExternalLayout(*refs, "ext.onnx.data", size + 4096).has_value());
  // A model with only inline data names no external file.
  auto inline_refs = formats::ReadOnnxExternalTensors(SpanSource(test::ReadFileBytes(DataDir() + "/model.onnx")));
  ASSERT_TRUE(inline_refs.ok());
  EXPECT_TRUE(inline_refs->empty());
}

// The offset and length values are decimal strings; one that is not (a sign,
// a letter) leaves that tensor unparsed instead of guessing a range.
TEST(OnnxExternalTest, NonDecimalLengthMarksTheTensorInvalid) {
  const Bytes model = test::ReadFileBytes(DataDir() + "/ext.onnx");
  for (const char bad : {'x', '-', ' '}) {
    Bytes edited = model;
    const std::string key = "length";
    auto at = std::search(edited.begin(), edited.end(), key.begin(), key.end());
    ASSERT_NE(at, edited.end());
    // key, then the value field's tag (0x12) and length byte, then its digits.
    const auto digit = at + static_cast<std::ptrdiff_t>(key.size()) + 2;
    ASSERT_TRUE(*digit >= '0' && *digit <= '9');
    *digit = static_cast<uint8_t>(bad);
    auto refs = formats::ReadOnnxExternalTensors(SpanSource(edited));
    ASSERT_TRUE(refs.ok()) << refs.status().message();
    ASSERT_FALSE(refs->empty());
    EXPECT_FALSE((*refs)[0].valid) << bad;
    EXPECT_TRUE(refs->back().valid);
  }
}

TEST(OnnxExternalTest, SiblingModelGivesTheLayout) {
  const Bytes data = test::ReadFileBytes(DataDir() + "/ext.onnx.data");
  MemSiblings sib("ext.onnx.data");
  sib.Put("config.json", Bytes(100, '{'));
  sib.Put("ext.onnx", test::ReadFileBytes(DataDir() + "/ext.onnx"));
  auto l = OnnxExternalLayoutFromSiblings(SpanSource(data), sib, std::chrono::milliseconds(0));
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->tensors.size(), 4u);
  EXPECT_EQ(l->note, "from ext.onnx: 4 tensors of the model");
}

// onnx.save writes the data file, then the model: the data file's seal
// waits for the model to appear. The model comes once the seal has looked
// and found none (whatever the time that takes), so it is found by waiting.
TEST(OnnxExternalTest, DataFileWaitsForAModelWrittenAfterIt) {
  const Bytes data = test::ReadFileBytes(DataDir() + "/ext.onnx.data");
  MemSiblings sib("ext.onnx.data");
  std::thread later([&] {
    sib.WaitForRounds(1);
    sib.Put("ext.onnx", test::ReadFileBytes(DataDir() + "/ext.onnx"));
  });
  auto l = OnnxExternalLayoutFromSiblings(SpanSource(data), sib, std::chrono::seconds(30));
  later.join();
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->tensors.size(), 4u);
}

TEST(OnnxExternalTest, UnrelatedNamesDoNotWaitAndSmallOnesDoNotLook) {
  const Bytes data = test::ReadFileBytes(DataDir() + "/ext.onnx.data");
  MemSiblings named("ext.onnx.data");  // no model ever comes: gives up at the deadline, not before
  const auto started = std::chrono::steady_clock::now();
  EXPECT_FALSE(OnnxExternalLayoutFromSiblings(SpanSource(data), named, std::chrono::milliseconds(120)).has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(120));
  EXPECT_GE(named.rounds.load(), 1);
  MemSiblings unnamed("notes.txt");
  unnamed.Put("ext.onnx", test::ReadFileBytes(DataDir() + "/ext.onnx"));
  EXPECT_FALSE(OnnxExternalLayoutFromSiblings(SpanSource(data), unnamed, std::chrono::seconds(30)).has_value());
  EXPECT_EQ(unnamed.rounds.load(), 0);
  EXPECT_TRUE(LooksLikeOnnxDataName("model.onnx.data"));
  EXPECT_TRUE(LooksLikeOnnxDataName("model.onnx_data"));
  EXPECT_TRUE(LooksLikeOnnxDataName("model.data"));
  EXPECT_FALSE(LooksLikeOnnxDataName("weights.bin"));  // too common a name to make every .bin wait
  EXPECT_FALSE(LooksLikeOnnxDataName("config.json"));
}

}  // namespace
}  // namespace ckptfs
