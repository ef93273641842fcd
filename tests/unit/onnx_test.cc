// ONNX models: raw_data initializers found in the protobuf without
// libprotobuf. Real models written by onnx.save live in tests/data/onnx
// (gen.py there regenerates them). Malformed input never fails the layout:
// it is "unknown" (generic), or at worst ONNX with fewer regions.
#include "codec/formats/onnx.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "codec/formats/layout.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using Bytes = std::vector<uint8_t>;

std::string DataDir() {
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / "onnx").string();
}

FileLayout Detect(const Bytes& b) { return DetectLayout(SpanSource(b)); }

TEST(OnnxTest, RealModelWithRawData) {
  Bytes b = test::ReadFileBytes(DataDir() + "/model.onnx");
  ASSERT_FALSE(b.empty());
  FileLayout l = Detect(b);
  ASSERT_EQ(l.format, "onnx") << l.note;
  EXPECT_FALSE(l.lossy_allowed);
  EXPECT_EQ(l.note, "5 initializers; 1 without raw_data here (external or typed fields)");
  ASSERT_EQ(l.tensors.size(), 4u);
  EXPECT_EQ(l.tensors[0].name, "w");
  EXPECT_EQ(l.tensors[0].dtype, DType::kF32);
  EXPECT_EQ(l.tensors[0].shape, (std::vector<uint64_t>{8, 4}));
  ASSERT_EQ(l.tensors[0].length, 128u);
  for (int k = 0; k < 32; ++k) {
    float f;
    std::memcpy(&f, b.data() + l.tensors[0].offset + 4 * k, 4);
    EXPECT_EQ(f, float(k) / 7) << k;
  }
  EXPECT_EQ(l.tensors[1].dtype, DType::kF16);
  EXPECT_EQ(l.tensors[2].dtype, DType::kI64);
  EXPECT_EQ(l.tensors[3].dtype, DType::kBF16);
  EXPECT_EQ(l.tensors[3].label, "bf");
  test::ExpectRegionsInOrder(l, b.size());
}

TEST(OnnxTest, ExternalDataModelHasNoRegions) {
  Bytes b = test::ReadFileBytes(DataDir() + "/ext.onnx");
  FileLayout l = Detect(b);
  ASSERT_EQ(l.format, "onnx") << l.note;
  EXPECT_TRUE(l.tensors.empty());
  EXPECT_EQ(l.note, "5 initializers; 5 without raw_data here (external or typed fields)");
  // The external data file has no header: by content alone it is unknown.
  EXPECT_EQ(Detect(test::ReadFileBytes(DataDir() + "/ext.onnx.data")).format, "unknown");
}

// Every prefix and thousands of bit flips: never a crash, never a region
// outside the file; a prefix is never taken for the whole model.
TEST(OnnxTest, TruncationsAndFlipsFallBackToGeneric) {
  Bytes b = test::ReadFileBytes(DataDir() + "/model.onnx");
  for (size_t n = 0; n < b.size(); ++n) {
    Bytes pre(b.begin(), b.begin() + n);
    FileLayout l = Detect(pre);
    if (l.format == "onnx") {
      // Only a cut between top-level fields leaves a valid ModelProto.
      test::ExpectRegionsInOrder(l, pre.size());
    }
  }
  std::mt19937_64 rng(11);
  for (int i = 0; i < 5000; ++i) {
    Bytes f = b;
    f[rng() % f.size()] ^= uint8_t(1u << (rng() % 8));
    FileLayout l = Detect(f);
    test::ExpectRegionsInOrder(l, f.size());
    EXPECT_TRUE(l.format == "onnx" || l.format == "unknown") << l.format;
  }
}

TEST(OnnxTest, ProbeIsStrict) {
  // Starts like a ModelProto (ir_version 7) but has no graph.
  EXPECT_EQ(Detect(Bytes{0x08, 0x07, 0x12, 0x02, 'h', 'i', 0x20, 0x01}).format, "unknown");
  // A field ModelProto does not have.
  EXPECT_EQ(Detect(Bytes{0x08, 0x07, 0x3a, 0x00, 0x48, 0x01, 0, 0}).format, "unknown");
  // The smallest model: ir_version and an empty graph.
  FileLayout l = Detect(Bytes{0x08, 0x07, 0x3a, 0x00, 0x22, 0x02, 'a', 'b'});
  EXPECT_EQ(l.format, "onnx") << l.note;
  EXPECT_TRUE(l.tensors.empty());
  // A length running past the end.
  EXPECT_EQ(Detect(Bytes{0x08, 0x07, 0x3a, 0x7f, 0, 0, 0, 0}).format, "unknown");
  // Not ir_version first.
  EXPECT_FALSE(formats::LooksLikeOnnx(Bytes{0x10, 0x07}));
  EXPECT_FALSE(formats::LooksLikeOnnx(Bytes{0x08, 0x00}));
}

// raw_data whose size disagrees with dtype and dims is kept as metadata.
TEST(OnnxTest, SizeMismatchIsMetadata) {
  // TensorProto{dims: 4, data_type: FLOAT, name: "t", raw_data: 8 bytes}
  Bytes tensor = {0x08, 0x04, 0x10, 0x01, 0x42, 0x01, 't', 0x4a, 0x08, 1, 2, 3, 4, 5, 6, 7, 8};
  Bytes graph = {0x2a, uint8_t(tensor.size())};
  graph.insert(graph.end(), tensor.begin(), tensor.end());
  Bytes model = {0x08, 0x07, 0x3a, uint8_t(graph.size())};
  model.insert(model.end(), graph.begin(), graph.end());
  FileLayout l = Detect(model);
  ASSERT_EQ(l.format, "onnx") << l.note;
  EXPECT_TRUE(l.tensors.empty());
  EXPECT_NE(l.note.find("1 of unknown dtype or a size that disagrees"), std::string::npos) << l.note;
  // With dims 2 the 8 bytes are two floats.
  model[4 + 2 + 1] = 0x02;
  l = Detect(model);
  ASSERT_EQ(l.tensors.size(), 1u) << l.note;
  EXPECT_EQ(l.tensors[0].length, 8u);
  EXPECT_EQ(l.tensors[0].shape, (std::vector<uint64_t>{2}));
}

}  // namespace
}  // namespace ckptfs
