// Orbax's OCDBT databases (codec/formats/ocdbt.h): the manifest, the B+tree
// and the zarr metadata give each data file's uncompressed chunks. The
// checkpoints in tests/data/orbax come from orbax-checkpoint (gen.py there):
// raw/ saved with use_compression=False, zstd/ with Orbax's default.
#include "codec/formats/ocdbt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "seal/ocdbt_data.h"
#include "tests/unit/mem_siblings.h"
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
  // Values end where the node begins; those ending in the node's page stay
  // exact too (ANodeStartingMidPageIsReadableFromItsPage).
  const uint64_t page = root->node.offset / kOcdbtTailPage * kOcdbtTailPage;
  const size_t in_page = static_cast<size_t>(std::count_if(
      l->tensors.begin(), l->tensors.end(), [&](const TensorRegion& t) { return t.offset + t.length > page; }));
  EXPECT_EQ(KeepOcdbtTailExact(src, &*l), in_page);
  TensorRegion over = l->tensors.back();
  over.offset = root->node.offset - 8;
  over.length = 16;
  l->tensors.push_back(over);
  EXPECT_EQ(KeepOcdbtTailExact(src, &*l), 1u);
  EXPECT_EQ(l->tensors.size(), n - in_page);
  Bytes no_node(4096, 7);
  EXPECT_FALSE(OcdbtTailNodeStart(SpanSource(no_node)).has_value());
}

// The kernel reads whole pages: a node that starts mid-page is read from
// the page's start, so that is where the bytes a lossy seal keeps begin,
// and a tensor ending inside that page before the node stays exact too.
TEST(OcdbtTest, ANodeStartingMidPageIsReadableFromItsPage) {
  Db db("raw");
  const Bytes& original = *db.files.at(db.Largest());
  Result<formats::OcdbtRoot> root = formats::OcdbtTailNode(SpanSource(original), "");
  ASSERT_TRUE(root.ok()) << root.status().message();
  // 40 more bytes of values (a Dense(10) bias) before everything.
  Bytes shifted(40, 0x3f);
  shifted.insert(shifted.end(), original.begin(), original.end());
  const SpanSource src(shifted);
  const uint64_t node = root->node.offset + 40;
  ASSERT_EQ(OcdbtTailNodeStart(src), std::optional<uint64_t>(node));
  const uint64_t page = node / kOcdbtTailPage * kOcdbtTailPage;
  ASSERT_GT(node, page);
  EXPECT_EQ(OcdbtTailReadableFrom(src), std::optional<uint64_t>(page));
  FileLayout l;
  TensorRegion before;  // ends at the page's start: coded as usual
  before.offset = page - 64;
  before.length = 64;
  TensorRegion within = before;  // ends inside the page, before the node
  within.offset = page;
  within.length = node - page;
  l.tensors = {before, within};
  const size_t dropped = KeepOcdbtTailExact(src, &l);
  EXPECT_EQ(dropped, 1u);
  ASSERT_FALSE(l.tensors.empty());
  EXPECT_EQ(l.tensors[0].offset, before.offset);
}

// TensorStore may write a commit's root node, then the next commit's values
// after it, then zeros (orbax-checkpoint 0.12.8 in the Orbax series: a
// 361-byte node, 40 KB of a kernel's first moment, 3735 zeros), and writes
// the nodes describing those values only once it has read that root back.
// The seal reads the layout from that node at once, and reads from its page
// on do not wait for the seal (they waited 3 s for nodes that could not
// come, and the file was sealed as unknown bytes at 1.08x).
TEST(OcdbtTest, ANodeFollowedByTheNextCommitsValuesGivesTheLayout) {
  Db db("raw");
  const std::string self = db.Largest();
  const Bytes& original = *db.files.at(self);
  Result<formats::OcdbtRoot> tail = formats::OcdbtTailNode(SpanSource(original), self);
  ASSERT_TRUE(tail.ok()) << tail.status().message();
  Bytes more = original;
  more.insert(more.end(), 40960, 0x3f);
  more.resize((more.size() / 4096 + 1) * 4096, 0);
  const SpanSource src(more);
  EXPECT_FALSE(formats::OcdbtTailNode(src, self).ok());
  EXPECT_FALSE(OcdbtTailNodeStart(src).has_value());
  Result<formats::OcdbtRoot> last = formats::OcdbtLastNode(src, self);
  ASSERT_TRUE(last.ok()) << last.status().message();
  EXPECT_EQ(last->node.offset, tail->node.offset);
  EXPECT_EQ(last->node.length, tail->node.length);
  EXPECT_EQ(OcdbtTailReadableFrom(src), std::optional<uint64_t>(tail->node.offset / kOcdbtTailPage * kOcdbtTailPage));
  // The data file among its siblings, without a manifest: the layout of
  // the values before the node, found without waiting.
  test::MemSiblings siblings(self);
  for (const auto& [path, bytes] : db.files) {
    if (path.starts_with("d/") && path != self) siblings.Put(path, *bytes);
  }
  std::optional<FileLayout> l = OcdbtDataLayoutFromSiblings(src, siblings, std::chrono::milliseconds(0));
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->format, "orbax-ocdbt");
  EXPECT_EQ(l->tensors.size(), 3u);
  for (const TensorRegion& t : l->tensors) EXPECT_LE(t.offset + t.length, last->node.offset);
  // Values alone, no node anywhere: nothing.
  Bytes values(8192, 0x3f);
  EXPECT_FALSE(formats::OcdbtLastNode(SpanSource(values), self).ok());
}

// A node followed by more of the next commit's values than OcdbtLastNode
// searches (4.2 MB in a failed run of the Orbax series): TensorStore reads
// the node back before it writes the nodes describing those values, so its
// pages are served before the seal, and the seal keeps every tensor that
// shares one of them exact. Values around it are not served early.
TEST(OcdbtTest, ANodeFarFromTheEndIsReadableAndItsPagesStayExact) {
  Db db("raw");
  const std::string self = db.Largest();
  const Bytes& original = *db.files.at(self);
  Result<formats::OcdbtRoot> tail = formats::OcdbtTailNode(SpanSource(original), self);
  ASSERT_TRUE(tail.ok()) << tail.status().message();
  const uint64_t node = tail->node.offset;
  const uint64_t node_end = node + tail->node.length;
  ASSERT_EQ(node_end, original.size());
  Bytes more = original;
  std::mt19937 rng(7);
  for (size_t i = 0; i < formats::kMaxTailNodeSearch + (64u << 10); ++i) more.push_back(static_cast<uint8_t>(rng()));
  more.resize((more.size() / 4096 + 1) * 4096, 0);
  const SpanSource src(more);
  ASSERT_FALSE(formats::OcdbtLastNode(src, self).ok());  // beyond the tail search
  ASSERT_FALSE(OcdbtTailReadableFrom(src).has_value());

  Result<std::vector<formats::OcdbtRef>> found = formats::FindOcdbtNodes(src, 0, src.size(), kOcdbtReadableNodeBytes);
  ASSERT_TRUE(found.ok()) << found.status().message();
  ASSERT_EQ(found->size(), 1u);
  EXPECT_EQ((*found)[0].offset, node);
  EXPECT_EQ((*found)[0].length, tail->node.length);
  EXPECT_TRUE(formats::FindOcdbtNodes(src, node + 1, src.size(), kOcdbtReadableNodeBytes)->empty());
  EXPECT_TRUE(formats::FindOcdbtNodes(src, 0, src.size(), tail->node.length - 1)->empty());  // longer than allowed

  const uint64_t first_page = node / kOcdbtTailPage * kOcdbtTailPage;
  const uint64_t pages_end = (node_end + kOcdbtTailPage - 1) / kOcdbtTailPage * kOcdbtTailPage;
  EXPECT_TRUE(OcdbtNodePagesCover(src, first_page, pages_end - first_page));
  EXPECT_TRUE(OcdbtNodePagesCover(src, node, 1));
  EXPECT_FALSE(OcdbtNodePagesCover(src, first_page, pages_end - first_page + kOcdbtTailPage));  // and values after
  EXPECT_FALSE(OcdbtNodePagesCover(src, pages_end, kOcdbtTailPage));
  EXPECT_FALSE(OcdbtNodePagesCover(src, first_page - kOcdbtTailPage, kOcdbtTailPage));
  EXPECT_FALSE(OcdbtNodePagesCover(src, src.size(), kOcdbtTailPage));
  // A damaged node is no node.
  Bytes damaged = more;
  damaged[node + tail->node.length / 2] ^= 1;
  EXPECT_FALSE(OcdbtNodePagesCover(SpanSource(damaged), first_page, kOcdbtTailPage));

  Result<FileLayout> l = db.Layout(self);
  ASSERT_TRUE(l.ok()) << l.status().message();
  const size_t before_node = l->tensors.size();
  const size_t in_first_page = static_cast<size_t>(std::count_if(
      l->tensors.begin(), l->tensors.end(), [&](const TensorRegion& t) { return t.offset + t.length > first_page; }));
  TensorRegion after = l->tensors.back();  // the next commit's first value, from the node's end
  after.offset = node_end;
  after.length = 8192;
  TensorRegion far = after;
  far.offset = pages_end + 2 * kOcdbtTailPage;
  l->tensors.push_back(after);
  l->tensors.push_back(far);
  Result<size_t> dropped = KeepOcdbtNodePagesExact(src, &*l);
  ASSERT_TRUE(dropped.ok()) << dropped.status().message();
  EXPECT_EQ(*dropped, in_first_page + 1);
  EXPECT_EQ(l->tensors.size(), before_node - in_first_page + 1);
  EXPECT_EQ(l->tensors.back().offset, far.offset);
}

// Arrays move within an Orbax data file from save to save: its packs take
// chunks of at most 1 MiB, other files the mount's size.
TEST(OcdbtTest, DataFilesOfSeveralArraysTakeSmallerChunks) {
  Db db("raw");
  Result<FileLayout> l = db.Layout(db.Largest());
  ASSERT_TRUE(l.ok()) << l.status().message();
  ASSERT_GT(l->tensors.size(), 1u);
  EXPECT_EQ(PackChunkSizeFor(*l, 4u << 20), kOcdbtChunkSize);
  EXPECT_EQ(PackChunkSizeFor(*l, 256u << 10), 256u << 10);  // a smaller mount size stays
  l->tensors.resize(1);
  EXPECT_EQ(PackChunkSizeFor(*l, 4u << 20), 4u << 20);
  FileLayout torch;
  torch.format = "torch-zip";
  torch.tensors.resize(3);
  EXPECT_EQ(PackChunkSizeFor(torch, 4u << 20), 4u << 20);
}

// Orbax's legacy layout (use_ocdbt=False): a chunk file is one raw chunk of
// the array its .zarray describes; anything else stays bytes.
TEST(OcdbtTest, LegacyZarrChunkFilesAreOneTensorEach) {
  const std::string zarray =
      R"({"chunks":[64,256],"compressor":null,"dimension_separator":".","dtype":"<f4","fill_value":null,)"
      R"("filters":null,"order":"C","shape":[64,300],"zarr_format":2})";
  Result<FileLayout> l = formats::ZarrChunkFileLayout(zarray, "params.Dense_0.kernel", "0.1", 64 * 256 * 4);
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(l->format, "zarr-chunk");
  EXPECT_FALSE(l->lossy_allowed);
  ASSERT_EQ(l->tensors.size(), 1u);
  EXPECT_EQ(l->tensors[0].label, "params.Dense_0.kernel/0.1");
  EXPECT_EQ(l->tensors[0].dtype, DType::kF32);
  EXPECT_EQ(l->tensors[0].shape, (std::vector<uint64_t>{64, 256}));
  EXPECT_EQ(l->tensors[0].length, 64u * 256 * 4);
  // Not a whole chunk, compressed, or not this array's chunk name.
  EXPECT_TRUE(formats::ZarrChunkFileLayout(zarray, "a", "0.1", 1000).value().tensors.empty());
  std::string zstd = zarray;
  zstd.replace(zstd.find("\"compressor\":null"), 17, R"("compressor":{"id":"zstd","level":1})");
  Result<FileLayout> z = formats::ZarrChunkFileLayout(zstd, "a", "0.0", 64 * 256 * 4);
  ASSERT_TRUE(z.ok());
  EXPECT_TRUE(z->tensors.empty());
  EXPECT_NE(z->note.find("compressed (zstd)"), std::string::npos) << z->note;
  EXPECT_FALSE(formats::ZarrChunkFileLayout(zarray, "a", "0", 64 * 256 * 4).ok());  // wrong rank
  EXPECT_FALSE(formats::ZarrChunkFileLayout(zarray, "a", ".zarray", 64 * 256 * 4).ok());
  EXPECT_FALSE(formats::ZarrChunkFileLayout("{\"zarr_format\":3}", "a", "0.0", 64 * 256 * 4).ok());
  EXPECT_FALSE(formats::ZarrChunkFileLayout("not json", "a", "0.0", 64 * 256 * 4).ok());
  EXPECT_FALSE(formats::ZarrChunkFileLayout(R"({"zarr_format":2,"chunks":"x"})", "a", "0.0", 4).ok());
  EXPECT_TRUE(formats::LooksLikeZarrChunkName("0"));
  EXPECT_TRUE(formats::LooksLikeZarrChunkName("3.10.0"));
  for (const char* bad : {"", ".0", "0.", "0..1", "a.0", "0/1", ".zarray"}) {
    EXPECT_FALSE(formats::LooksLikeZarrChunkName(bad)) << bad;
  }
}

// A chunk shape whose byte count wraps past 64 bits describes no file:
// 2^62 + 1 floats once wrapped to 4 bytes and 2^62 to 0, so a 4-byte or an
// empty chunk file got a tensor of that shape (found by fuzz_zarr_chunk).
TEST(OcdbtTest, LegacyZarrChunkOfAnOverflowingShapeIsNoTensor) {
  for (const auto& [dims, size] : {std::pair<const char*, uint64_t>{"[4611686018427387905]", 4},
                                   {"[4611686018427387904]", 0},
                                   {"[4294967296,4294967296]", 0},
                                   {"[0,3]", 0}}) {
    const std::string zarray = std::string(R"({"chunks":)") + dims +
                               R"(,"compressor":null,"dtype":"<f4","filters":null,"order":"C","zarr_format":2})";
    const std::string key = std::string(dims).find(',') == std::string::npos ? "0" : "0.0";
    Result<FileLayout> l = formats::ZarrChunkFileLayout(zarray, "a", key, size);
    ASSERT_TRUE(l.ok()) << dims << ": " << l.status().message();
    EXPECT_TRUE(l->tensors.empty()) << dims;
  }
}

// The same shapes inside an OCDBT database: a 4-byte value is no chunk of
// 2^62 + 1 floats, and the note says why it was left as bytes.
TEST(OcdbtTest, AnOverflowingChunkShapeInTheDatabaseIsNoTensor) {
  const std::string self = "d/00000000000000000000000000000000";
  std::vector<formats::OcdbtEntry> keys;
  keys.push_back({"a/.zarray", std::nullopt,
                  R"({"chunks":[4611686018427387905],"compressor":null,"dtype":"<f4","filters":null,)"
                  R"("order":"C","shape":[4611686018427387905],"zarr_format":2})"});
  keys.push_back({"a/0", formats::OcdbtRef{self, 0, 4, ""}, ""});
  const Bytes data(4, 0);
  const formats::OcdbtOpener open = [&](const std::string&) -> Result<std::shared_ptr<const ByteSource>> {
    return std::shared_ptr<const ByteSource>(std::make_shared<SpanSource>(data));
  };
  Result<FileLayout> l = formats::OcdbtDataLayout(keys, self, data.size(), open);
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_TRUE(l->tensors.empty());
  EXPECT_NE(l->note.find("no raw chunk size"), std::string::npos) << l->note;
}

// The store finds a chunk's .zarray among its siblings.
TEST(OcdbtTest, LegacyZarrChunkLayoutFromTheZarrayBeside) {
  const std::string zarray = R"({"chunks":[256],"compressor":null,"dtype":"<f4","filters":null,"order":"C",)"
                             R"("shape":[256],"zarr_format":2})";
  test::MemSiblings siblings("0");
  const Bytes chunk(1024, 1);
  EXPECT_FALSE(ZarrChunkLayoutFromSiblings(SpanSource(chunk), siblings).has_value());  // no .zarray yet
  siblings.Put(".zarray", Bytes(zarray.begin(), zarray.end()));
  std::optional<FileLayout> l = ZarrChunkLayoutFromSiblings(SpanSource(chunk), siblings);
  ASSERT_TRUE(l.has_value());
  ASSERT_EQ(l->tensors.size(), 1u);
  EXPECT_EQ(l->tensors[0].length, 1024u);
  test::MemSiblings other("not_a_chunk");
  other.Put(".zarray", Bytes(zarray.begin(), zarray.end()));
  EXPECT_FALSE(ZarrChunkLayoutFromSiblings(SpanSource(chunk), other).has_value());
}

}  // namespace
}  // namespace ckptfs
