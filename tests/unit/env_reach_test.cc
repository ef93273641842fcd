// The calls that once went around Env reach a FaultEnv now: the store's
// lock (flock), the inode table's lookups (openat + fstat) and the mount's
// root, the pack reader's read-ahead advice (posix_fadvise) and the clock a
// pack is stamped with. An injected fault comes back as an error that says
// what failed, and nothing stored is lost.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "fuse/fs.h"
#include "store/store.h"
#include "tests/unit/fault_env.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using test::SmallChunks;
using test::TempDir;

class EnvReachTest : public ::testing::Test {
 protected:
  // A store holding one sealed file, written with a healthy Env.
  void SetUp() override {
    auto s = Store::Open(Env::Default(), dir_.path(), SmallChunks());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE(test::MakeSealedFile(s->get(), "f", content_).ok());
  }

  // After the faults: a healthy daemon finds the file whole and the store clean.
  void CheckNothingLost() {
    auto s = Store::Open(Env::Default(), dir_.path(), SmallChunks());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE((*s)->Recover().ok());
    auto c = test::ReadContentAt(s->get(), "f");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(*c, content_);
    auto fsck = (*s)->Fsck();
    ASSERT_TRUE(fsck.ok());
    EXPECT_TRUE(fsck->clean()) << (fsck->errors.empty() ? "" : fsck->errors[0]);
  }

  std::unique_ptr<Store> OpenThrough(FaultEnv* env) {
    auto s = Store::Open(env, dir_.path(), SmallChunks());
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  TempDir dir_;
  const std::vector<uint8_t> content_ = test::MixedContent(4096, 3);
};

TEST_F(EnvReachTest, FailedLockIsAClearErrorAndOpensNothing) {
  FaultEnv env;
  env.FailNth(FaultEnv::kFlock, 1, EIO);
  auto s = Store::Open(&env, dir_.path(), SmallChunks());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), EIO);
  EXPECT_NE(s.status().message().find("cannot lock store " + dir_.path()), std::string::npos)
      << s.status().message();
  EXPECT_NE(s.status().message().find("injected fault: flock"), std::string::npos) << s.status().message();
  EXPECT_EQ(env.calls(FaultEnv::kFlock), 1u);
  CheckNothingLost();
}

TEST_F(EnvReachTest, LockHeldElsewhereIsEBUSY) {
  FaultEnv env;
  env.FailNth(FaultEnv::kFlock, 1, EWOULDBLOCK);
  auto s = Store::Open(&env, dir_.path(), SmallChunks());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), EBUSY);
  EXPECT_NE(s.status().message().find("already served by another ckptfs daemon"), std::string::npos)
      << s.status().message();
  CheckNothingLost();
}

TEST_F(EnvReachTest, MountRootThatCannotBeStatted) {
  FaultEnv env;
  auto store = OpenThrough(&env);
  ASSERT_NE(store, nullptr);
  env.FailNth(FaultEnv::kFstat, 1, EIO);
  auto fs = Filesystem::Open(store.get(), FsConfig{});
  ASSERT_FALSE(fs.ok());
  EXPECT_EQ(fs.status().code(), EIO);
  EXPECT_NE(fs.status().message().find("cannot stat the root of the mount"), std::string::npos)
      << fs.status().message();
  env.FailNth(FaultEnv::kOpen, 1, EMFILE);
  fs = Filesystem::Open(store.get(), FsConfig{});
  ASSERT_FALSE(fs.ok());
  EXPECT_EQ(fs.status().code(), EMFILE);
  store.reset();
  CheckNothingLost();
}

// LOOKUP opens the entry (O_PATH) and stats it: either failing is the
// request's error, and counts no lookup.
TEST_F(EnvReachTest, LookupFaultsAreTheRequestsError) {
  FaultEnv env;
  auto store = OpenThrough(&env);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Recover().ok());
  auto fs = Filesystem::Open(store.get(), FsConfig{});
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  InodeTable& inodes = (*fs)->inodes();
  struct stat st {};
  for (FaultEnv::Op op : {FaultEnv::kOpen, FaultEnv::kFstat}) {
    env.FailNth(op, 1, EIO);
    auto inode = inodes.Lookup(inodes.root(), "f", &st);
    ASSERT_FALSE(inode.ok()) << FaultEnv::OpName(op);
    EXPECT_EQ(inode.status().code(), EIO);
    EXPECT_NE(inode.status().message().find(std::string("injected fault: ") + FaultEnv::OpName(op)),
              std::string::npos)
        << inode.status().message();
  }
  auto inode = inodes.Lookup(inodes.root(), "f", &st);
  ASSERT_TRUE(inode.ok()) << inode.status().ToString();
  EXPECT_EQ(inodes.Find(st.st_dev, st.st_ino), *inode);
  {
    auto content = (*fs)->ContentOf(**inode);
    ASSERT_TRUE(content.ok()) << content.status().ToString();
    std::vector<uint8_t> got(content_.size() + 1);
    auto n = (*content)->Read(0, got);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    got.resize(*n);
    EXPECT_EQ(got, content_);
  }
  inodes.Forget(**inode, 1);  // the one lookup that succeeded was the only one counted
  EXPECT_EQ(inodes.Find(st.st_dev, st.st_ino), nullptr);
  fs->reset();
  store.reset();
  CheckNothingLost();
}

// Read-ahead advice that fails changes nothing about what is read.
TEST_F(EnvReachTest, FailedReadAheadAdviceIsIgnored) {
  FaultEnv env;
  auto store = OpenThrough(&env);
  ASSERT_NE(store, nullptr);
  env.FailNth(FaultEnv::kFadvise, 1, EIO, /*sticky=*/true);
  auto c = test::ReadContentAt(store.get(), "f");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(*c, content_);
  EXPECT_GE(env.calls(FaultEnv::kFadvise), 1u);
  EXPECT_GE(env.injected(), 1u);
}

TEST_F(EnvReachTest, PackIsStampedWithTheEnvsClock) {
  FaultEnv env;
  auto store = OpenThrough(&env);
  ASSERT_NE(store, nullptr);
  const uint64_t when = 1234567890123456789ull;
  env.SetWallTime(when);
  auto rec = test::MakeSealedFile(store.get(), "g", content_);
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  auto pack = store->OpenPack(rec->object);
  ASSERT_TRUE(pack.ok()) << pack.status().ToString();
  ASSERT_TRUE((*pack)->meta_status().ok());
  EXPECT_EQ((*pack)->meta().sealed_ns, when);
}

}  // namespace
}  // namespace ckptfs
