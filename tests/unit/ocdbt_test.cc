// Orbax's OCDBT databases (codec/formats/ocdbt.h): the manifest, the B+tree
// and the zarr metadata give each data file's uncompressed chunks. The
// checkpoints in tests/data/orbax come from orbax-checkpoint (gen.py there):
// raw/ saved with use_compression=False, zstd/ with Orbax's default.
#include "codec/formats/ocdbt.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "store/ocdbt_data.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

fs::path DataDir(const std::string& which) { return fs::path(__FILE__).parent_path().parent_path() / "data" / "orbax" / which; }

// A database's files in memory, opened by path from its root.
struct Db {
  std::map<std::string, std::shared_ptr<Bytes>> files;
  explicit Db(const std::string& which) {
    for (const auto& e : fs::recursive_directory_iterator(DataDir(which))) {
      if (!e.is_regular_file()) continue;
      files[fs::relative(e.path(), DataDir(which)).string()] =
          std::make_shared<Bytes>(test::ReadFileBytes(e.path().string()));
    }
  }
  formats::OcdbtOpener Opener() {
    return [this](const std::string& path) -> Result<std::shared_ptr<const ByteSource>> {
      auto it = files.find(path);
      if (it == files.end()) return Status::Error(ENOENT, path);
      auto bytes = it->second;
      return std::shared_ptr<const ByteSource>(std::make_shared<SpanSource>(*bytes));
    };
  }
  // The data file holding the most bytes (the kernels, params and moments).
  std::string Largest() const {
    std::string best;
    for (const auto& [p, b] : files) {
      if (p.starts_with("d/") && (best.empty() || b->size() > files.at(best)->size())) best = p;
    }
    return best;
  }
  Result<FileLayout> Layout(const std::string& self) {
    ASSIGN_OR_RETURN(formats::OcdbtRoot root, formats::ReadOcdbtManifest(SpanSource(*files.at("manifest.ocdbt"))));
    ASSIGN_OR_RETURN(std::vector<formats::OcdbtEntry> keys, formats::ListOcdbt(root, Opener()));
    return formats::OcdbtDataLayout(keys, self, files.at(self)->size(), Opener());
  }
};

TEST(OcdbtTest, ManifestAndTreeListEveryKey) {
  Db db("raw");
  Result<formats::OcdbtRoot> root = formats::ReadOcdbtManifest(SpanSource(*db.files.at("manifest.ocdbt")));
  ASSERT_TRUE(root.ok()) << root.status().message();
  EXPECT_TRUE(db.files.count(root->node.path)) << root->node.path;
  Result<std::vector<formats::OcdbtEntry>> keys = formats::ListOcdbt(*root, db.Opener());
  ASSERT_TRUE(keys.ok()) << keys.status().message();
  // 13 arrays (count; params, mu and nu of 4 parameters), each a .zarray and one chunk.
  ASSERT_EQ(keys->size(), 26u);
  EXPECT_EQ((*keys)[0].key, "opt_state.0.count/.zarray");
  EXPECT_FALSE((*keys)[0].ref.has_value());
  EXPECT_NE((*keys)[0].value.find("\"dtype\":\"<i4\""), std::string::npos) << (*keys)[0].value;
  for (size_t i = 1; i < keys->size(); ++i) EXPECT_LT((*keys)[i - 1].key, (*keys)[i].key);
}

TEST(OcdbtTest, UncompressedChunksAreTensorRegions) {
  Db db("raw");
  const std::string self = db.Largest();
  Result<FileLayout> l = db.Layout(self);
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(l->format, "orbax-ocdbt");
  EXPECT_TRUE(l->lossy_allowed);
  // Only the [16, 32] kernels pass the 1 KiB inline limit.
  ASSERT_EQ(l->tensors.size(), 3u) << l->note;
  std::map<std::string, const TensorRegion*> by_label;
  for (const TensorRegion& t : l->tensors) by_label[t.label] = &t;
  for (const char* label : {"params.Dense_0.kernel/0.0", "opt_state.0.mu.Dense_0.kernel/0.0",
                            "opt_state.0.nu.Dense_0.kernel/0.0"}) {
    ASSERT_TRUE(by_label.count(label)) << label;
    const TensorRegion& t = *by_label[label];
    EXPECT_EQ(t.dtype, DType::kF32);
    EXPECT_EQ(t.shape, (std::vector<uint64_t>{16, 32}));
    EXPECT_EQ(t.length, 16u * 32 * 4);
  }
  // The params kernel is what gen.py wrote: arange(512) / 7 after one Adam step of lr 0.01.
  const TensorRegion& k = *by_label["params.Dense_0.kernel/0.0"];
  float first;
  std::memcpy(&first, db.files.at(self)->data() + k.offset, 4);
  EXPECT_NEAR(first, 0.0f - 0.01f, 1e-4);
}

TEST(OcdbtTest, CompressedChunksStayBytesAndSaySo) {
  Db db("zstd");
  Result<FileLayout> l = db.Layout(db.Largest());
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_TRUE(l->tensors.empty());
  EXPECT_NE(l->note.find("compressed (zstd)"), std::string::npos) << l->note;
}

TEST(OcdbtTest, AFileNoKeyPointsIntoIsNotLaidOut) {
  Db db("raw");
  Result<formats::OcdbtRoot> root = formats::ReadOcdbtManifest(SpanSource(*db.files.at("manifest.ocdbt")));
  ASSERT_TRUE(root.ok());
  Result<std::vector<formats::OcdbtEntry>> keys = formats::ListOcdbt(*root, db.Opener());
  ASSERT_TRUE(keys.ok());
  EXPECT_FALSE(formats::OcdbtDataLayout(*keys, "d/00000000000000000000000000000000", 1 << 20, db.Opener()).ok());
}

TEST(OcdbtTest, NamesAndNodeFiles) {
  EXPECT_TRUE(formats::LooksLikeOcdbtDataName("6f0d4f352afbe02aa2c511bc5dd649f8"));
  EXPECT_FALSE(formats::LooksLikeOcdbtDataName("6f0d4f352afbe02aa2c511bc5dd649f"));
  EXPECT_FALSE(formats::LooksLikeOcdbtDataName("6F0D4F352AFBE02AA2C511BC5DD649F8"));
  Db db("raw");
  EXPECT_FALSE(formats::StartsWithOcdbtNode(SpanSource(*db.files.at(db.Largest()))));
  size_t node_files = 0;
  for (const auto& [p, b] : db.files) node_files += p.starts_with("d/") && formats::StartsWithOcdbtNode(SpanSource(*b));
  EXPECT_GE(node_files, 1u);
}

TEST(OcdbtTest, DamagedManifestsAndNodesFailCleanly) {
  Db db("raw");
  const Bytes& m = *db.files.at("manifest.ocdbt");
  for (size_t cut = 0; cut < m.size(); cut += 7) {
    Bytes t(m.begin(), m.begin() + cut);
    EXPECT_FALSE(formats::ReadOcdbtManifest(SpanSource(t)).ok()) << cut;
  }
  std::mt19937 rng(5);
  for (int round = 0; round < 300; ++round) {
    Bytes t = m;
    t[14 + rng() % (t.size() - 18)] ^= static_cast<uint8_t>(1u << (rng() % 8));
    Result<formats::OcdbtRoot> root = formats::ReadOcdbtManifest(SpanSource(t));
    if (!root.ok()) continue;
    Result<std::vector<formats::OcdbtEntry>> keys = formats::ListOcdbt(*root, db.Opener());
    if (keys.ok()) (void)formats::OcdbtDataLayout(*keys, db.Largest(), db.files.at(db.Largest())->size(), db.Opener());
  }
  Bytes junk(300);
  for (auto& c : junk) c = static_cast<uint8_t>(rng());
  EXPECT_FALSE(formats::DecodeOcdbtNode(junk, "", "").ok());
}

}  // namespace
}  // namespace ckptfs

namespace ckptfs {
namespace {

TEST(OcdbtTest, TheNodesAfterACommitsValuesGiveTheLayoutWithoutTheManifest) {
  Db db("raw");
  const std::string self = db.Largest();
  Result<formats::OcdbtRoot> root = formats::OcdbtTailNode(SpanSource(*db.files.at(self)), self);
  ASSERT_TRUE(root.ok()) << root.status().message();
  EXPECT_EQ(root->node.offset + root->node.length, db.files.at(self)->size());
  Result<std::vector<formats::OcdbtEntry>> keys = formats::ListOcdbt(*root, db.Opener());
  ASSERT_TRUE(keys.ok()) << keys.status().message();
  Result<FileLayout> l = formats::OcdbtDataLayout(*keys, self, db.files.at(self)->size(), db.Opener());
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(l->tensors.size(), 3u);
  // A node-only file and a damaged tail have none.
  Bytes cut(db.files.at(self)->begin(), db.files.at(self)->end() - 1);
  EXPECT_FALSE(formats::OcdbtTailNode(SpanSource(cut), self).ok());
  Bytes flipped = *db.files.at(self);
  flipped[flipped.size() - 10] ^= 1;
  EXPECT_FALSE(formats::OcdbtTailNode(SpanSource(flipped), self).ok());
}

TEST(OcdbtTest, ATailNodeIsFoundBeforeTheZerosThatPadTheFile) {
  // TensorStore rounds large data files up to 4 KiB with zeros after the
  // last node (a 14 MB file of a 10-step series: 3511 zeros).
  Db db("raw");
  const std::string self = db.Largest();
  const Bytes file = *db.files.at(self);
  Bytes padded = file;
  padded.resize((file.size() / 4096 + 1) * 4096, 0);
  Result<formats::OcdbtRoot> root = formats::OcdbtTailNode(SpanSource(padded), self);
  ASSERT_TRUE(root.ok()) << root.status().message();
  EXPECT_EQ(root->node.offset + root->node.length, file.size());
  db.files[self] = std::make_shared<Bytes>(padded);
  Result<std::vector<formats::OcdbtEntry>> keys = formats::ListOcdbt(*root, db.Opener());
  ASSERT_TRUE(keys.ok()) << keys.status().message();
  Result<FileLayout> l = formats::OcdbtDataLayout(*keys, self, padded.size(), db.Opener());
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(l->tensors.size(), 3u);
  // A whole page of zeros or more is not padding, nor is a nonzero byte after the node.
  Bytes long_tail = file;
  long_tail.resize(file.size() + formats::kMaxOcdbtPadding, 0);
  EXPECT_FALSE(formats::OcdbtTailNode(SpanSource(long_tail), self).ok());
  padded.back() = 1;
  EXPECT_FALSE(formats::OcdbtTailNode(SpanSource(padded), self).ok());
}

// Under a lossy policy a read from the node ending a closed data file on is
// served before the seal (docs/SEMANTICS.md): the seal keeps whatever
// overlaps that node exact.
TEST(OcdbtTest, TensorsOverlappingTheTailNodeStayExact) {
  Db db("raw");
  const std::string self = db.Largest();
  Bytes padded = *db.files.at(self);
  const uint64_t unpadded = padded.size();
  padded.resize((unpadded / 4096 + 1) * 4096, 0);
  const SpanSource src(padded);
  Result<formats::OcdbtRoot> root = formats::OcdbtTailNode(src, self);
  ASSERT_TRUE(root.ok()) << root.status().message();
  ASSERT_EQ(OcdbtTailNodeStart(src), std::optional<uint64_t>(root->node.offset));
  Result<FileLayout> l = db.Layout(self);
  ASSERT_TRUE(l.ok()) << l.status().message();
  const size_t n = l->tensors.size();
  ASSERT_GT(n, 0u);
  for (const TensorRegion& t : l->tensors) EXPECT_LE(t.offset + t.length, root->node.offset);
  EXPECT_EQ(KeepOcdbtTailExact(src, &*l), 0u);  // an intact file: values end where the node begins
  TensorRegion over = l->tensors.back();
  over.offset = root->node.offset - 8;
  over.length = 16;
  l->tensors.push_back(over);
  EXPECT_EQ(KeepOcdbtTailExact(src, &*l), 1u);
  EXPECT_EQ(l->tensors.size(), n);
  Bytes no_node(4096, 7);
  EXPECT_FALSE(OcdbtTailNodeStart(SpanSource(no_node)).has_value());
}

}  // namespace
}  // namespace ckptfs
