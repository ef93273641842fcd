// Recovery and gc delete only what they have proved unreferenced: a stub,
// pack header, chunk table, meta block or base that cannot be read (a
// flipped byte, a transient I/O error, a missing file) stops the sweep, is
// reported by path, and never costs another file its content.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "tests/unit/fault_env.h"
#include "base/le.h"
#include "store/pack_format.h"
#include "store/store.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

constexpr uint32_t kChunk = 64 * 1024;


std::string PackRel(ObjectId id) { return "packs/" + ObjectIdHex(id).substr(0, 2) + "/" + ObjectIdHex(id) + ".pack"; }

// Every file under packs/, staging/ and tmp/, relative to the store.
std::set<std::string> StoredObjects(const std::string& root) {
  std::set<std::string> out;
  for (const char* top : {"packs", "staging", "tmp"}) {
    for (const auto& e : fs::recursive_directory_iterator(root + "/" + top)) {
      if (e.is_regular_file()) out.insert(fs::relative(e.path(), root).string());
    }
  }
  return out;
}

void FlipByte(const std::string& path, uint64_t off) {
  std::vector<uint8_t> b = test::ReadFileBytes(path);
  ASSERT_LT(off, b.size()) << path;
  b[off] ^= 0x5a;
  test::WriteFileBytes(path, b);
}

struct PackRegions {
  uint64_t header_end = kPackHeaderSize, meta_offset = 0, meta_end = 0, table_offset = 0, size = 0;
};
PackRegions RegionsOf(const std::string& path) {
  const std::vector<uint8_t> b = test::ReadFileBytes(path);
  PackRegions r;
  r.size = b.size();
  r.meta_offset = le::Get64(b, 40);
  r.meta_end = r.meta_offset + le::Get32(b, 48);
  r.table_offset = r.meta_end;  // the chunk table follows the meta block
  return r;
}

class RecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override { Reopen(); }
  // A new Store on the same directory, recovered as a mount does.
  Result<RecoveryReport> Reopen(Env* env = Env::Default()) {
    store_.reset();
    auto s = Store::Open(env, dir_.path(), test::SmallChunks(kChunk));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return s.status();
    store_ = std::move(s).value();
    return store_->Recover();
  }
  StubRecord Seal(const std::string& name, const std::vector<uint8_t>& bytes) {
    auto r = test::MakeSealedFile(store_.get(), name, bytes);
    EXPECT_TRUE(r.ok()) << name << ": " << r.status().ToString();
    content_[name] = bytes;
    return r.ok() ? *r : StubRecord{};
  }
  void Delete(const std::string& name) {
    auto fd = store_->env()->OpenAt(store_->ns_fd(), name, O_RDWR);
    ASSERT_TRUE(fd.ok());
    auto rec = ReadStub(store_->env(), fd->get());
    ASSERT_TRUE(rec.ok());
    ASSERT_EQ(::unlinkat(store_->ns_fd(), name.c_str(), 0), 0);
    EXPECT_OK(store_->ReleaseStubObjects(*rec));
    content_.erase(name);
  }
  ObjectId PackOf(const std::string& name) {
    auto fd = store_->env()->OpenAt(store_->ns_fd(), name, O_RDONLY);
    auto rec = fd.ok() ? ReadStub(store_->env(), fd->get()) : Result<StubRecord>(fd.status());
    EXPECT_TRUE(rec.ok());
    return rec.ok() ? rec->object : 0;
  }
  // Every file reads bit-exact, except those in `may_fail`, which read
  // bit-exact or fail: never other bytes.
  void ExpectFilesIntact(const std::set<std::string>& may_fail, const std::string& what) {
    for (const auto& [name, want] : content_) {
      auto got = test::ReadContentAt(store_.get(), name);
      if (!got.ok()) {
        EXPECT_TRUE(may_fail.count(name)) << what << ": " << name << " became unreadable: " << got.status().ToString();
        continue;
      }
      EXPECT_TRUE(*got == want) << what << ": " << name << " reads wrong bytes";
    }
  }
  // The scene of the issue: B is stored as deltas against A, and A was
  // deleted, so A's pack stays only as B's base. C stands apart.
  void BuildScene() {
    const auto v = test::NpyVersions(2, 50000, 3);
    Seal("a", v[0]);
    a_pack_ = PackOf("a");
    Seal("b", v[1]);
    b_pack_ = PackOf("b");
    Seal("c", test::MixedContent(kChunk, 9));
    c_pack_ = PackOf("c");
    auto b = store_->OpenPack(b_pack_);
    ASSERT_TRUE(b.ok());
    ASSERT_EQ((*b)->meta().bases, std::vector<ObjectId>{a_pack_}) << "b must be stored against a";
    Delete("a");
    ASSERT_TRUE(fs::exists(dir_.Sub(PackRel(a_pack_)))) << "a's pack is b's base";
  }

  TempDir dir_;
  std::unique_ptr<Store> store_;
  std::map<std::string, std::vector<uint8_t>> content_;
  ObjectId a_pack_ = 0, b_pack_ = 0, c_pack_ = 0;
};

bool Mentions(const std::vector<std::string>& lines, const std::string& a, const std::string& b) {
  return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) {
    return l.find(a) != std::string::npos && l.find(b) != std::string::npos;
  });
}

// The issue's scenario: one flipped byte in B's meta block used to make
// recovery sweep A's pack, B's base, and B was lost for good.
TEST_F(RecoveryTest, FlippedMetaOfDeltaFileKeepsItsDeletedBase) {
  BuildScene();
  // Garbage that a clean recovery would delete: an orphan staging file.
  ObjectId orphan = 0;
  ASSERT_TRUE(store_->CreateStaging(&orphan).ok());
  const std::set<std::string> before = StoredObjects(dir_.path());
  const std::string b_path = dir_.Sub(PackRel(b_pack_));
  const PackRegions r = RegionsOf(b_path);
  FlipByte(b_path, r.meta_offset + 20);

  auto rep = Reopen();
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_FALSE(rep->swept());
  EXPECT_TRUE(Mentions(rep->unreadable, PackRel(b_pack_), "meta block")) << ::testing::PrintToString(rep->unreadable);
  EXPECT_EQ(rep->orphan_packs_removed, 0u);
  EXPECT_EQ(rep->orphan_staging_removed, 0u);
  EXPECT_EQ(StoredObjects(dir_.path()), before) << "recovery deleted something";
  EXPECT_TRUE(store_->deletion_blocked());
  // The meta block is an index, not content: b still reads, bit-exact.
  ExpectFilesIntact({}, "meta of b flipped");
  // fsck names the object, what kind it is and what is wrong, and promises
  // no removal of the orphan.
  auto f = store_->Fsck();
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->clean());
  EXPECT_TRUE(Mentions(f->errors, PackRel(b_pack_), "meta block")) << ::testing::PrintToString(f->errors);
  for (const std::string& w : f->warnings) EXPECT_EQ(w.find("removes it"), std::string::npos) << w;

  // While mounted in that state, deleting a file deletes no pack.
  Delete("c");
  EXPECT_TRUE(fs::exists(dir_.Sub(PackRel(c_pack_))));

  // Repaired, the next recovery can prove what is garbage again.
  FlipByte(b_path, r.meta_offset + 20);
  rep = Reopen();
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->swept()) << ::testing::PrintToString(rep->unreadable);
  EXPECT_FALSE(store_->deletion_blocked());
  EXPECT_EQ(rep->orphan_packs_removed, 1u);  // c's
  EXPECT_EQ(rep->orphan_staging_removed, 1u);
  EXPECT_TRUE(fs::exists(dir_.Sub(PackRel(a_pack_))));
  ExpectFilesIntact({}, "repaired");
  auto clean = store_->Fsck();
  ASSERT_TRUE(clean.ok());
  EXPECT_TRUE(clean->clean()) << ::testing::PrintToString(clean->errors);
}

// Corrupting one byte in turn of every kind of stored object never makes
// another file unreadable, never yields wrong bytes, and recovery deletes
// nothing. The store keeps no separate on-disk index (the pack index is
// rebuilt from meta blocks at mount); a pack's own index is its chunk table
// and footer, corrupted here as "index".
TEST_F(RecoveryTest, CorruptingAnyObjectLosesNoOtherFile) {
  BuildScene();
  Seal("d", test::NpyVersions(1, 30000, 11)[0]);
  const ObjectId d_pack = PackOf("d");
  store_.reset();
  const std::set<std::string> objects = StoredObjects(dir_.path());

  struct Target {
    std::string kind, rel;
    uint64_t begin, end;                    // byte range to flip bytes in
    std::set<std::string> owners;           // files whose bytes live there
  };
  std::vector<Target> targets;
  for (const char* f : {"b", "c", "d"}) targets.push_back({"stub", std::string("ns/") + f, 0, kStubFileSize, {f}});
  const std::vector<std::pair<ObjectId, std::set<std::string>>> packs = {
      {a_pack_, {"b"}}, {b_pack_, {"b"}}, {c_pack_, {"c"}}, {d_pack, {"d"}}};
  for (const auto& [id, owners] : packs) {
    const std::string rel = PackRel(id);
    const PackRegions r = RegionsOf(dir_.Sub(rel));
    targets.push_back({"pack header", rel, 0, r.header_end, owners});
    targets.push_back({"chunk", rel, r.header_end, r.meta_offset, owners});
    targets.push_back({"meta block", rel, r.meta_offset, r.meta_end, owners});
    targets.push_back({"index (chunk table, footer)", rel, r.table_offset, r.size, owners});
  }

  constexpr uint64_t kPerTarget = 12;  // bytes per region, spread over it, first and last included
  size_t flips = 0;
  for (const Target& t : targets) {
    const uint64_t len = t.end - t.begin;
    for (uint64_t k = 0; k < std::min<uint64_t>(kPerTarget, len); ++k) {
      const uint64_t off = t.begin + (len <= kPerTarget ? k : k * (len - 1) / (kPerTarget - 1));
      const std::string what = t.kind + " of " + t.rel + ", byte " + std::to_string(off);
      SCOPED_TRACE(what);
      FlipByte(dir_.Sub(t.rel), off);
      auto rep = Reopen();
      ASSERT_TRUE(rep.ok()) << rep.status().ToString();
      EXPECT_EQ(StoredObjects(dir_.path()), objects) << "recovery deleted or left something";
      ExpectFilesIntact(t.owners, what);
      if (t.kind == "chunk" && t.rel != PackRel(a_pack_)) {
        // The flipped chunk's file fails rather than read wrong bytes.
        for (const std::string& o : t.owners) EXPECT_FALSE(test::ReadContentAt(store_.get(), o).ok()) << o;
      }
      if (!rep->swept()) {
        auto f = store_->Fsck();
        ASSERT_TRUE(f.ok());
        EXPECT_FALSE(f->clean()) << "recovery found unreadable objects that fsck does not report";
      }
      FlipByte(dir_.Sub(t.rel), off);  // repair
      ++flips;
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_GT(flips, 100u);
  auto rep = Reopen();
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->swept());
  EXPECT_EQ(StoredObjects(dir_.path()), objects);
}

// A transient read error at mount (any open, read or directory listing)
// must not make recovery sweep what it could not read about.
TEST_F(RecoveryTest, TransientReadErrorsDeleteNothing) {
  BuildScene();
  store_.reset();
  const std::set<std::string> objects = StoredObjects(dir_.path());
  for (FaultEnv::Op op : {FaultEnv::kOpen, FaultEnv::kPRead, FaultEnv::kListDir, FaultEnv::kFstatAt}) {
    uint64_t calls;
    {
      FaultEnv counting;
      ASSERT_TRUE(Reopen(&counting).ok());
      store_.reset();
      calls = counting.calls(op);
    }
    for (uint64_t n = 0; n < calls; ++n) {
      SCOPED_TRACE(std::string(FaultEnv::OpName(op)) + " #" + std::to_string(n) + " fails with EIO");
      FaultEnv env;
      auto s = Store::Open(&env, dir_.path(), test::SmallChunks(kChunk));
      ASSERT_TRUE(s.ok());
      env.FailNth(op, n, EIO);
      auto rep = (*s)->Recover();
      if (rep.ok() && rep->swept()) {
        EXPECT_EQ(rep->orphan_packs_removed + rep->orphan_staging_removed, 0u);
      }
      s->reset();
      EXPECT_EQ(StoredObjects(dir_.path()), objects);
      ASSERT_TRUE(Reopen().ok());
      ExpectFilesIntact({}, "after the fault");
      store_.reset();
      if (HasFatalFailure()) return;
    }
  }
}

// A pack that a file needs and that is gone reads as EIO, never ENOENT,
// and recovery deletes nothing because of it.
TEST_F(RecoveryTest, MissingPackIsEioAndBlocksTheSweep) {
  BuildScene();
  ASSERT_TRUE(fs::remove(dir_.Sub(PackRel(c_pack_))));
  ObjectId orphan = 0;
  ASSERT_TRUE(store_->CreateStaging(&orphan).ok());
  const std::set<std::string> before = StoredObjects(dir_.path());
  auto rep = Reopen();
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(Mentions(rep->unreadable, PackRel(c_pack_), "missing")) << ::testing::PrintToString(rep->unreadable);
  EXPECT_EQ(StoredObjects(dir_.path()), before);
  EXPECT_EQ(store_->OpenPack(c_pack_).status().code(), EIO);
  EXPECT_EQ(test::ReadContentAt(store_.get(), "c").status().code(), EIO);
  auto f = store_->Fsck();
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(Mentions(f->errors, "ns/c", "missing")) << ::testing::PrintToString(f->errors);

  // A missing base too: b's pack needs a's.
  ASSERT_TRUE(fs::remove(dir_.Sub(PackRel(a_pack_))));
  rep = Reopen();
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(Mentions(rep->unreadable, PackRel(a_pack_), "needs it")) << ::testing::PrintToString(rep->unreadable);
  EXPECT_EQ(test::ReadContentAt(store_.get(), "b").status().code(), EIO);
  f = store_->Fsck();
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(Mentions(f->errors, PackRel(a_pack_), "base pack")) << ::testing::PrintToString(f->errors);
}

// An unreadable pack that no file names (a base whose header is damaged)
// may be needed by another unreadable object: fsck names it as an error
// and promises no removal.
TEST_F(RecoveryTest, FsckNamesUnreadableOrphanAndPromisesNoRemoval) {
  BuildScene();
  // A pack nothing names that cannot be read, and a readable orphan.
  const ObjectId forged = 0x00ab0000000000cdull;
  fs::create_directories(dir_.Sub("packs/00"));
  test::WriteFileBytes(dir_.Sub(PackRel(forged)), std::vector<uint8_t>(200, 0x11));
  fs::copy_file(dir_.Sub(PackRel(c_pack_)), dir_.Sub("packs/" + ObjectIdHex(c_pack_ ^ 1).substr(0, 2) + "/" +
                                                     ObjectIdHex(c_pack_ ^ 1) + ".pack"),
                fs::copy_options::overwrite_existing);
  store_.reset();
  auto s = Store::Open(Env::Default(), dir_.path(), [] {
    StoreOptions o = test::SmallChunks(kChunk);
    o.take_lock = false;
    o.create_if_missing = false;
    return o;
  }());
  ASSERT_TRUE(s.ok());
  auto f = (*s)->Fsck();
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(Mentions(f->errors, PackRel(forged), "cannot be read")) << ::testing::PrintToString(f->errors);
  EXPECT_TRUE(Mentions(f->warnings, "orphan pack", "kept")) << ::testing::PrintToString(f->warnings);
  for (const std::string& w : f->warnings) EXPECT_EQ(w.find("removes it"), std::string::npos) << w;
}

}  // namespace
}  // namespace ckptfs
