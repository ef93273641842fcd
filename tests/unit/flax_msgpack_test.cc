// Flax msgpack (flax.serialization.to_bytes): ndarray ext values found in
// the msgpack tree. The real file in tests/data/flax comes from flax and
// optax (gen.py there). Malformed input never fails the layout: it is
// "unknown" (generic), or flax-msgpack with its regions inside the file.
#include "codec/formats/msgpack.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "codec/formats/layout.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using Bytes = std::vector<uint8_t>;

Bytes StateFile() {
  return test::ReadFileBytes(
      (std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / "flax" / "state.msgpack").string());
}

FileLayout Detect(const Bytes& b) { return DetectLayout(SpanSource(b)); }

TEST(FlaxMsgpackTest, RealStateWithOptaxAdam) {
  Bytes b = StateFile();
  ASSERT_FALSE(b.empty());
  FileLayout l = Detect(b);
  ASSERT_EQ(l.format, "flax-msgpack") << l.note;
  EXPECT_TRUE(l.lossy_allowed);
  EXPECT_EQ(l.note, "13 ndarrays");
  ASSERT_EQ(l.tensors.size(), 13u);
  const TensorRegion& k = l.tensors[0];
  EXPECT_EQ(k.label, "params.Dense_0.kernel");
  EXPECT_EQ(k.dtype, DType::kF32);
  EXPECT_EQ(k.shape, (std::vector<uint64_t>{8, 4}));
  for (int i = 0; i < 32; ++i) {
    float f;
    std::memcpy(&f, b.data() + k.offset + 4 * i, 4);
    EXPECT_EQ(f, float(i) / 7) << i;
  }
  EXPECT_EQ(l.tensors[2].dtype, DType::kBF16);
  EXPECT_EQ(l.tensors[3].dtype, DType::kF16);
  EXPECT_EQ(l.tensors[4].label, "opt_state.0.count");
  EXPECT_EQ(l.tensors[4].dtype, DType::kI32);
  EXPECT_EQ(l.tensors[12].label, "opt_state.0.nu.half");
  test::ExpectRegionsInOrder(l, b.size());
}

TEST(FlaxMsgpackTest, TruncationsAndFlipsFallBackToGeneric) {
  Bytes b = StateFile();
  for (size_t n = 0; n < b.size(); ++n) {
    Bytes pre(b.begin(), b.begin() + n);
    EXPECT_NE(Detect(pre).format, "flax-msgpack") << n;  // a prefix never parses to its last byte
  }
  Bytes longer = b;
  longer.push_back(0xc0);
  EXPECT_EQ(Detect(longer).format, "unknown");
  std::mt19937_64 rng(13);
  for (int i = 0; i < 5000; ++i) {
    Bytes f = b;
    f[rng() % f.size()] ^= uint8_t(1u << (rng() % 8));
    FileLayout l = Detect(f);
    test::ExpectRegionsInOrder(l, f.size());
  }
}

TEST(FlaxMsgpackTest, OnlyMapsWithNdarrays) {
  // {"a": 1}: msgpack, but holds no array.
  EXPECT_EQ(Detect(Bytes{0x81, 0xa1, 'a', 0x01, 0, 0, 0, 0}).format, "unknown");
  // {"a": ext1(shape (2,), "float32", 8 bytes)}
  Bytes ok = {0x81, 0xa1, 'a', 0xc7, 21, 0x01, 0x93, 0x91, 0x02, 0xa7, 'f', 'l', 'o', 'a', 't', '3', '2', 0xc4, 8};
  for (int i = 0; i < 8; ++i) ok.push_back(uint8_t(i));
  FileLayout l = Detect(ok);
  ASSERT_EQ(l.format, "flax-msgpack") << l.note;
  ASSERT_EQ(l.tensors.size(), 1u);
  EXPECT_EQ(l.tensors[0].offset, ok.size() - 8);
  EXPECT_EQ(l.tensors[0].label, "a");
  // The same with shape (3,): the size disagrees, the array stays metadata.
  Bytes bad = ok;
  bad[8] = 0x03;
  l = Detect(bad);
  ASSERT_EQ(l.format, "flax-msgpack");
  EXPECT_TRUE(l.tensors.empty());
  EXPECT_EQ(l.note, "1 ndarrays; 1 kept as metadata");
  // Nesting past the limit: unknown, not a stack overflow.
  Bytes deep;
  for (int i = 0; i < 100000; ++i) deep.insert(deep.end(), {0x81, 0xa1, 'k'});
  deep.push_back(0xc0);
  EXPECT_EQ(Detect(deep).format, "unknown");
  EXPECT_EQ(formats::NumpyNameToDType("bfloat16"), DType::kBF16);
  EXPECT_EQ(formats::NumpyNameToDType("object"), DType::kUnknown);
}

}  // namespace
}  // namespace ckptfs
