// The seal queue (fuse/seal_queue.h) is fair across owners: small files
// never wait for a big seal in progress, and owners take turns within a
// lane. A seal of a deleted file is cancelled between chunks, and Drain
// (the unmount) does not wait for it. Interleavings are forced with gates
// (a seal waits at one until the test opens it), never with sleeps.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fuse/fs.h"
#include "fuse/seal_queue.h"
#include "tests/unit/fault_env.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using test::MakeStagedFile;
using test::RandomBytes;
using test::SmallChunks;
using test::TempDir;

// The failure bound of every wait: a test that would hang fails instead.
constexpr std::chrono::seconds kBound{60};

// A point a seal stops at until the test opens it.
class Gate {
 public:
  void Pass() {
    std::unique_lock lk(mu_);
    reached_ = true;
    cv_.notify_all();
    cv_.wait(lk, [&] { return open_; });
  }
  bool WaitReached() {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, kBound, [&] { return reached_; });
  }
  void Open() {
    std::lock_guard lk(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool reached_ = false;
  bool open_ = false;
};

// The order seals started in.
class SealLog {
 public:
  void Add(const std::string& name) {
    std::lock_guard lk(mu_);
    order_.push_back(name);
    cv_.notify_all();
  }
  bool WaitFor(size_t n) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, kBound, [&] { return order_.size() >= n; });
  }
  std::vector<std::string> order() {
    std::lock_guard lk(mu_);
    return order_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> order_;
};

class FakeFile : public SealTarget {
 public:
  FakeFile(std::string name, uid_t owner, bool small, SealLog* log, Gate* gate = nullptr)
      : name_(std::move(name)), cls_{owner, small}, log_(log), gate_(gate) {}
  Status SealIfIdle(bool, bool) override {
    log_->Add(name_);
    if (gate_ != nullptr) gate_->Pass();
    sealed_ = true;
    return Status::Ok();
  }
  bool NeedsSeal() override { return !sealed_; }
  const std::string& label() const override { return name_; }
  SealClass ClassForSeal() override { return cls_; }

 private:
  std::string name_;
  SealClass cls_;
  SealLog* log_;
  Gate* gate_;
  std::atomic<bool> sealed_{false};
};

constexpr bool kSmall = true, kBig = false;

// Opens its gates when a test ends: declared after the queue, so that on a
// failed assertion the gates open before the queue drains.
struct OpenAtExit {
  std::vector<Gate*> gates;
  ~OpenAtExit() {
    for (Gate* g : gates) g->Open();
  }
};

// Pushes fake files onto a queue and keeps them alive.
class Pusher {
 public:
  Pusher(SealQueue* q, SealLog* log) : q_(q), log_(log) {}
  void operator()(const std::string& name, uid_t owner, bool small, Gate* gate = nullptr) {
    files_.push_back(std::make_shared<FakeFile>(name, owner, small, log_, gate));
    q_->Push(files_.back());
  }

 private:
  SealQueue* q_;
  SealLog* log_;
  std::vector<std::shared_ptr<SealTarget>> files_;
};

// With one seal thread busy with user 1's big file, users 2 and 3's small
// files are sealed anyway (the small lane's worker), and owners take turns:
// user 2's three queued small files do not go before user 3's two.
TEST(SealQueueTest, SmallFilesPassABigSealAndOwnersTakeTurns) {
  SealLog log;
  Gate big_gate, small_gate;
  SealQueue q(1);
  q.Start();
  const OpenAtExit open_at_exit{{&big_gate, &small_gate}};
  Pusher push(&q, &log);
  push("G", 1, kBig, &big_gate);
  ASSERT_TRUE(big_gate.WaitReached()) << "the big seal did not start";
  push("S0", 2, kSmall, &small_gate);
  ASSERT_TRUE(small_gate.WaitReached()) << "a small file waited for a big seal in progress";
  // Both workers are busy: these queue up.
  push("a1", 2, kSmall);
  push("a2", 2, kSmall);
  push("a3", 2, kSmall);
  push("b1", 3, kSmall);
  push("b2", 3, kSmall);
  push("x1", 1, kBig);
  push("x2", 1, kBig);
  push("y1", 4, kBig);
  small_gate.Open();
  ASSERT_TRUE(log.WaitFor(7));
  // Every small file is sealed while the big seal still holds the only seal thread.
  EXPECT_EQ(log.order(), (std::vector<std::string>{"G", "S0", "a1", "b1", "a2", "b2", "a3"}));
  big_gate.Open();
  q.Drain();
  EXPECT_EQ(log.order(),
            (std::vector<std::string>{"G", "S0", "a1", "b1", "a2", "b2", "a3", "x1", "y1", "x2"}));
}

// One owner's files seal one at a time (with one seal thread), in the
// order pushed: a checkpoint's seal finds its predecessor sealed, to be
// coded against. The small-file worker passes over an owner whose big
// seal runs and takes another owner's file.
TEST(SealQueueTest, AnOwnersFilesSealOneAtATime) {
  SealLog log;
  Gate big_gate;
  SealQueue q(1);
  q.Start();
  const OpenAtExit open_at_exit{{&big_gate}};
  Pusher push(&q, &log);
  push("G", 1, kBig, &big_gate);
  ASSERT_TRUE(big_gate.WaitReached()) << "the big seal did not start";
  push("mine", 1, kSmall);
  push("theirs", 2, kSmall);
  ASSERT_TRUE(log.WaitFor(2));
  EXPECT_EQ(log.order(), (std::vector<std::string>{"G", "theirs"})) << "owner 1's file sealed beside its big seal";
  big_gate.Open();
  q.Drain();
  EXPECT_EQ(log.order(), (std::vector<std::string>{"G", "theirs", "mine"}));
}

constexpr uint32_t kChunk = 4096;

// An Env whose first chunk read of a staging file at or after `gate_at`
// stops at a gate: a seal in progress, between its chunks.
class GatedEnv : public FaultEnv {
 public:
  void Arm(uint64_t at) { gate_at_ = at; }
  Result<size_t> PRead(int fd, std::span<uint8_t> buf, uint64_t off) override {
    if (gate_at_ != 0 && off >= gate_at_ && off % kChunk == 0 && buf.size() == kChunk && IsStaging(fd)) {
      if (reads_after_.fetch_add(1) == 0) gate.Pass();
    }
    return FaultEnv::PRead(fd, buf, off);
  }
  int reads_after() const { return reads_after_.load(); }
  Gate gate;

 private:
  static bool IsStaging(int fd) { return FdPathForLog(fd).find("/staging/") != std::string::npos; }
  std::atomic<uint64_t> gate_at_{0};
  std::atomic<int> reads_after_{0};
};

class SealCancelTest : public ::testing::Test {
 protected:
  void Open(const std::string& hold = "") {
    StoreOptions opts = SmallChunks(kChunk);
    opts.seal_hold = hold;
    opts.encoder.tensor_codec = false;  // no format parse: the seal's only reads are its chunks'
    auto s = Store::Open(&env_, dir_.path(), opts);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
    ASSERT_TRUE(store_->Recover().ok());
    auto fs = Filesystem::Open(store_.get(), FsConfig{});
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    fs_ = std::move(fs).value();
  }
  Inode* Lookup(const char* name) {
    struct stat st {};
    auto inode = fs_->inodes().Lookup(fs_->inodes().root(), name, &st);
    EXPECT_TRUE(inode.ok()) << inode.status().ToString();
    return inode.ok() ? *inode : nullptr;
  }
  // unlink as OpUnlink does it, then the kernel's FORGET: the file has no
  // link, no inode and no handle left.
  void UnlinkAndForget(const char* name, Inode* inode) {
    ASSERT_EQ(::unlinkat(store_->ns_fd(), name, 0), 0);
    fs_->ForgetLinkIfGone(inode);
    fs_->inodes().Forget(*inode, 1);
  }
  size_t Files(const char* sub) { return test::CountFiles(dir_.Sub(sub), std::string(sub) == "packs"); }

  TempDir dir_;
  GatedEnv env_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Filesystem> fs_;
};

constexpr size_t kChunks = 40;

// rm of a file whose seal is in progress stops the seal at its next chunk:
// no pack is published, nothing is left in tmp/, and its staging file is
// freed as a deleted file's is.
TEST_F(SealCancelTest, DeletingAFileStopsItsSealBetweenChunks) {
  Open();
  auto rec = MakeStagedFile(store_.get(), "f", RandomBytes(kChunks * kChunk, 1));
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  Inode* inode = Lookup("f");
  ASSERT_NE(inode, nullptr);
  auto content = fs_->ContentOf(*inode);
  ASSERT_TRUE(content.ok());
  env_.Arm(4 * kChunk);
  auto sealing = std::async(std::launch::async, [c = *content] { return c->SealIfIdle(false, false); });
  ASSERT_TRUE(env_.gate.WaitReached()) << "the seal did not reach chunk 4";
  UnlinkAndForget("f", inode);
  env_.gate.Open();
  ASSERT_EQ(sealing.wait_for(kBound), std::future_status::ready);
  const Status st = sealing.get();
  EXPECT_TRUE(st.ok()) << st.ToString();
  // The chunk in flight, and at most one more per worker: not the other 35.
  EXPECT_LE(env_.reads_after(), 2);
  EXPECT_FALSE(store_->OpenStaging(rec->object).ok()) << "the deleted file's staging file is still there";
  EXPECT_EQ(Files("tmp"), 0u);
  EXPECT_EQ(Files("packs"), 0u);
}

// The unmount's Drain does not wait for the seal of a deleted file, even
// one that would wait at -o seal_hold for ever.
TEST_F(SealCancelTest, DrainDoesNotWaitForTheSealOfADeletedFile) {
  const TempDir elsewhere;  // not in the store's directory, which must be empty
  const std::string hold = elsewhere.Sub("hold");
  test::WriteFileBytes(hold, {});
  Open(hold);
  auto rec = MakeStagedFile(store_.get(), "f", RandomBytes(8 * kChunk, 2));
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  Inode* inode = Lookup("f");
  ASSERT_NE(inode, nullptr);
  auto content = fs_->ContentOf(*inode);
  ASSERT_TRUE(content.ok());
  env_.Arm(2 * kChunk);
  fs_->seals().Start();
  fs_->seals().Push(*content);
  ASSERT_TRUE(env_.gate.WaitReached()) << "the seal did not start";
  UnlinkAndForget("f", inode);
  env_.gate.Open();  // the seal goes on to the hold, unless it stops first
  auto drained = std::async(std::launch::async, [&] { fs_->seals().Drain(); });
  const bool returned = drained.wait_for(kBound) == std::future_status::ready;
  std::filesystem::remove(hold);  // lets a seal that was not cancelled end, so that the test ends
  ASSERT_TRUE(returned) << "Drain waited for the seal of a deleted file";
  EXPECT_FALSE(store_->OpenStaging(rec->object).ok());
  EXPECT_EQ(Files("packs"), 0u);
}

}  // namespace
}  // namespace ckptfs
