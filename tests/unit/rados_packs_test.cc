// Packs in a RADOS pool (store/cluster/rados_pack_objects.h), against the in-memory
// pool of fake_rados.h: publishing in pieces, reads and read-ahead, listing,
// deletion, a publish that fails or is cut short, and a store whose packs
// live there (superblock, recovery, fsck, gc, deltas through base packs).
#include <fcntl.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "store/cluster/rados_pack_objects.h"
#include "store/store_internal.h"
#include "tests/unit/fake_rados.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

namespace fs = std::filesystem;
using test::FakeRadosPool;
using test::TempDir;

constexpr uint32_t kChunk = 4096;

// RadosPackObjects over a fresh fake pool, with a tmp/ directory to publish from.
class RadosPackObjectsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = std::move(Env::Default()->OpenAt(AT_FDCWD, dir_.path(), O_RDONLY | O_DIRECTORY)).value();
    packs_ = std::make_unique<RadosPackObjects>(
        Env::Default(), std::make_unique<test::FakeRadosClient>(pool_, "ns1"), "rados:pool");
  }
  // A tmp file holding `bytes`, as the pack writer leaves it.
  UniqueFd TmpFile(const std::string& name, const std::vector<uint8_t>& bytes) {
    test::WriteFileBytes(dir_.Sub(name), bytes);
    return std::move(Env::Default()->OpenAt(tmp_.get(), name, O_RDWR)).value();
  }
  FakeRadosPool::Object* Object(ObjectId id) { return pool_->Find("ns1", internal::PackFileName(id)); }

  TempDir dir_;
  UniqueFd tmp_;
  std::shared_ptr<FakeRadosPool> pool_ = std::make_shared<FakeRadosPool>();
  std::unique_ptr<RadosPackObjects> packs_;
};

TEST_F(RadosPackObjectsTest, PublishWritesPiecesMarksCompleteAndRemovesTmp) {
  const std::vector<uint8_t> bytes = test::RandomBytes(2 * kRadosPieceBytes + 12345, 1);
  UniqueFd fd = TmpFile("a.pack.tmp", bytes);
  ASSERT_OK(packs_->Publish(0xab01, tmp_.get(), "a.pack.tmp", fd.get()));
  EXPECT_EQ(pool_->writes, 3);  // three pieces, memory bounded by one
  ASSERT_NE(Object(0xab01), nullptr);
  EXPECT_EQ(Object(0xab01)->bytes, bytes);
  EXPECT_EQ(Object(0xab01)->xattrs.at(kCompleteXattr), std::to_string(bytes.size()));
  EXPECT_FALSE(fs::exists(dir_.Sub("a.pack.tmp")));
  EXPECT_EQ(packs_->Where(0xab01), "rados:pool/000000000000ab01.pack");

  auto size = packs_->Size(0xab01);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, bytes.size());
  auto listing = packs_->List(ListDetail::kSizes);
  ASSERT_TRUE(listing.ok());
  ASSERT_EQ(listing->packs.size(), 1u);
  EXPECT_EQ(listing->packs[0].id, 0xab01u);
  EXPECT_TRUE(listing->packs[0].complete);
  EXPECT_EQ(listing->packs[0].bytes, bytes.size());
  EXPECT_GT(listing->packs[0].mtime_ns, 0u);
}

TEST_F(RadosPackObjectsTest, ReadsAndReadsAhead) {
  const std::vector<uint8_t> bytes = test::RandomBytes(100000, 2);
  UniqueFd fd = TmpFile("b.tmp", bytes);
  ASSERT_OK(packs_->Publish(7, tmp_.get(), "b.tmp", fd.get()));
  auto src = packs_->Open(7);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ(*(*src)->Size(), bytes.size());
  std::vector<uint8_t> out(5000);
  ASSERT_OK((*src)->ReadExact(out, 1000));
  EXPECT_TRUE(std::equal(out.begin(), out.end(), bytes.begin() + 1000));
  // A range read ahead is served from it, also in parts.
  (*src)->Prefetch(20000, 30000);
  (*src)->Prefetch(20000, 30000);  // already covered: not read twice
  EXPECT_EQ(pool_->started_reads, 1);
  ASSERT_OK((*src)->ReadExact(out, 20000));
  EXPECT_TRUE(std::equal(out.begin(), out.end(), bytes.begin() + 20000));
  std::vector<uint8_t> last(25000);
  ASSERT_OK((*src)->ReadExact(last, 25000));
  EXPECT_TRUE(std::equal(last.begin(), last.end(), bytes.begin() + 25000));
  // Past the end is a short read, not made-up bytes.
  EXPECT_EQ((*src)->ReadExact(out, bytes.size() - 10).code(), EIO);
  EXPECT_EQ(packs_->Open(8).status().code(), ENOENT);
}

TEST_F(RadosPackObjectsTest, DeleteRemovesAndMissingIsFine) {
  UniqueFd fd = TmpFile("c.tmp", test::RandomBytes(300, 3));
  ASSERT_OK(packs_->Publish(9, tmp_.get(), "c.tmp", fd.get()));
  ASSERT_OK(packs_->Delete(9));
  EXPECT_EQ(Object(9), nullptr);
  ASSERT_OK(packs_->Delete(9));
  EXPECT_EQ(packs_->Size(9).status().code(), ENOENT);
}

TEST_F(RadosPackObjectsTest, FailingWriteIsAClearErrorAndLeavesNothingNamed) {
  UniqueFd fd = TmpFile("d.tmp", test::RandomBytes(kRadosPieceBytes + 10, 4));
  pool_->fail_write_index = 1;  // the second piece
  pool_->write_errno = ENOSPC;
  Status s = packs_->Publish(10, tmp_.get(), "d.tmp", fd.get());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ENOSPC);
  EXPECT_NE(s.message().find("rados:pool/000000000000000a.pack"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("writing bytes 4194304.."), std::string::npos) << s.message();
  EXPECT_EQ(Object(10), nullptr);              // the first piece was removed
  EXPECT_TRUE(fs::exists(dir_.Sub("d.tmp")));  // the caller removes its tmp file
  EXPECT_TRUE(packs_->List(ListDetail::kNames)->packs.empty());
}

TEST_F(RadosPackObjectsTest, HalfWrittenObjectIsListedIncomplete) {
  UniqueFd fd = TmpFile("e.tmp", test::RandomBytes(kRadosPieceBytes + 10, 5));
  pool_->fail_write_index = 1;
  pool_->remove_errno = ETIMEDOUT;  // as if the node died before it could clean up
  EXPECT_FALSE(packs_->Publish(11, tmp_.get(), "e.tmp", fd.get()).ok());
  ASSERT_NE(Object(11), nullptr);
  EXPECT_EQ(Object(11)->xattrs.count(kCompleteXattr), 0u);
  auto listing = packs_->List(ListDetail::kNames);
  ASSERT_TRUE(listing.ok());
  ASSERT_EQ(listing->packs.size(), 1u);
  EXPECT_FALSE(listing->packs[0].complete);
}

TEST_F(RadosPackObjectsTest, ExistingObjectIsNeverOverwritten) {
  pool_->objects[{"ns1", internal::PackFileName(12)}].bytes = {1, 2, 3};
  UniqueFd fd = TmpFile("f.tmp", test::RandomBytes(100, 6));
  Status s = packs_->Publish(12, tmp_.get(), "f.tmp", fd.get());
  EXPECT_EQ(s.code(), EEXIST);
  EXPECT_EQ(Object(12)->bytes, (std::vector<uint8_t>{1, 2, 3}));
}

TEST_F(RadosPackObjectsTest, OtherObjectsAreUnexpected) {
  pool_->objects[{"ns1", "notes.txt"}].bytes = {1};
  pool_->objects[{"other", internal::PackFileName(13)}].bytes = {1};  // another store's namespace
  auto listing = packs_->List(ListDetail::kNames);
  ASSERT_TRUE(listing.ok());
  EXPECT_TRUE(listing->packs.empty());
  EXPECT_EQ(listing->unexpected, std::vector<std::string>{"rados:pool/notes.txt"});
}

// Packs larger than a stripe span several objects: ID.pack holds the first
// stripe and is written last, with the mark; ID.pack.1, ... the rest.
class RadosStripesTest : public RadosPackObjectsTest {
 protected:
  static constexpr uint64_t kStripe = 1 << 20;
  void SetUp() override {
    RadosPackObjectsTest::SetUp();
    packs_ = std::make_unique<RadosPackObjects>(
        Env::Default(), std::make_unique<test::FakeRadosClient>(pool_, "ns1"), "rados:pool", kStripe);
  }
  FakeRadosPool::Object* Tail(ObjectId id, int k) {
    return pool_->Find("ns1", internal::PackFileName(id) + "." + std::to_string(k));
  }
};

TEST_F(RadosStripesTest, LargePackSpansObjectsHeadLast) {
  const std::vector<uint8_t> bytes = test::RandomBytes(2 * kStripe + 777, 20);
  UniqueFd fd = TmpFile("s.tmp", bytes);
  ASSERT_OK(packs_->Publish(0x51, tmp_.get(), "s.tmp", fd.get()));
  ASSERT_NE(Object(0x51), nullptr);
  ASSERT_NE(Tail(0x51, 1), nullptr);
  ASSERT_NE(Tail(0x51, 2), nullptr);
  EXPECT_EQ(Tail(0x51, 3), nullptr);
  EXPECT_EQ(Object(0x51)->bytes.size(), kStripe);
  EXPECT_EQ(Tail(0x51, 2)->bytes.size(), 777u);
  EXPECT_EQ(pool_->written.back(), internal::PackFileName(0x51));  // the head, with the mark, last
  EXPECT_EQ(Object(0x51)->xattrs.at(kCompleteXattr), std::to_string(bytes.size()));
  EXPECT_EQ(Tail(0x51, 1)->xattrs.count(kCompleteXattr), 0u);

  auto src = packs_->Open(0x51);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ(*(*src)->Size(), bytes.size());
  std::vector<uint8_t> out(kStripe + 300);  // across two boundaries
  ASSERT_OK((*src)->ReadExact(out, kStripe - 100));
  EXPECT_TRUE(std::equal(out.begin(), out.end(), bytes.begin() + kStripe - 100));
  (*src)->Prefetch(kStripe + 10, 1000);
  std::vector<uint8_t> small(1000);
  ASSERT_OK((*src)->ReadExact(small, kStripe + 10));
  EXPECT_TRUE(std::equal(small.begin(), small.end(), bytes.begin() + kStripe + 10));
  EXPECT_EQ((*src)->ReadExact(small, bytes.size() - 10).code(), EIO);

  auto listing = packs_->List(ListDetail::kSizes);
  ASSERT_TRUE(listing.ok());
  ASSERT_EQ(listing->packs.size(), 1u);  // one pack, not three
  EXPECT_TRUE(listing->packs[0].complete);
  EXPECT_EQ(listing->packs[0].bytes, bytes.size());
  EXPECT_TRUE(listing->unexpected.empty());
  ASSERT_OK(packs_->Delete(0x51));
  EXPECT_TRUE(pool_->objects.empty());
}

TEST_F(RadosStripesTest, CutShortPublishLeavesAnUnfinishedPackThatDeleteRemoves) {
  UniqueFd fd = TmpFile("t.tmp", test::RandomBytes(3 * kStripe, 21));
  pool_->fail_write_index = 1;  // stripe 2, after stripe 1
  pool_->remove_errno = ETIMEDOUT;
  EXPECT_FALSE(packs_->Publish(0x52, tmp_.get(), "t.tmp", fd.get()).ok());
  EXPECT_EQ(Object(0x52), nullptr);
  ASSERT_NE(Tail(0x52, 1), nullptr);
  auto listing = packs_->List(ListDetail::kSizes);
  ASSERT_TRUE(listing.ok());
  ASSERT_EQ(listing->packs.size(), 1u);
  EXPECT_EQ(listing->packs[0].id, 0x52u);
  EXPECT_FALSE(listing->packs[0].complete);
  EXPECT_EQ(listing->packs[0].bytes, kStripe);
  EXPECT_EQ(packs_->Open(0x52).status().code(), ENOENT);
  pool_->remove_errno = 0;
  ASSERT_OK(packs_->Delete(0x52));
  EXPECT_TRUE(pool_->objects.empty());
}

TEST_F(RadosStripesTest, FailedPublishRemovesEveryObjectItWrote) {
  UniqueFd fd = TmpFile("u.tmp", test::RandomBytes(3 * kStripe + 5, 22));
  pool_->fail_write_index = 3;  // the head, after stripes 1 to 3
  EXPECT_FALSE(packs_->Publish(0x53, tmp_.get(), "u.tmp", fd.get()).ok());
  EXPECT_TRUE(pool_->objects.empty());
}

// A store whose packs live in the fake pool.
class RadosStoreTest : public ::testing::Test {
 protected:
  StoreOptions Options(const std::string& packs = "rados:ckpt") {
    StoreOptions o = test::SmallChunks(kChunk);
    o.cluster.packs = packs;
    o.connect_rados = test::FakeRadosConnector(pool_);
    return o;
  }
  void OpenStore(const std::string& packs = "rados:ckpt") {
    store_.reset();
    auto s = Store::Open(Env::Default(), dir_.path(), Options(packs));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
    auto rep = store_->Recover();
    ASSERT_TRUE(rep.ok()) << rep.status().ToString();
    last_recovery_ = *rep;
  }
  nlohmann::json Superblock() {
    auto bytes = test::ReadFileBytes(dir_.Sub("CKPTFS"));
    return nlohmann::json::parse(bytes.begin(), bytes.end());
  }
  size_t ObjectCount() {
    std::lock_guard lk(pool_->mu);
    return pool_->objects.size();
  }

  TempDir dir_;
  std::shared_ptr<FakeRadosPool> pool_ = std::make_shared<FakeRadosPool>();
  std::unique_ptr<Store> store_;
  RecoveryReport last_recovery_;
};

TEST_F(RadosStoreTest, SealedFileRoundTripsThroughThePool) {
  OpenStore();
  const std::vector<uint8_t> v1 = test::MixedContent(kChunk, 7);
  auto rec = test::MakeSealedFile(store_.get(), "model.bin", v1);
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(ObjectCount(), 1u);
  EXPECT_EQ(test::CountFiles(dir_.Sub("packs"), true), 0u);  // nothing in the directory
  EXPECT_EQ(test::CountFiles(dir_.Sub("tmp")), 0u);
  auto back = test::ReadContentAt(store_.get(), "model.bin");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, v1);

  // The pack's bytes are the format's: the object read as a pack file
  // gives what the store reads.
  const std::string obj = internal::PackFileName(rec->object);
  test::WriteFileBytes(dir_.Sub("copy.pack"), pool_->Find(pool_->connected_namespaces[0], obj)->bytes);
  auto reader = PackReader::Open(Env::Default(), std::move(Env::Default()->OpenAt(AT_FDCWD, dir_.Sub("copy.pack"), O_RDONLY)).value(),
                                 "copy");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->header().logical_size, v1.size());

  auto packs = store_->ListPacks();
  ASSERT_TRUE(packs.ok());
  ASSERT_EQ(packs->size(), 1u);
  EXPECT_EQ((*packs)[0].id, rec->object);
  EXPECT_EQ((*packs)[0].bytes, *store_->PackFileSize(rec->object));
  EXPECT_EQ(*store_->AllPackBytes(), (*packs)[0].bytes);
}

// Chunks stored as references read their base pack's object (through
// the store's cache of open base packs), and sequential reads read ahead.
TEST_F(RadosStoreTest, ReferencesReadTheirBasePacksWithReadAhead) {
  OpenStore();
  std::vector<uint8_t> v = test::RandomBytes(16 * kChunk, 8);
  ASSERT_TRUE(test::MakeSealedFile(store_.get(), "ckpt", v).ok());
  v[3 * kChunk + 5] ^= 0x5a;  // one chunk changes, the rest are references
  auto v2 = test::MakeSealedFile(store_.get(), "ckpt2", v);
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  auto pack = store_->OpenPack(v2->object);
  ASSERT_TRUE(pack.ok());
  EXPECT_FALSE((*pack)->meta().bases.empty());  // stored against the first
  std::vector<uint8_t> out;
  for (uint64_t i = 0; i < (*pack)->chunks().size(); ++i) {
    auto chunk = store_->LoadChunk(**pack, v2->object, i, nullptr);
    ASSERT_TRUE(chunk.ok()) << chunk.status().ToString();
    out.insert(out.end(), (*chunk)->begin(), (*chunk)->end());
  }
  EXPECT_EQ(out, v);
  EXPECT_GT(pool_->started_reads, 0);
}

TEST_F(RadosStoreTest, SuperblockRecordsWhereAndReopenUsesIt) {
  OpenStore();
  nlohmann::json sb = Superblock();
  EXPECT_EQ(sb["packs"], "rados:ckpt");
  const std::string ns = sb["rados_namespace"];
  EXPECT_TRUE(ns.starts_with("ckptfs-")) << ns;
  const std::vector<uint8_t> data = test::MixedContent(kChunk, 9);
  ASSERT_TRUE(test::MakeSealedFile(store_.get(), "f", data).ok());

  OpenStore("");  // no packs= given: the recorded place
  EXPECT_EQ(store_->options().cluster.packs, "rados:ckpt");
  EXPECT_EQ(pool_->connected_namespaces.back(), ns);
  EXPECT_EQ(*test::ReadContentAt(store_.get(), "f"), data);

  store_.reset();
  for (const char* other : {"rados:other", "dir"}) {
    auto s = Store::Open(Env::Default(), dir_.path(), Options(other));
    ASSERT_FALSE(s.ok()) << other;
    EXPECT_EQ(s.status().code(), EINVAL);
    EXPECT_NE(s.status().message().find("keeps its packs in rados:ckpt"), std::string::npos) << s.status().message();
  }
}

TEST_F(RadosStoreTest, DirectoryStoreRefusesRadosAndKeepsItsSuperblock) {
  OpenStore("");
  EXPECT_FALSE(Superblock().contains("packs"));
  store_.reset();
  auto s = Store::Open(Env::Default(), dir_.path(), Options("rados:ckpt"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("keeps its packs in its directory"), std::string::npos) << s.status().message();
  OpenStore("dir");
}

TEST_F(RadosStoreTest, TwoStoresInOnePoolNeverCollectEachOthersPacks) {
  OpenStore();
  auto rec = test::MakeSealedFile(store_.get(), "f", test::MixedContent(kChunk, 10));
  ASSERT_TRUE(rec.ok());
  TempDir other;
  auto s2 = Store::Open(Env::Default(), other.path(), Options());
  ASSERT_TRUE(s2.ok());
  auto rep = (*s2)->Recover();
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->orphan_packs_removed, 0u);
  EXPECT_TRUE(store_->PackFileSize(rec->object).ok());
}

TEST_F(RadosStoreTest, RecoveryRemovesOrphansAndUnfinishedObjects) {
  OpenStore();
  auto keep = test::MakeSealedFile(store_.get(), "keep", test::MixedContent(kChunk, 11));
  auto gone = test::MakeSealedFile(store_.get(), "gone", test::RandomBytes(3 * kChunk, 12));
  ASSERT_TRUE(keep.ok() && gone.ok());
  ASSERT_EQ(::unlinkat(store_->ns_fd(), "gone", 0), 0);
  // A publish a crash cut short: an object with no completion mark.
  const std::string ns = pool_->connected_namespaces.back();
  pool_->objects[{ns, internal::PackFileName(0x77)}].bytes = test::RandomBytes(500, 13);

  auto f = store_->Fsck();
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->clean()) << ::testing::PrintToString(f->errors);
  bool warned = false;
  for (const std::string& w : f->warnings) warned |= w.find("0000000000000077.pack: left by an interrupted seal") != std::string::npos;
  EXPECT_TRUE(warned) << ::testing::PrintToString(f->warnings);

  OpenStore();  // recovery, as `ckptfs gc` runs it
  EXPECT_EQ(last_recovery_.orphan_packs_removed, 1u);
  EXPECT_EQ(last_recovery_.tmp_files_removed, 1u);
  EXPECT_TRUE(last_recovery_.swept());
  EXPECT_EQ(ObjectCount(), 1u);
  EXPECT_TRUE(store_->PackFileSize(keep->object).ok());
  f = store_->Fsck();
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->clean() && f->warnings.empty()) << ::testing::PrintToString(f->warnings);
}

// In a shared store an unfinished object may be another node's seal still
// writing it: recovery leaves it to cluster GC, which waits out its grace.
TEST_F(RadosStoreTest, SharedStoreLeavesUnfinishedObjectsToClusterGc) {
  OpenStore();
  const std::string ns = pool_->connected_namespaces.back();
  pool_->objects[{ns, internal::PackFileName(0x78)}].bytes = test::RandomBytes(500, 16);
  store_.reset();
  StoreOptions o = Options();
  o.cluster.enabled = true;
  auto s = Store::Open(Env::Default(), dir_.path(), o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto rep = (*s)->Recover();
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->tmp_files_removed, 0u);
  EXPECT_NE(pool_->Find(ns, internal::PackFileName(0x78)), nullptr);
  auto packs = (*s)->ListPacks();
  ASSERT_TRUE(packs.ok());
  ASSERT_EQ(packs->size(), 1u);
  EXPECT_FALSE((*packs)[0].complete);
}

// The daemon forks after opening the store: the connection is closed
// before and a new one opened after, and packs read through the new one.
TEST_F(RadosStoreTest, ConnectionClosesAndReopensAroundAFork) {
  OpenStore();
  const std::vector<uint8_t> data = test::MixedContent(kChunk, 17);
  ASSERT_TRUE(test::MakeSealedFile(store_.get(), "f", data).ok());
  const size_t connects = pool_->connected_namespaces.size();
  store_->ClosePackConnection();
  ASSERT_OK(store_->OpenPackConnection());
  EXPECT_EQ(pool_->connected_namespaces.size(), connects + 1);
  EXPECT_EQ(pool_->connected_namespaces.back(), pool_->connected_namespaces.front());
  EXPECT_EQ(*test::ReadContentAt(store_.get(), "f"), data);
}

TEST_F(RadosStoreTest, CorruptObjectIsDamageNotGarbage) {
  OpenStore();
  auto rec = test::MakeSealedFile(store_.get(), "f", test::MixedContent(kChunk, 14));
  ASSERT_TRUE(rec.ok());
  const std::string ns = pool_->connected_namespaces.back();
  pool_->Find(ns, internal::PackFileName(rec->object))->bytes[80] ^= 1;
  auto f = store_->Fsck();
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->clean());
  EXPECT_EQ(test::ReadContentAt(store_.get(), "f").status().code(), EIO);
}

TEST_F(RadosStoreTest, FailedPublishFailsTheSealAndLeavesTheFileStaged) {
  OpenStore();
  pool_->fail_write_index = pool_->writes;  // the next write
  auto rec = test::MakeSealedFile(store_.get(), "f", test::MixedContent(kChunk, 15));
  ASSERT_FALSE(rec.ok());
  EXPECT_NE(rec.status().message().find("rados:ckpt/"), std::string::npos) << rec.status().message();
  EXPECT_EQ(ObjectCount(), 0u);
  EXPECT_EQ(test::CountFiles(dir_.Sub("tmp")), 0u);
  OpenStore();  // recovery seals it, the pool works again
  EXPECT_EQ(last_recovery_.staged_resealed, 1u);
  EXPECT_EQ(ObjectCount(), 1u);
}

// Without a connector of its own, a store reaches RADOS through the build's
// client: the none-backend refuses, saying how the binary was built; the
// real one loads librados.so.2 at run time and reports what failed.
TEST(RadosBackendTest, TheBuildsClientSaysWhyItCannotConnect) {
  TempDir dir;
  StoreOptions o = test::SmallChunks(kChunk);
  o.cluster.packs = "rados:ckpt";
  o.cluster.ceph_conf = dir.Sub("no-such-ceph.conf");
  Result<std::unique_ptr<Store>> s = Store::Open(Env::Default(), dir.path(), o);
  ASSERT_FALSE(s.ok());
  const std::string msg = s.status().message();
  if (!BuiltWithRados()) {
    EXPECT_EQ(s.status().code(), ENOTSUP) << msg;
    EXPECT_NE(msg.find("built without RADOS support (-DCKPTFS_WITH_RADOS=OFF); packs=rados:ckpt needs"),
              std::string::npos)
        << msg;
    return;
  }
  // librados absent: what to install; present: the configuration it could not read.
  EXPECT_TRUE(msg.find("librados.so.2 cannot be loaded") != std::string::npos ||
              msg.find("cannot read the Ceph configuration " + o.cluster.ceph_conf) != std::string::npos)
      << msg;
}

}  // namespace
}  // namespace ckptfs
