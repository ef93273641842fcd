// HDF5 files (h5py, Keras 3 .weights.h5 and .keras): dataset regions found
// by walking the file's own structures. The fixtures in tests/data/hdf5 are
// written by h5py and keras (gen.py there), and expected.json holds each
// dataset's data extents as h5py itself reports them (get_offset,
// get_chunk_info): the parser must find exactly those, less the datasets
// it leaves to the generic path (filtered, non-numeric, extensible array).
#include "codec/formats/hdf5.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <tuple>

#include "codec/formats/layout.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using Bytes = std::vector<uint8_t>;
using Extent = std::tuple<std::string, uint64_t, uint64_t>;  // label, offset, length

std::string DataDir() {
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / "hdf5").string();
}

nlohmann::json Expected() {
  std::ifstream in(DataDir() + "/expected.json");
  return nlohmann::json::parse(in);
}

// What h5py reports, less what the parser leaves to the generic path, with
// a dataset's chunks that lie back to back joined into one region.
std::vector<Extent> ExpectedExtents(const std::string& file) {
  static const std::set<std::string> kLeftGeneric = {"/flags", "/text", "/ea"};
  std::vector<Extent> out;
  const nlohmann::json all = Expected();
  for (const auto& r : all.at(file)) {
    if (r.value("filtered", false) || kLeftGeneric.count(r["name"])) continue;
    const std::string name = r["name"];
    const uint64_t offset = r["offset"], length = r["length"];
    if (!out.empty()) {
      auto& [last_name, last_offset, last_length] = out.back();
      if (last_name == name && last_offset + last_length == offset) {
        last_length += length;
        continue;
      }
    }
    out.emplace_back(name, offset, length);
  }
  return out;
}

std::vector<Extent> Found(const FileLayout& l) {
  std::vector<Extent> out;
  for (const auto& t : l.tensors) out.emplace_back(t.label, t.offset, t.length);
  return out;
}

class Hdf5Files : public ::testing::TestWithParam<std::string> {};

TEST_P(Hdf5Files, RegionsAreTheExtentsH5pyReports) {
  Bytes b = test::ReadFileBytes(DataDir() + "/" + GetParam());
  ASSERT_FALSE(b.empty());
  FileLayout l = DetectLayout(SpanSource(b));
  ASSERT_EQ(l.format, GetParam() == "m.keras" ? "keras" : "hdf5") << l.note;
  EXPECT_FALSE(l.lossy_allowed);
  const std::vector<Extent> want = ExpectedExtents(GetParam());
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(Found(l), want) << l.note;
  test::ExpectRegionsInOrder(l, b.size());
}

INSTANTIATE_TEST_SUITE_P(RealFiles, Hdf5Files,
                         ::testing::Values("plain.h5", "latest.h5", "userblock.h5", "dense.h5", "w.weights.h5",
                                           "m.keras"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return s;
                         });

TEST(Hdf5Test, TypesShapesAndBytesOfTheOldStyleFile) {
  Bytes b = test::ReadFileBytes(DataDir() + "/plain.h5");
  FileLayout l = DetectLayout(SpanSource(b));
  // /k's 9 chunks of 4x8: the first 7 lie back to back and are one region.
  EXPECT_EQ(l.note, "7 datasets, 5 regions; 1 filtered datasets kept as metadata; 2 datasets of another type");
  std::map<std::string, const TensorRegion*> first;
  for (const auto& t : l.tensors) first.emplace(t.label, &t);
  ASSERT_EQ(first.count("/c"), 1u);
  const TensorRegion& c = *first["/c"];
  EXPECT_EQ(c.dtype, DType::kF32);
  EXPECT_EQ(c.shape, (std::vector<uint64_t>{64}));
  for (int k = 0; k < 64; ++k) {
    float f;
    std::memcpy(&f, b.data() + c.offset + 4 * k, 4);
    EXPECT_EQ(f, float(k) / 3) << k;
  }
  EXPECT_EQ(first["/k"]->dtype, DType::kF64);
  EXPECT_EQ(first["/k"]->shape, (std::vector<uint64_t>{28, 8}));  // 7 chunks, rows of a chunk
  EXPECT_EQ(first["/k"]->name, "/k[0,0]");
  EXPECT_EQ(first["/sub/h"]->dtype, DType::kF16);
  EXPECT_EQ(first["/sub/deeper/i"]->dtype, DType::kI64);
}

TEST(Hdf5Test, NewStyleFileNotesTheChunkIndexItLeaves) {
  Bytes b = test::ReadFileBytes(DataDir() + "/latest.h5");
  FileLayout l = DetectLayout(SpanSource(b));
  EXPECT_EQ(l.note, "5 datasets, 4 regions; 1 datasets of another layout or chunk index");
}

// Groups past 8 links under libver="latest", and track_order groups, keep
// their links in a fractal heap; one was deleted after being written.
TEST(Hdf5Test, DenseGroupsAreFollowed) {
  Bytes b = test::ReadFileBytes(DataDir() + "/dense.h5");
  FileLayout l = DetectLayout(SpanSource(b));
  EXPECT_EQ(l.note, "51 datasets, 51 regions");
  std::set<std::string> labels;
  for (const auto& t : l.tensors) labels.insert(t.label);
  EXPECT_EQ(labels.count("/many/d39"), 1u);
  EXPECT_EQ(labels.count("/many/d7"), 0u);
  EXPECT_EQ(labels.count("/ordered/x11"), 1u);
}

TEST(Hdf5Test, KerasZipCarriesTheMemberCrc) {
  Bytes b = test::ReadFileBytes(DataDir() + "/m.keras");
  FileLayout l = DetectLayout(SpanSource(b));
  ASSERT_EQ(l.format, "keras");
  ASSERT_EQ(l.zip_crcs.size(), 1u);  // model.weights.h5
  EXPECT_EQ(l.tensors[0].label, "/layers/dense/vars/0");
  EXPECT_EQ(l.tensors[0].dtype, DType::kF32);
  EXPECT_EQ(l.tensors[0].shape, (std::vector<uint64_t>{6, 5}));
}

// Cut anywhere or with bytes changed, a file is never an error: it is
// unknown, or HDF5 with regions that are still inside it and in order.
TEST(Hdf5Test, TruncatedOrCorruptedFilesStayBounded) {
  for (const char* name : {"plain.h5", "latest.h5", "dense.h5", "w.weights.h5"}) {
    const Bytes b = test::ReadFileBytes(DataDir() + "/" + name);
    for (size_t n = 0; n < b.size(); n += 97) {
      Bytes cut(b.begin(), b.begin() + n);
      FileLayout l = DetectLayout(SpanSource(cut));
      test::ExpectRegionsInOrder(l, cut.size());
    }
    std::mt19937_64 rng(7);
    for (int i = 0; i < 300; ++i) {
      Bytes bad = b;
      for (int k = 0; k < 4; ++k) bad[rng() % std::min<size_t>(bad.size(), 4096)] = static_cast<uint8_t>(rng());
      FileLayout l = DetectLayout(SpanSource(bad));
      test::ExpectRegionsInOrder(l, bad.size());
    }
  }
}

TEST(Hdf5Test, SignatureOnlyAtUserBlockBoundaries) {
  Bytes b = test::ReadFileBytes(DataDir() + "/userblock.h5");
  EXPECT_EQ(formats::FindHdf5Superblock(SpanSource(b)), std::optional<uint64_t>(512));
  Bytes shifted(100, 0);
  shifted.insert(shifted.end(), b.begin() + 512, b.end());
  EXPECT_EQ(formats::FindHdf5Superblock(SpanSource(shifted)), std::nullopt);
  EXPECT_EQ(DetectLayout(SpanSource(shifted)).format, "unknown");
}

}  // namespace
}  // namespace ckptfs
