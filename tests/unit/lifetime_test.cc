// POSIX lifetime of a file's content in the FUSE layer (InodeTable +
// FileContent), driven in the order the kernel's requests can arrive, with
// no mount: a file's objects live until its last link is gone, the kernel
// forgot the inode and no handle is open, whichever comes last.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "fuse/fs.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using test::MakeSealedFile;
using test::MakeStagedFile;
using test::RandomBytes;
using test::SmallChunks;
using test::TempDir;

class LifetimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = Store::Open(Env::Default(), dir_.path(), SmallChunks());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
    ASSERT_TRUE(store_->Recover().ok());  // loads the pack index, as a mount does
    auto fs = Filesystem::Open(store_.get(), FsConfig{});
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    fs_ = std::move(fs).value();
  }

  // LOOKUP as ops.cc does it: counts a lookup and loads the content (stat).
  Inode* Lookup(const char* name) {
    struct stat st {};
    auto inode = fs_->inodes().Lookup(fs_->inodes().root(), name, &st);
    EXPECT_TRUE(inode.ok()) << inode.status().ToString();
    if (!inode.ok()) return nullptr;
    EXPECT_TRUE(fs_->Stat(**inode, &st).ok());
    return *inode;
  }
  // OPEN as ops.cc does it.
  std::shared_ptr<FileContent> Open(Inode* inode) {
    auto content = fs_->ContentOf(*inode);
    EXPECT_TRUE(content.ok()) << content.status().ToString();
    fs_->inodes().Opened(*inode);
    EXPECT_FALSE(content.value()->OnOpen(false).must_wait());
    return content.value();
  }
  // RELEASE as ops.cc does it (the content stays referenced by the caller).
  void Release(Inode* inode, const std::shared_ptr<FileContent>& content) {
    content->OnRelease(false);
    fs_->inodes().Released(*inode);
  }
  // Rename `from` over `to` in ns/, as OpRename does.
  void ReplaceWith(const char* from, const char* to) {
    Inode* victim = fs_->inodes().Find(StatOf(to).st_dev, StatOf(to).st_ino);
    ASSERT_EQ(::renameat(store_->ns_fd(), from, store_->ns_fd(), to), 0);
    fs_->ForgetLinkIfGone(victim);
  }
  void Unlink(const char* name) {
    Inode* victim = fs_->inodes().Find(StatOf(name).st_dev, StatOf(name).st_ino);
    ASSERT_EQ(::unlinkat(store_->ns_fd(), name, 0), 0);
    fs_->ForgetLinkIfGone(victim);
  }
  struct stat StatOf(const char* name) {
    struct stat st {};
    EXPECT_EQ(::fstatat(store_->ns_fd(), name, &st, AT_SYMLINK_NOFOLLOW), 0) << name;
    return st;
  }
  bool PackExists(ObjectId id) { return store_->PackFileSize(id).ok(); }
  bool StagingExists(ObjectId id) { return store_->OpenStaging(id).ok(); }
  // A sealed file of 20000 random bytes, looked up, opened and read whole
  // (which opens its pack): a reader whose pages may be pushed.
  struct OpenSealed {
    ObjectId pack = 0;
    Inode* inode = nullptr;
    std::shared_ptr<FileContent> content;
    std::vector<uint8_t> bytes;
  };
  OpenSealed OpenAndReadSealed(const char* name, uint64_t seed) {
    const auto bytes = RandomBytes(20000, seed);
    auto rec = MakeSealedFile(store_.get(), name, bytes);
    EXPECT_TRUE(rec.ok()) << rec.status().ToString();
    if (!rec.ok()) return {};
    OpenSealed f{rec->object, Lookup(name), nullptr, bytes};
    f.content = Open(f.inode);
    EXPECT_EQ(ReadAll(*f.content, bytes.size()), bytes);
    return f;
  }
  static std::vector<uint8_t> ReadAll(FileContent& c, size_t n) {
    std::vector<uint8_t> out(n + 1);
    auto got = c.Read(0, out);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    out.resize(got.ok() ? *got : 0);
    return out;
  }

  TempDir dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Filesystem> fs_;
};

// The race of the issue: the reader's LOOKUP returned the old file, the
// writer's rename replaced it, and only then the reader's OPEN arrives.
TEST_F(LifetimeTest, ReplacedBetweenLookupAndOpenReadsTheOldFileWhole) {
  const auto old_bytes = RandomBytes(20000, 1);
  auto old_rec = MakeSealedFile(store_.get(), "target", old_bytes);
  ASSERT_TRUE(old_rec.ok());
  ASSERT_TRUE(MakeSealedFile(store_.get(), "target.tmp", RandomBytes(30000, 2)).ok());

  Inode* old = Lookup("target");
  ASSERT_NE(old, nullptr);
  ReplaceWith("target.tmp", "target");
  EXPECT_TRUE(PackExists(old_rec->object)) << "freed while the kernel still holds a lookup";

  auto content = Open(old);
  EXPECT_EQ(ReadAll(*content, old_bytes.size()), old_bytes);
  Release(old, content);
  EXPECT_TRUE(PackExists(old_rec->object)) << "freed before the kernel forgot the inode";
  fs_->inodes().Forget(*old, 1);
  EXPECT_FALSE(PackExists(old_rec->object)) << "not freed after the last forget";
}

// The kernel may deliver the FORGET before the RELEASE of the last handle.
TEST_F(LifetimeTest, ForgetBeforeReleaseKeepsTheContentUntilTheRelease) {
  const auto bytes = RandomBytes(10000, 3);
  auto rec = MakeSealedFile(store_.get(), "f", bytes);
  ASSERT_TRUE(rec.ok());
  Inode* inode = Lookup("f");
  auto content = Open(inode);
  Unlink("f");
  fs_->inodes().Forget(*inode, 1);
  EXPECT_TRUE(PackExists(rec->object));
  EXPECT_EQ(ReadAll(*content, bytes.size()), bytes);
  Release(inode, content);
  EXPECT_FALSE(PackExists(rec->object));
}

TEST_F(LifetimeTest, UnlinkedStagedFileKeepsItsStagingFileUntilForgotten) {
  const auto bytes = RandomBytes(5000, 4);
  auto rec = MakeStagedFile(store_.get(), "s", bytes);
  ASSERT_TRUE(rec.ok());
  Inode* inode = Lookup("s");
  Unlink("s");
  auto content = Open(inode);
  EXPECT_EQ(ReadAll(*content, bytes.size()), bytes);
  Release(inode, content);
  EXPECT_TRUE(StagingExists(rec->object));
  fs_->inodes().Forget(*inode, 1);
  EXPECT_FALSE(StagingExists(rec->object));
}

TEST_F(LifetimeTest, HardLinkKeepsTheSharedContent) {
  auto rec = MakeSealedFile(store_.get(), "a", RandomBytes(8000, 5));
  ASSERT_TRUE(rec.ok());
  ASSERT_EQ(::linkat(store_->ns_fd(), "a", store_->ns_fd(), "b", 0), 0);
  Inode* a = Lookup("a");
  EXPECT_EQ(Lookup("b"), a);  // one inode for both names
  Unlink("a");
  fs_->inodes().Forget(*a, 2);
  EXPECT_TRUE(PackExists(rec->object));
  Inode* b = Lookup("b");
  Unlink("b");
  fs_->inodes().Forget(*b, 1);
  EXPECT_FALSE(PackExists(rec->object));
}

// The kernel may forget a file's inode while the seal queue still holds
// its content (memory pressure, drop_caches): the next lookup must reuse
// that content, not load a second one for the same stub, which would seal
// and stage behind the first one's back.
TEST_F(LifetimeTest, InodeForgottenWhileContentIsQueuedReusesTheContent) {
  auto rec = MakeStagedFile(store_.get(), "q", RandomBytes(6000, 8));
  ASSERT_TRUE(rec.ok());
  Inode* first = Lookup("q");
  auto queued = fs_->ContentOf(*first);  // what SealQueue::Push keeps
  ASSERT_TRUE(queued.ok());
  fs_->inodes().Forget(*first, 1);
  Inode* second = Lookup("q");
  auto again = fs_->ContentOf(*second);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), queued->get());
  // It is still freed once its file is gone and forgotten.
  Unlink("q");
  fs_->inodes().Forget(*second, 1);
  EXPECT_FALSE(StagingExists(rec->object));
}

// A test's stand-in for a deferred request: says when it starts waiting,
// then waits on `hold` as DeferredOpen does, and records how it ended.
class RecordingOp : public DeferredOp {
 public:
  explicit RecordingOp(FileContent::PushHold hold) : hold_(std::move(hold)) {}
  void Wait() override {
    waiting_.set_value();
    hold_.Wait();
  }
  void Run() override {
    hold_ = FileContent::PushHold();
    ended_.set_value(true);
  }
  void Cancel() override {
    hold_ = FileContent::PushHold();
    ended_.set_value(false);
  }
  std::future<void> waiting() { return waiting_.get_future(); }
  std::future<bool> ran() { return ended_.get_future(); }  // false: cancelled

 private:
  FileContent::PushHold hold_;
  std::promise<void> waiting_;
  std::promise<bool> ended_;
};

// Pages of a file go into the kernel's page cache (PagePush) only while they
// are its sealed content and nothing can write it. A writable open never
// waits for the pushes in flight where it is called (a FUSE thread): it
// keeps new ones out at once and says it must wait, and the rest of it runs
// on DeferredOps' thread once the push in flight has landed.
TEST_F(LifetimeTest, PagePushesOnlySealedContentWithoutWriters) {
  auto [pack, inode, content, bytes] = OpenAndReadSealed("p", 8);
  ASSERT_NE(content, nullptr);
  ASSERT_GT(content->BeginPagePush(pack), 0u);
  EXPECT_EQ(content->BeginPagePush(pack + 1), 0u) << "another pack's bytes";
  EXPECT_FALSE(content->OnOpen(false).must_wait()) << "a readable open waits for nothing";
  content->OnRelease(false);

  FileContent::PushHold hold = content->OnOpen(true);  // returns with the push in flight
  ASSERT_TRUE(hold.must_wait());
  EXPECT_EQ(content->BeginPagePush(pack), 0u) << "a push while a writable open is pending";
  DeferredOps deferred;
  deferred.Start();
  auto op = std::make_unique<RecordingOp>(std::move(hold));
  std::future<void> waiting = op->waiting();
  std::future<bool> ran = op->ran();
  deferred.Push(std::move(op));
  waiting.get();
  EXPECT_NE(ran.wait_for(std::chrono::seconds(0)), std::future_status::ready) << "ran before the push landed";
  EXPECT_EQ(content->BeginPagePush(pack), 0u) << "a push while a writable open is pending";
  content->EndPagePush(pack, 0, true);
  EXPECT_TRUE(ran.get());
  EXPECT_EQ(content->BeginPagePush(pack), 0u) << "a push while a writer is open";
  content->OnRelease(true);
  const uint64_t cs = content->BeginPagePush(pack);
  EXPECT_GT(cs, 0u);
  content->EndPagePush(pack, 0, true);

  ASSERT_TRUE(content->Truncate(100).ok());  // staged now: its pages are not a pack's
  EXPECT_EQ(content->BeginPagePush(pack), 0u);
  Release(inode, content);
}

// A truncate (SETATTR) has no writable handle to keep pushes out: its hold
// does, and the truncate itself never waits (EAGAIN while a push is in flight).
TEST_F(LifetimeTest, TruncateHoldsPagePushesOutWithoutWaiting) {
  auto [pack, inode, content, bytes] = OpenAndReadSealed("t", 9);
  ASSERT_NE(content, nullptr);
  {
    FileContent::PushHold idle = content->HoldPagePushes();
    EXPECT_FALSE(idle.must_wait());
    EXPECT_EQ(content->BeginPagePush(pack), 0u) << "a push while a truncate is pending";
  }
  ASSERT_GT(content->BeginPagePush(pack), 0u);
  FileContent::PushHold hold = content->HoldPagePushes();
  ASSERT_TRUE(hold.must_wait());
  EXPECT_EQ(content->BeginPagePush(pack), 0u) << "a push while a truncate is pending";
  EXPECT_EQ(content->Truncate(100).code(), EAGAIN);
  content->EndPagePush(pack, 0, true);
  hold.Wait();
  ASSERT_TRUE(content->Truncate(100).ok());
  hold = FileContent::PushHold();
  EXPECT_EQ(content->BeginPagePush(pack), 0u) << "staged: nothing to push";
  auto rest = ReadAll(*content, 100);
  EXPECT_EQ(rest, std::vector<uint8_t>(bytes.begin(), bytes.begin() + 100));
  Release(inode, content);
}

// At unmount DeferredOps answers what is queued (Cancel) and lets the
// request in progress finish; one pushed after Stop is cancelled at once.
TEST_F(LifetimeTest, DeferredOpsStopCancelsWhatIsQueued) {
  auto [pack, inode, content, bytes] = OpenAndReadSealed("s", 10);
  ASSERT_NE(content, nullptr);
  ASSERT_GT(content->BeginPagePush(pack), 0u);
  DeferredOps deferred;
  deferred.Start();
  auto first = std::make_unique<RecordingOp>(content->HoldPagePushes());
  auto second = std::make_unique<RecordingOp>(content->HoldPagePushes());
  std::future<void> first_waiting = first->waiting();
  std::future<bool> first_ran = first->ran();
  std::future<bool> second_ran = second->ran();
  deferred.Push(std::move(first));
  deferred.Push(std::move(second));
  first_waiting.get();
  std::thread stopper([&] { deferred.Stop(); });
  EXPECT_FALSE(second_ran.get()) << "a queued request was run, not cancelled";
  content->EndPagePush(pack, 0, true);
  stopper.join();
  EXPECT_TRUE(first_ran.get()) << "the request in progress was not finished";
  auto late = std::make_unique<RecordingOp>(content->HoldPagePushes());
  std::future<bool> late_ran = late->ran();
  deferred.Push(std::move(late));
  EXPECT_FALSE(late_ran.get());
  EXPECT_GT(content->BeginPagePush(pack), 0u) << "a hold outlived its request";
  content->EndPagePush(pack, 0, true);
  Release(inode, content);
}

// At unmount the kernel sends no FORGET: the daemon drops every inode at
// exit, freeing deleted files' content and leaving linked files alone.
TEST_F(LifetimeTest, DropAllAtExitFreesDeletedFilesOnly) {
  auto gone = MakeSealedFile(store_.get(), "gone", RandomBytes(8000, 6));
  auto kept = MakeSealedFile(store_.get(), "kept", RandomBytes(8000, 7));
  ASSERT_TRUE(gone.ok() && kept.ok());
  Lookup("gone");
  Lookup("kept");
  Unlink("gone");
  EXPECT_TRUE(PackExists(gone->object));
  fs_->inodes().DropAll();
  EXPECT_FALSE(PackExists(gone->object));
  EXPECT_TRUE(PackExists(kept->object));
}

}  // namespace
}  // namespace ckptfs
