#include "store/store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "store/lossy_xattrs.h"
#include "seal/ocdbt_data.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using test::MakeSealedFile;
using test::MakeStagedFile;
using test::ReadContentAt;
using test::SmallChunks;
using test::TempDir;

std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::unique_ptr<Store> MustOpen(const std::string& path, StoreOptions opts = SmallChunks()) {
  auto s = Store::Open(Env::Default(), path, opts);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

// ---------------------------------------------------------------- Open

TEST(StoreOpenTest, InitialisesEmptyDirectory) {
  TempDir dir;
  auto store = MustOpen(dir.path());
  ASSERT_NE(store, nullptr);
  for (const char* d : {"ns", "packs", "staging", "tmp"}) {
    EXPECT_TRUE(std::filesystem::is_directory(dir.Sub(d))) << d;
  }
  auto j = nlohmann::json::parse(ReadText(dir.Sub("CKPTFS")));
  EXPECT_EQ(j["format"], "ckptfs");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["chunk_size"], 4096);
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("CKPTFS.tmp")));
  EXPECT_EQ(ReadText(dir.Sub("LOCK")), std::to_string(::getpid()) + "\n");
  EXPECT_GE(store->ns_fd(), 0);
  EXPECT_EQ(store->path(), dir.path());
}

TEST(StoreOpenTest, ReopensExistingStore) {
  TempDir dir;
  { ASSERT_TRUE(MakeSealedFile(MustOpen(dir.path()).get(), "f", {1, 2, 3}).ok()); }
  auto store = MustOpen(dir.path());
  auto c = ReadContentAt(store.get(), "f");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(*c, (std::vector<uint8_t>{1, 2, 3}));
}

TEST(StoreOpenTest, CreatesAbsentDirectoryButNotParents) {
  TempDir dir;
  EXPECT_NE(MustOpen(dir.Sub("new")), nullptr);
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("new/CKPTFS")));

  auto r = Store::Open(Env::Default(), dir.Sub("no/such/dir"), SmallChunks());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ENOENT);
  EXPECT_NE(r.status().message().find("backing directory " + dir.Sub("no/such/dir") +
                                      " does not exist; create it or pass an empty directory"),
            std::string::npos)
      << r.status().message();
}

TEST(StoreOpenTest, MissingDirectoryWithoutCreate) {
  TempDir dir;
  StoreOptions o = SmallChunks();
  o.create_if_missing = false;
  auto r = Store::Open(Env::Default(), dir.Sub("x"), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ENOENT);
  EXPECT_EQ(r.status().message(),
            "backing directory " + dir.Sub("x") + " does not exist; create it or pass an empty directory");
  // An empty directory is not a store either.
  r = Store::Open(Env::Default(), dir.path(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not a ckptfs store"), std::string::npos);
}

TEST(StoreOpenTest, RefusesForeignDirectory) {
  TempDir dir;
  test::WriteFileBytes(dir.Sub("important.txt"), {1});
  auto r = Store::Open(Env::Default(), dir.path(), SmallChunks());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ENOTEMPTY);
  EXPECT_NE(r.status().message().find("not empty and has no CKPTFS"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("LOCK")));  // left untouched
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("ns")));
}

TEST(StoreOpenTest, RefusesFileAsBacking) {
  TempDir dir;
  test::WriteFileBytes(dir.Sub("f"), {1});
  auto r = Store::Open(Env::Default(), dir.Sub("f"), SmallChunks());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ENOTDIR);
  EXPECT_NE(r.status().message().find("is not a directory"), std::string::npos);
}

TEST(StoreOpenTest, SecondDaemonGetsEBUSY) {
  TempDir dir;
  auto first = MustOpen(dir.path());
  auto second = Store::Open(Env::Default(), dir.path(), SmallChunks());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), EBUSY);
  EXPECT_EQ(second.status().message(), "store " + dir.path() + " is already served by another ckptfs daemon (pid " +
                                           std::to_string(::getpid()) + ")");
  // Read-only tools do not need the lock.
  StoreOptions ro = SmallChunks();
  ro.take_lock = false;
  ro.create_if_missing = false;
  EXPECT_TRUE(Store::Open(Env::Default(), dir.path(), ro).ok());
  // The lock goes with its holder.
  first.reset();
  EXPECT_NE(MustOpen(dir.path()), nullptr);
}

TEST(StoreOpenTest, RefusesNewerFormat) {
  TempDir dir;
  std::ofstream(dir.Sub("CKPTFS")) << R"({"format":"ckptfs","version":3,"chunk_size":4096})";
  auto r = Store::Open(Env::Default(), dir.path(), SmallChunks());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ENOTSUP);
  EXPECT_NE(r.status().message().find("format version 3"), std::string::npos);
  EXPECT_NE(r.status().message().find("upgrade ckptfs"), std::string::npos);
}

TEST(StoreOpenTest, RefusesDamagedSuperblock) {
  TempDir dir;
  std::ofstream(dir.Sub("CKPTFS")) << "{not json";
  auto r = Store::Open(Env::Default(), dir.path(), SmallChunks());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not valid JSON"), std::string::npos);
  std::ofstream(dir.Sub("CKPTFS"), std::ios::trunc) << R"({"format":"zfs","version":1})";
  EXPECT_FALSE(Store::Open(Env::Default(), dir.path(), SmallChunks()).ok());
}

TEST(StoreOpenTest, FinishesInterruptedInitialisation) {
  TempDir dir;
  { MustOpen(dir.path()); }
  std::filesystem::remove(dir.Sub("tmp"));
  std::filesystem::remove(dir.Sub("staging"));
  EXPECT_NE(MustOpen(dir.path()), nullptr);
  EXPECT_TRUE(std::filesystem::is_directory(dir.Sub("tmp")));

  TempDir dir2;  // crash while writing the superblock
  test::WriteFileBytes(dir2.Sub("CKPTFS.tmp"), {'{'});
  EXPECT_NE(MustOpen(dir2.path()), nullptr);
}

TEST(StoreOpenTest, UnwritableDirectory) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores permissions";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0555), 0);
  auto r = Store::Open(Env::Default(), dir.path(), SmallChunks());
  ::chmod(dir.path().c_str(), 0755);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not writable"), std::string::npos) << r.status().message();
}

TEST(StoreOpenTest, RejectsBadOptions) {
  TempDir dir;
  EXPECT_EQ(Store::Open(Env::Default(), dir.path(), SmallChunks(0)).status().code(), EINVAL);
  EXPECT_EQ(Store::Open(Env::Default(), "", SmallChunks()).status().code(), EINVAL);
}

// ------------------------------------------------------------- objects

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = MustOpen(dir_.path());
    ASSERT_NE(store_, nullptr);
  }
  size_t Packs() { return test::CountFiles(dir_.Sub("packs"), true); }
  size_t Staging() { return test::CountFiles(dir_.Sub("staging")); }
  size_t Tmp() { return test::CountFiles(dir_.Sub("tmp")); }
  UniqueFd OpenNs(const std::string& p, int flags = O_RDWR) {
    auto fd = store_->env()->OpenAt(store_->ns_fd(), p, flags, 0644);
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    return fd.ok() ? std::move(fd).value() : UniqueFd();
  }

  TempDir dir_;
  std::unique_ptr<Store> store_;
};

TEST_F(StoreTest, PublishOpenDeletePack) {
  std::vector<uint8_t> content = test::MixedContent(4096, 1);
  test::WriteFileBytes(dir_.Sub("src"), content);
  auto src = store_->env()->OpenAt(AT_FDCWD, dir_.Sub("src"), O_RDONLY);
  ASSERT_TRUE(src.ok());
  auto id = store_->PublishPack(src->get(), content.size());
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  const std::string hex = ObjectIdHex(*id);
  const std::string path = dir_.Sub("packs/" + hex.substr(0, 2) + "/" + hex + ".pack");
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(Tmp(), 0u);

  auto size = store_->PackFileSize(*id);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, std::filesystem::file_size(path));
  auto pack = store_->OpenPack(*id);
  ASSERT_TRUE(pack.ok()) << pack.status().ToString();
  EXPECT_EQ((*pack)->header().logical_size, content.size());
  EXPECT_EQ((*pack)->name(), hex);
  EXPECT_OK((*pack)->VerifyAll());

  ASSERT_OK(store_->DeletePack(*id));
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_OK(store_->DeletePack(*id));           // missing is fine
  EXPECT_OK(store_->DeletePack(0x1234567890));  // so is a missing XX dir
  // Something names every pack it opens: a missing one is damage (EIO).
  EXPECT_EQ(store_->OpenPack(*id).status().code(), EIO);
  EXPECT_NE(store_->OpenPack(*id).status().message().find("is missing"), std::string::npos);
}

TEST_F(StoreTest, StagingLifecycle) {
  ObjectId id = 0;
  auto fd = store_->CreateStaging(&id);
  ASSERT_TRUE(fd.ok());
  EXPECT_NE(id, 0u);
  EXPECT_TRUE(std::filesystem::exists(dir_.Sub("staging/" + ObjectIdHex(id) + ".stage")));
  EXPECT_TRUE(store_->OpenStaging(id).ok());
  EXPECT_OK(store_->SyncStagingDir());
  EXPECT_OK(store_->DeleteStaging(id));
  EXPECT_OK(store_->DeleteStaging(id));
  EXPECT_EQ(store_->OpenStaging(id).status().code(), ENOENT);
}

TEST_F(StoreTest, SealStubMovesContentIntoPack) {
  std::vector<uint8_t> content = test::MixedContent(4096, 2);
  auto staged = MakeStagedFile(store_.get(), "f", content);
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  auto staging = store_->OpenStaging(staged->object);
  ASSERT_TRUE(staging.ok());
  const struct timespec mtime[2] = {{0, UTIME_OMIT}, {1600000000, 123456789}};
  ASSERT_EQ(::futimens(staging->get(), mtime), 0);

  UniqueFd stub = OpenNs("f");
  auto sealed = store_->SealStub(stub.get(), *staged, staging->get());
  ASSERT_TRUE(sealed.ok()) << sealed.status().ToString();
  EXPECT_EQ(sealed->state, StubState::kSealed);
  EXPECT_EQ(sealed->size, content.size());
  EXPECT_EQ(sealed->gen, staged->gen + 1);
  EXPECT_EQ(*ReadStub(store_->env(), stub.get()), *sealed);
  EXPECT_EQ(*test::ReadContent(store_.get(), stub.get()), content);
  EXPECT_EQ(Staging(), 0u);
  EXPECT_EQ(Packs(), 1u);

  struct stat st;
  ASSERT_EQ(::fstat(stub.get(), &st), 0);
  EXPECT_EQ(st.st_mtim.tv_sec, 1600000000);
  EXPECT_EQ(st.st_mtim.tv_nsec, 123456789);

  // Not staged: refused.
  EXPECT_EQ(store_->SealStub(stub.get(), *sealed, staging->get()).status().code(), EINVAL);
}

TEST_F(StoreTest, SealStubAbandonsWhenFileChanged) {
  std::vector<uint8_t> content = test::RandomBytes(10000, 3);
  auto staged = MakeStagedFile(store_.get(), "f", content);
  ASSERT_TRUE(staged.ok());
  auto staging = store_->OpenStaging(staged->object);
  UniqueFd stub = OpenNs("f");
  bool asked = false;
  auto r = store_->SealStub(stub.get(), *staged, staging->get(), [&] {
    asked = true;
    return false;
  });
  EXPECT_TRUE(asked);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), EAGAIN);
  EXPECT_EQ(*ReadStub(store_->env(), stub.get()), *staged);
  EXPECT_EQ(Packs(), 0u);
  EXPECT_EQ(Staging(), 1u);
  EXPECT_EQ(Tmp(), 0u);
}

// A seal that would wait for the rest of its save (here an Orbax data file
// no tree describes yet) gives its slot back when it may, as the seal
// queue's do: it fails with kSealPostponed and leaves the stub staged. Its
// wait counts from its first try: once that lies kOcdbtNodeWait back, the
// seal goes on without waiting, as generic bytes. The test sets when the
// first try began: an hour ahead for the try that must be postponed, so
// that no slowness of the machine runs its bound out before it looks.
TEST_F(StoreTest, ASealThatWaitsForItsSaveIsPostponedWhenItMayBe) {
  ASSERT_OK(store_->env()->MkdirAt(store_->ns_fd(), "d", 0755));
  const std::string name = "d/0123456789abcdef0123456789abcdef";
  const std::vector<uint8_t> values = test::RandomBytes(100000, 4);
  auto staged = MakeStagedFile(store_.get(), name, values);
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  auto staging = store_->OpenStaging(staged->object);
  ASSERT_TRUE(staging.ok());
  UniqueFd stub = OpenNs(name);
  const auto now = std::chrono::steady_clock::now();
  const SealWait first{.may_postpone = true, .since = now + std::chrono::hours(1)};
  auto r = store_->SealStub(stub.get(), *staged, staging->get(), {}, first);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), kSealPostponed) << r.status().ToString();
  EXPECT_EQ(*ReadStub(store_->env(), stub.get()), *staged);
  EXPECT_EQ(Packs(), 0u);
  EXPECT_EQ(Tmp(), 0u);
  EXPECT_EQ(Staging(), 1u);

  const SealWait later{.may_postpone = true, .since = now - kOcdbtNodeWait};
  auto sealed = store_->SealStub(stub.get(), *staged, staging->get(), {}, later);
  ASSERT_TRUE(sealed.ok()) << sealed.status().ToString();
  EXPECT_EQ(*test::ReadContent(store_.get(), stub.get()), values);
  EXPECT_EQ(Staging(), 0u);
}

TEST_F(StoreTest, SealEmptyFile) {
  auto sealed = MakeSealedFile(store_.get(), "empty", {});
  ASSERT_TRUE(sealed.ok()) << sealed.status().ToString();
  EXPECT_EQ(sealed->size, 0u);
  EXPECT_EQ(sealed->object, 0u);  // no pack for no bytes
  EXPECT_EQ(Packs(), 0u);
  EXPECT_EQ(Staging(), 0u);
  auto c = ReadContentAt(store_.get(), "empty");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->empty());
}

TEST_F(StoreTest, ReleaseStubObjects) {
  auto sealed = MakeSealedFile(store_.get(), "a", test::RandomBytes(5000, 4));
  ASSERT_TRUE(sealed.ok());
  // Without the pack index nothing says which packs use this one as a base:
  // it is kept.
  EXPECT_OK(store_->ReleaseStubObjects(*sealed));
  EXPECT_EQ(Packs(), 1u);
  ASSERT_TRUE(store_->Recover().ok());  // loads the index, as a mount does
  auto staged = MakeStagedFile(store_.get(), "b", test::RandomBytes(5000, 5));
  ASSERT_TRUE(staged.ok());
  EXPECT_EQ(Packs(), 1u);
  EXPECT_EQ(Staging(), 1u);
  EXPECT_OK(store_->ReleaseStubObjects(*sealed));
  EXPECT_OK(store_->ReleaseStubObjects(*staged));
  EXPECT_OK(store_->ReleaseStubObjects(StubRecord{}));
  EXPECT_EQ(Packs(), 0u);
  EXPECT_EQ(Staging(), 0u);
}

// ------------------------------------------------------------ recovery

TEST_F(StoreTest, RecoverSealsStagedAndCollectsGarbage) {
  ASSERT_OK(store_->env()->MkdirAt(store_->ns_fd(), "dir", 0755));
  ASSERT_OK(store_->env()->MkdirAt(store_->ns_fd(), "dir/sub", 0755));
  std::vector<uint8_t> a = test::MixedContent(4096, 6), b = test::RandomBytes(3000, 7);
  ASSERT_TRUE(MakeSealedFile(store_.get(), "dir/a", a).ok());
  ASSERT_TRUE(MakeStagedFile(store_.get(), "dir/sub/b", b).ok());
  ASSERT_TRUE(MakeSealedFile(store_.get(), "empty", {}).ok());
  ASSERT_OK(store_->env()->SymlinkAt("dir/a", store_->ns_fd(), "link"));
  ASSERT_OK(store_->env()->LinkAt(store_->ns_fd(), "dir/a", store_->ns_fd(), "hardlink", 0));
  // Garbage: an unpublished pack, an orphan pack, an orphan staging file.
  test::WriteFileBytes(dir_.Sub("tmp/0123456789abcdef.pack.tmp"), {1, 2});
  {
    test::WriteFileBytes(dir_.Sub("src"), b);
    auto src = store_->env()->OpenAt(AT_FDCWD, dir_.Sub("src"), O_RDONLY);
    ASSERT_TRUE(store_->PublishPack(src->get(), b.size()).ok());
    ObjectId id;
    ASSERT_TRUE(store_->CreateStaging(&id).ok());
  }
  store_.reset();

  store_ = MustOpen(dir_.path());
  auto rep = store_->Recover();
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->stubs_scanned, 3u);  // the hard link is the same stub
  EXPECT_EQ(rep->staged_resealed, 1u);
  EXPECT_EQ(rep->tmp_files_removed, 1u);
  EXPECT_EQ(rep->orphan_packs_removed, 1u);
  EXPECT_EQ(rep->orphan_staging_removed, 1u);
  EXPECT_EQ(rep->broken_stubs, 0u);
  EXPECT_EQ(rep->actions.size(), 4u);

  EXPECT_EQ(*ReadContentAt(store_.get(), "dir/a"), a);
  EXPECT_EQ(*ReadContentAt(store_.get(), "hardlink"), a);
  EXPECT_EQ(*ReadContentAt(store_.get(), "dir/sub/b"), b);
  UniqueFd stub = OpenNs("dir/sub/b");
  EXPECT_EQ(ReadStub(store_->env(), stub.get())->state, StubState::kSealed);
  EXPECT_EQ(Packs(), 2u);
  EXPECT_EQ(Staging(), 0u);
  EXPECT_EQ(Tmp(), 0u);

  // Idempotent.
  rep = store_->Recover();
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->actions.empty());
  auto fsck = store_->Fsck();
  ASSERT_TRUE(fsck.ok());
  EXPECT_TRUE(fsck->clean());
  EXPECT_TRUE(fsck->warnings.empty());
  EXPECT_EQ(fsck->files_checked, 3u);
  EXPECT_EQ(fsck->packs_checked, 2u);
  EXPECT_EQ(fsck->bytes_checked, a.size() + b.size());
}

TEST_F(StoreTest, RecoverReportsStagedWithoutStagingFile) {
  auto staged = MakeStagedFile(store_.get(), "f", test::RandomBytes(100, 8));
  ASSERT_TRUE(staged.ok());
  ASSERT_OK(store_->DeleteStaging(staged->object));
  auto rep = store_->Recover();
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->broken_stubs, 1u);
  ASSERT_EQ(rep->actions.size(), 1u);
  EXPECT_NE(rep->actions[0].find("ns/f is staged but"), std::string::npos) << rep->actions[0];
  auto fsck = store_->Fsck();
  ASSERT_TRUE(fsck.ok());
  ASSERT_EQ(fsck->errors.size(), 1u);
  EXPECT_NE(fsck->errors[0].find("ns/f"), std::string::npos);
}

TEST_F(StoreTest, UnreadableStubBlocksGarbageCollection) {
  ASSERT_TRUE(MakeSealedFile(store_.get(), "good", test::RandomBytes(100, 9)).ok());
  ASSERT_TRUE(MakeSealedFile(store_.get(), "bad", test::RandomBytes(100, 10)).ok());
  test::WriteFileBytes(dir_.Sub("ns/bad"), std::vector<uint8_t>(128, 0x5a));  // both slots garbage
  auto rep = store_->Recover();
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->broken_stubs, 1u);
  EXPECT_EQ(rep->orphan_packs_removed, 0u);
  EXPECT_EQ(Packs(), 2u);  // bad's pack kept for a human to rescue
  auto fsck = store_->Fsck();
  ASSERT_TRUE(fsck.ok());
  ASSERT_EQ(fsck->errors.size(), 1u);
  EXPECT_NE(fsck->errors[0].find("ns/bad: unreadable stub"), std::string::npos) << fsck->errors[0];
}

// ---------------------------------------------------------------- fsck

TEST_F(StoreTest, FsckFindsDamageAndOrphans) {
  std::vector<uint8_t> content = test::RandomBytes(4096 * 2 + 10, 11);
  auto sealed = MakeSealedFile(store_.get(), "f", content);
  ASSERT_TRUE(sealed.ok());
  ASSERT_TRUE(MakeStagedFile(store_.get(), "s", {1, 2, 3}).ok());
  test::WriteFileBytes(dir_.Sub("tmp/x.pack.tmp"), {1});

  auto fsck = store_->Fsck();
  ASSERT_TRUE(fsck.ok());
  EXPECT_TRUE(fsck->clean());
  EXPECT_EQ(fsck->warnings.size(), 2u);  // s not sealed, tmp leftover

  // Flip one payload byte of f's pack.
  const std::string hex = ObjectIdHex(sealed->object);
  const std::string pack = dir_.Sub("packs/" + hex.substr(0, 2) + "/" + hex + ".pack");
  auto bytes = test::ReadFileBytes(pack);
  bytes[64 + 5000] ^= 1;
  test::WriteFileBytes(pack, bytes);
  fsck = store_->Fsck();
  ASSERT_TRUE(fsck.ok());
  ASSERT_EQ(fsck->errors.size(), 1u);
  EXPECT_NE(fsck->errors[0].find("ns/f: "), std::string::npos);
  EXPECT_NE(fsck->errors[0].find("chunk 1 (offset 4096): stored checksum mismatch"), std::string::npos)
      << fsck->errors[0];

  // Missing pack, plus an orphan.
  std::filesystem::rename(pack, dir_.Sub("packs/" + hex.substr(0, 2) + "/00000000000000ff.pack"));
  fsck = store_->Fsck();
  ASSERT_TRUE(fsck.ok());
  ASSERT_EQ(fsck->errors.size(), 1u);
  EXPECT_NE(fsck->errors[0].find("ns/f"), std::string::npos);
  bool orphan_warned = false;
  for (const auto& w : fsck->warnings) orphan_warned |= w.find("00000000000000ff.pack") != std::string::npos;
  EXPECT_TRUE(orphan_warned);
}

TEST_F(StoreTest, FsckChecksSizeAndSuperblock) {
  std::vector<uint8_t> content = test::RandomBytes(5000, 12);
  auto sealed = MakeSealedFile(store_.get(), "f", content);
  ASSERT_TRUE(sealed.ok());
  UniqueFd stub = OpenNs("f");
  StubRecord lie = *sealed;
  lie.size = 4999;
  ASSERT_TRUE(WriteStub(store_->env(), stub.get(), *sealed, lie).ok());
  std::filesystem::remove(dir_.Sub("CKPTFS"));
  auto fsck = store_->Fsck();
  ASSERT_TRUE(fsck.ok());
  ASSERT_EQ(fsck->errors.size(), 2u);
  EXPECT_NE(fsck->errors[0].find("CKPTFS"), std::string::npos);
  EXPECT_NE(fsck->errors[1].find("ns/f: stub says 4999 bytes"), std::string::npos) << fsck->errors[1];
}

// ------------------------------------------------------ lossy mode's lookups

TEST_F(StoreTest, NamespacePathFollowsTheStub) {
  ASSERT_OK(store_->env()->MkdirAt(store_->ns_fd(), "a", 0755));
  ASSERT_OK(store_->env()->MkdirAt(store_->ns_fd(), "a/b", 0755));
  ASSERT_TRUE(MakeStagedFile(store_.get(), "a/b/f", {1, 2, 3}).ok());
  UniqueFd stub = OpenNs("a/b/f");
  auto path = store_->NamespacePathOf(stub.get());
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  EXPECT_EQ(*path, "a/b/f");
  // Renamed while open: where it is now.
  ASSERT_OK(store_->env()->RenameAt(store_->ns_fd(), "a", store_->ns_fd(), "c"));
  path = store_->NamespacePathOf(stub.get());
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  EXPECT_EQ(*path, "c/b/f");
  // Unlinked: nowhere.
  ASSERT_OK(store_->env()->UnlinkAt(store_->ns_fd(), "c/b/f"));
  EXPECT_EQ(store_->NamespacePathOf(stub.get()).status().code(), ENOENT);
  // Not a stub of this store.
  EXPECT_FALSE(store_->NamespacePathOf(store_->ns_fd()).ok());
}

// Sets the last write time of `path`: a sealed file's stub, or a staged
// file's staging file.
void SetMtime(const std::string& path, const timespec& t) {
  const timespec times[2] = {{0, UTIME_OMIT}, t};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0) << path;
}

TEST_F(StoreTest, SiblingsAreTheSameSavesFilesBesideTheStub) {
  Env* env = store_->env();
  ASSERT_OK(env->MkdirAt(store_->ns_fd(), "d", 0755));
  ASSERT_OK(env->MkdirAt(store_->ns_fd(), "e", 0755));
  const std::vector<uint8_t> opt = test::RandomBytes(5000, 1);
  ASSERT_TRUE(MakeStagedFile(store_.get(), "d/model", test::RandomBytes(100, 2)).ok());
  ASSERT_TRUE(MakeSealedFile(store_.get(), "d/optimizer", opt).ok());
  auto staged = MakeStagedFile(store_.get(), "d/staged", {4, 5, 6});
  ASSERT_TRUE(staged.ok());
  ASSERT_TRUE(MakeSealedFile(store_.get(), "d/old", {7}).ok());
  ASSERT_TRUE(MakeSealedFile(store_.get(), "d/theirs", {8}).ok());
  ASSERT_EQ(::lchown(dir_.Sub("ns/d/theirs").c_str(), 4242, 4242), 0);
  ASSERT_TRUE(MakeSealedFile(store_.get(), "e/elsewhere", {9}).ok());
  ASSERT_TRUE(MakeSealedFile(store_.get(), "d/empty", {}).ok());

  const timespec written = {1700000000, 0};
  SetMtime(dir_.Sub("ns/d/optimizer"), {written.tv_sec - 5, 0});
  SetMtime(dir_.Sub("staging/" + ObjectIdHex(staged->object) + ".stage"), {written.tv_sec + 20, 0});
  SetMtime(dir_.Sub("ns/d/old"), {written.tv_sec - kSaveWindowSeconds - 1, 0});
  for (const char* other : {"ns/d/theirs", "ns/e/elsewhere", "ns/d/empty"}) SetMtime(dir_.Sub(other), written);

  UniqueFd model = OpenNs("d/model");
  std::unique_ptr<SiblingSource> siblings = store_->SiblingsOf(model.get(), written);
  // Not itself, another user's, an older save's, an empty one, nor another directory's.
  EXPECT_EQ(siblings->Candidates(), (std::vector<std::string>{"optimizer", "staged"}));
  auto sealed_src = siblings->Open("optimizer");
  ASSERT_TRUE(sealed_src.ok()) << sealed_src.status().ToString();
  std::vector<uint8_t> got((*sealed_src)->size());
  ASSERT_OK((*sealed_src)->ReadAt(0, got));
  EXPECT_EQ(got, opt);
  auto staged_src = siblings->Open("staged");
  ASSERT_TRUE(staged_src.ok()) << staged_src.status().ToString();
  got.resize((*staged_src)->size());
  ASSERT_OK((*staged_src)->ReadAt(0, got));
  EXPECT_EQ(got, (std::vector<uint8_t>{4, 5, 6}));
  EXPECT_FALSE(siblings->Open("old").ok());

  // A stub no longer in the namespace has no siblings.
  ASSERT_OK(env->UnlinkAt(store_->ns_fd(), "d/model"));
  EXPECT_TRUE(store_->SiblingsOf(model.get(), written)->Candidates().empty());
}

// The nearest directory's user.ckptfs.policy, up to ns/ itself; the
// mount's without one.
TEST(StorePolicyTest, NearestDirectoryPolicyWins) {
  TempDir dir;
  StoreOptions opts = SmallChunks();
  opts.lossy = 0.05;
  auto store = MustOpen(dir.path(), opts);
  ASSERT_NE(store, nullptr);
  Env* env = store->env();
  ASSERT_OK(env->MkdirAt(store->ns_fd(), "p", 0755));
  ASSERT_OK(env->MkdirAt(store->ns_fd(), "p/q", 0755));
  ASSERT_OK(env->MkdirAt(store->ns_fd(), "p/q/r", 0755));
  auto set = [&](const std::string& sub, const std::string& text) {
    return env->SetXattr(dir.Sub(sub), kPolicyXattr, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()), 0);
  };
  if (Status s = set("ns/p", "lossy=0.02,scope=all"); !s.ok()) {
    GTEST_SKIP() << "no user extended attributes here: " << s.ToString();
  }
  ASSERT_TRUE(MakeStagedFile(store.get(), "p/q/r/f", {1}).ok());
  ASSERT_TRUE(MakeStagedFile(store.get(), "top", {1}).ok());
  auto stub = env->OpenAt(store->ns_fd(), "p/q/r/f", O_RDWR);
  auto top = env->OpenAt(store->ns_fd(), "top", O_RDWR);
  ASSERT_TRUE(stub.ok() && top.ok());
  EXPECT_EQ(store->PolicyFor(stub->get()), (LossyPolicy{0.02, lossy::LossyScope::kAll}));
  EXPECT_EQ(store->PolicyFor(top->get()), (LossyPolicy{0.05, lossy::LossyScope::kModels}));
  ASSERT_OK(set("ns/p/q", "lossless"));
  EXPECT_EQ(store->PolicyFor(stub->get()), LossyPolicy{});
  ASSERT_OK(set("ns", "lossy=0.1"));
  EXPECT_EQ(store->PolicyFor(top->get()), (LossyPolicy{0.1, lossy::LossyScope::kModels}));
  // Unlinked, it has no directories: no policy can be read for it.
  ASSERT_OK(env->UnlinkAt(store->ns_fd(), "top"));
  EXPECT_EQ(store->PolicyFor(top->get()), LossyPolicy{});
}

// --------------------------------------------------------------- usage

TEST_F(StoreTest, Usage) {
  ASSERT_OK(store_->env()->MkdirAt(store_->ns_fd(), "d", 0755));
  std::vector<uint8_t> zeros(4096 * 10, 0);
  auto sealed = MakeSealedFile(store_.get(), "d/zeros", zeros);
  ASSERT_TRUE(sealed.ok());
  ASSERT_TRUE(MakeStagedFile(store_.get(), "d/staged", test::RandomBytes(8192, 13)).ok());
  ASSERT_TRUE(MakeSealedFile(store_.get(), "top", {}).ok());

  auto all = store_->Usage();
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), 3u);
  auto sub = store_->Usage("/d/");
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  ASSERT_EQ(sub->size(), 2u);
  for (const FileUsage& u : *sub) {
    if (u.path == "d/zeros") {
      EXPECT_FALSE(u.staged);
      EXPECT_EQ(u.logical, zeros.size());
      EXPECT_EQ(u.stored, *store_->PackFileSize(sealed->object) + kStubFileSize);
      EXPECT_LT(u.stored, 1024u);
    } else {
      EXPECT_EQ(u.path, "d/staged");
      EXPECT_TRUE(u.staged);
      EXPECT_EQ(u.logical, 8192u);
      EXPECT_GE(u.stored, 8192u);
    }
  }
  auto one = store_->Usage("d/zeros");
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].path, "d/zeros");
  EXPECT_EQ(store_->Usage("../etc").status().code(), EINVAL);
  EXPECT_EQ(store_->Usage("nope").status().code(), ENOENT);
}

}  // namespace
}  // namespace ckptfs
