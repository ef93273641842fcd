// Cluster GC (store/cluster_gc.h): two Store instances on one directory
// stand for two nodes' daemons, each with its own node name. The wall
// clock is a FaultEnv's, so grace periods and leases pass without waiting.
#include "store/cluster_gc.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <random>

#include "base/sync_point.h"
#include "store/cluster/gc_lease.h"
#include "store/cluster/membership.h"
#include "store/cluster/seal_pin.h"
#include "store/store.h"
#include "tests/unit/fault_env.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using test::TempDir;

constexpr uint32_t kChunk = 64 * 1024;
constexpr uint64_t kSecond = 1000000000ull;

// Training-like versions of one .npy tensor: each nudges half the weights.
std::vector<std::vector<uint8_t>> Versions(int n) { return test::NpyVersions(n, 100000, 11); }

class ClusterGcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    now_ = env_.WallTimeNs();
    env_.SetWallTime(now_);
    a_ = OpenNode("a");
    b_ = OpenNode("b");
  }
  std::unique_ptr<Store> OpenNode(const std::string& node, const std::string& seal_hold = "") {
    StoreOptions o = test::SmallChunks(kChunk);
    o.take_lock = false;  // a shared store has no single owner
    o.cluster.enabled = true;
    o.cluster.node = node;
    o.seal_hold = seal_hold;
    auto s = Store::Open(&env_, dir_.path(), o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    auto m = Membership::Join(&env_, (*s)->root_fd(), MemberRecord{.node = node, .lease_seconds = 30});
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    members_.push_back(std::move(m).value());
    auto rep = (*s)->Recover();  // loads the pack index, as a mount does
    EXPECT_TRUE(rep.ok()) << rep.status().ToString();
    return std::move(s).value();
  }
  // Time passes; the members renew their leases meanwhile.
  void Advance(uint64_t seconds) {
    now_ += seconds * kSecond;
    env_.SetWallTime(now_);
    for (auto& m : members_) ASSERT_OK(m->Renew());
  }
  ClusterGcReport Gc(Store* s, uint64_t grace = 0) {
    auto rep = s->CollectClusterGarbage(ClusterGcOptions{.grace_seconds = grace, .holder = "test"});
    EXPECT_TRUE(rep.ok()) << rep.status().ToString();
    return rep.ok() ? *rep : ClusterGcReport{};
  }
  ObjectId Seal(Store* s, const std::string& name, const std::vector<uint8_t>& bytes) {
    auto r = test::MakeSealedFile(s, name, bytes);
    EXPECT_TRUE(r.ok()) << name << ": " << r.status().ToString();
    return r.ok() ? r->object : 0;
  }
  // What an unlink on a node does to a stub in cluster mode: the name goes,
  // the pack stays for GC.
  void Unlink(const std::string& name) { ASSERT_EQ(::unlink(dir_.Sub("ns/" + name).c_str()), 0); }
  bool HasPack(ObjectId id) { return a_->PackFileSize(id).ok(); }
  bool Doomed(ObjectId id) { return std::filesystem::exists(dir_.Sub("gc/doomed/" + ObjectIdHex(id))); }
  void ExpectContent(Store* s, const std::string& name, const std::vector<uint8_t>& want) {
    auto got = test::ReadContentAt(s, name);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status().ToString();
    EXPECT_TRUE(*got == want) << name << " differs";
  }
  FileUsage UsageOf(Store* s, const std::string& name) {
    auto u = s->Usage(name);
    EXPECT_TRUE(u.ok() && u->size() == 1);
    return u.ok() && !u->empty() ? u->front() : FileUsage{};
  }

  TempDir dir_;
  FaultEnv env_;
  uint64_t now_ = 0;
  std::vector<std::unique_ptr<Membership>> members_;
  std::unique_ptr<Store> a_, b_;
};

TEST_F(ClusterGcTest, UnreferencedPackGoesOnlyAfterTheGracePeriod) {
  const ObjectId p = Seal(a_.get(), "f", test::MixedContent(kChunk, 1));
  Unlink("f");
  ClusterGcReport r = Gc(b_.get(), 600);  // just written: within the grace period
  EXPECT_EQ(r.kept_young, 1u);
  EXPECT_FALSE(Doomed(p));
  Advance(601);
  r = Gc(b_.get(), 600);
  EXPECT_EQ(r.markers_created, 1u);
  EXPECT_TRUE(Doomed(p));
  EXPECT_TRUE(HasPack(p));
  Advance(599);
  r = Gc(a_.get(), 600);
  EXPECT_EQ(r.kept_doomed, 1u);
  EXPECT_TRUE(r.deleted.empty());
  EXPECT_TRUE(HasPack(p));
  Advance(2);
  r = Gc(a_.get(), 600);
  ASSERT_EQ(r.deleted.size(), 1u);
  EXPECT_EQ(r.deleted[0].id, p);
  EXPECT_FALSE(HasPack(p));
  EXPECT_FALSE(Doomed(p));
}

TEST_F(ClusterGcTest, GraceZeroDeletesInOneRunThroughTwoRounds) {
  const ObjectId p = Seal(a_.get(), "f", test::MixedContent(kChunk, 2));
  Unlink("f");
  const ClusterGcReport r = Gc(a_.get(), 0);
  ASSERT_EQ(r.deleted.size(), 1u);
  EXPECT_EQ(r.deleted[0].id, p);
  EXPECT_FALSE(HasPack(p));
  EXPECT_FALSE(Doomed(p));
}

TEST_F(ClusterGcTest, NeverDeletesWhatAStubOnAnotherNodeNames) {
  const auto bytes = test::MixedContent(kChunk, 3);
  const ObjectId p = Seal(b_.get(), "g", bytes);
  const ClusterGcReport r = Gc(a_.get(), 0);
  EXPECT_TRUE(r.deleted.empty());
  EXPECT_EQ(r.kept_referenced, 1u);
  EXPECT_TRUE(HasPack(p));
  ExpectContent(a_.get(), "g", bytes);
}

TEST_F(ClusterGcTest, NeverDeletesAPinnedPack) {
  const ObjectId p = Seal(a_.get(), "f", test::MixedContent(kChunk, 4));
  Unlink("f");
  {
    auto pin = SealPin::Create(&env_, b_->pins_dir_fd());
    ASSERT_TRUE(pin.ok());
    const ObjectId ids[] = {p};
    ASSERT_OK((*pin)->Add(ids));
    const ClusterGcReport r = Gc(a_.get(), 0);
    EXPECT_TRUE(r.deleted.empty());
    EXPECT_EQ(r.kept_pinned, 1u);
    EXPECT_TRUE(HasPack(p));
  }
  EXPECT_EQ(Gc(a_.get(), 0).deleted.size(), 1u);  // the pin is gone with its seal
  EXPECT_FALSE(HasPack(p));
}

TEST_F(ClusterGcTest, NeverDeletesTheBaseOfALivePack) {
  const auto v = Versions(2);
  const ObjectId p0 = Seal(a_.get(), "v0", v[0]);
  Seal(a_.get(), "v1", v[1]);
  ASSERT_EQ(UsageOf(a_.get(), "v1").base, p0);
  Unlink("v0");
  const ClusterGcReport r = Gc(b_.get(), 0);
  EXPECT_TRUE(r.deleted.empty());
  EXPECT_EQ(r.kept_referenced, 2u);
  EXPECT_TRUE(HasPack(p0));
  ExpectContent(b_.get(), "v1", v[1]);
}

TEST_F(ClusterGcTest, SealDropsABaseMarkedDoomed) {
  const auto v = Versions(2);
  const ObjectId p0 = Seal(a_.get(), "v0", v[0]);
  Unlink("v0");  // a's index still offers its pack as v1's predecessor
  Advance(601);
  Gc(b_.get(), 600);
  ASSERT_TRUE(Doomed(p0));
  Seal(a_.get(), "v1", v[1]);
  EXPECT_EQ(UsageOf(a_.get(), "v1").base, 0u);  // coded without it
  ExpectContent(a_.get(), "v1", v[1]);
  Advance(601);
  EXPECT_EQ(Gc(b_.get(), 600).deleted.size(), 1u);
  EXPECT_FALSE(HasPack(p0));
  ExpectContent(b_.get(), "v1", v[1]);
}

// The scenario: GC on node A while node B seals a file stored as a
// delta against a pack that A's deletes left unreferenced.
TEST_F(ClusterGcTest, SealInFlightKeepsItsBaseThroughGc) {
  if (!SyncPoint::kCompiledIn) GTEST_SKIP() << "built with -DCKPTFS_SYNC_POINTS=OFF";
  const auto v = Versions(2);
  const ObjectId p0 = Seal(a_.get(), "v0", v[0]);
  std::unique_ptr<Store> b = OpenNode("b2");  // its index offers v0's pack
  Unlink("v0");
  // A's GC runs on B's sealing thread, once B has pinned its base and coded
  // the pack and before it publishes it.
  ScopedSyncPoints points;
  std::optional<ClusterGcReport> during;
  SyncPoint::Get()->SetCallBack("Store::PublishPack:BeforePublish", [&](void*) {
    if (!during) during = Gc(a_.get(), 0);
  });
  Result<StubRecord> sealed = test::MakeSealedFile(b.get(), "v1", v[1]);
  SyncPoint::Get()->Reset();
  ASSERT_TRUE(sealed.ok()) << sealed.status().ToString();
  ASSERT_TRUE(during.has_value()) << "the seal published nothing";
  EXPECT_TRUE(during->deleted.empty());
  EXPECT_GE(during->kept_pinned, 1u);
  EXPECT_EQ(UsageOf(b.get(), "v1").base, p0);
  EXPECT_TRUE(Gc(a_.get(), 0).deleted.empty());
  EXPECT_TRUE(HasPack(p0));
  ExpectContent(a_.get(), "v1", v[1]);
  EXPECT_TRUE(std::filesystem::is_empty(dir_.Sub("nodes/b2/pins")));
}

// A file rewritten in place: its previous version, which no stub names
// while it is staged, stays pinned as the predecessor of the next seal.
TEST_F(ClusterGcTest, RewriteInPlaceKeepsItsPredecessorThroughGc) {
  const auto v = Versions(2);
  const ObjectId p0 = Seal(a_.get(), "f", v[0]);
  auto stub = env_.OpenAt(a_->ns_fd(), "f", O_RDWR);
  ASSERT_TRUE(stub.ok());
  auto rec = ReadStub(&env_, stub->get());
  ASSERT_TRUE(rec.ok());
  auto staged = a_->StageStub(stub->get(), *rec, 0);  // an O_TRUNC open
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  ASSERT_EQ(staged->retired, p0);
  Advance(601);
  const ClusterGcReport r = Gc(b_.get(), 600);
  EXPECT_EQ(r.kept_pinned, 1u);
  EXPECT_FALSE(Doomed(p0));
  ASSERT_OK(env_.PWriteAll(staged->fd.get(), v[1], 0));
  auto sealed = a_->SealStub(stub->get(), staged->rec, staged->fd.get());
  ASSERT_TRUE(sealed.ok()) << sealed.status().ToString();
  ASSERT_OK(a_->ReleaseRetired(p0));
  EXPECT_EQ(UsageOf(a_.get(), "f").base, p0);
  EXPECT_TRUE(std::filesystem::is_empty(dir_.Sub("nodes/a/pins")));
  EXPECT_TRUE(Gc(b_.get(), 0).deleted.empty());
  ExpectContent(b_.get(), "f", v[1]);
}

TEST_F(ClusterGcTest, DeadNodesPinsAndTmpLeftoversAreCollected) {
  const ObjectId p = Seal(a_.get(), "f", test::MixedContent(kChunk, 5));
  Unlink("f");
  {
    // Node c joined an hour ago and never renewed: its lease is long over.
    env_.SetWallTime(now_ - 3600 * kSecond);
    auto c = Membership::Join(&env_, a_->root_fd(), MemberRecord{.node = "c", .lease_seconds = 30});
    env_.SetWallTime(now_);
    ASSERT_TRUE(c.ok());
    auto pin = SealPin::Create(&env_, (*c)->pins_dir_fd());
    ASSERT_TRUE(pin.ok());
    const ObjectId ids[] = {p};
    ASSERT_OK((*pin)->Add(ids));
    test::WriteFileBytes(dir_.Sub("nodes/c/tmp/0123456789abcdef.pack.tmp"), {1, 2, 3});
    // "Crashes": leaves its record, pin and tmp file. What a crash never
    // destroys stays reachable here, so that LeakSanitizer does not call it a leak.
    // (Destroyed at exit, they would reach the fixture's Env, and a static
    // vector's buffer is freed before the leak check.)
    static auto* const crashed = new std::vector<const void*>();  // never destroyed, as at a crash
    crashed->push_back(c->release());
    crashed->push_back(pin->release());
  }
  ClusterGcReport r = Gc(a_.get(), 0);
  EXPECT_EQ(r.dead_pins_removed, 1u);
  EXPECT_EQ(r.dead_tmp_removed, 1u);
  EXPECT_TRUE(std::filesystem::is_empty(dir_.Sub("nodes/c/pins")));
  EXPECT_TRUE(std::filesystem::is_empty(dir_.Sub("nodes/c/tmp")));
  r = Gc(a_.get(), 0);
  EXPECT_EQ(r.deleted.size(), 1u);
  EXPECT_FALSE(HasPack(p));
}

TEST_F(ClusterGcTest, UnreadableStubStopsAllDeletion) {
  const ObjectId p = Seal(a_.get(), "f", test::MixedContent(kChunk, 6));
  Unlink("f");
  test::WriteFileBytes(dir_.Sub("ns/broken"), std::vector<uint8_t>(kStubFileSize, 0xee));
  const ClusterGcReport r = Gc(a_.get(), 0);
  EXPECT_FALSE(r.unreadable.empty());
  EXPECT_TRUE(r.deleted.empty());
  EXPECT_FALSE(Doomed(p));
  EXPECT_TRUE(HasPack(p));
}

// A crash at each mutation of a GC run (process killed: every call after
// it fails), then, once the dead run's lease has expired, a healthy run:
// nothing live is ever deleted, and the garbage goes in the end.
TEST_F(ClusterGcTest, CrashAtEachMutationOfARunDeletesNothingLive) {
  const auto v = Versions(2);
  for (uint64_t k = 0;; ++k) {
    SCOPED_TRACE("crash after mutation " + std::to_string(k));
    const std::string sub = "s" + std::to_string(k);
    std::filesystem::create_directories(dir_.Sub(sub));
    StoreOptions o = test::SmallChunks(kChunk);
    o.take_lock = false;
    o.cluster.enabled = true;
    o.cluster.node = "a";
    auto s = Store::Open(&env_, dir_.Sub(sub), o);
    ASSERT_TRUE(s.ok());
    auto m = Membership::Join(&env_, (*s)->root_fd(), MemberRecord{.node = "a", .lease_seconds = 30});
    ASSERT_TRUE(m.ok() && (*s)->Recover().ok());
    const ObjectId p0 = Seal(s->get(), "v0", v[0]);
    Seal(s->get(), "v1", v[1]);
    const ObjectId garbage = Seal(s->get(), "g", test::MixedContent(kChunk, 7));
    ASSERT_EQ(::unlink(dir_.Sub(sub + "/ns/v0").c_str()), 0);
    ASSERT_EQ(::unlink(dir_.Sub(sub + "/ns/g").c_str()), 0);

    env_.ResetCounters();
    env_.CrashAfterMutations(k);
    (void)(*s)->CollectClusterGarbage(ClusterGcOptions{.grace_seconds = 0, .holder = "a"});
    const bool crashed = env_.injected() > 0;
    env_.ClearFaults();
    Advance(61);  // the crashed run's lease expires
    ASSERT_OK((*m)->Renew());
    auto after = (*s)->CollectClusterGarbage(ClusterGcOptions{.grace_seconds = 0, .holder = "a"});
    ASSERT_TRUE(after.ok()) << after.status().ToString();
    EXPECT_TRUE((*s)->PackFileSize(p0).ok());  // v1's base
    EXPECT_FALSE((*s)->PackFileSize(garbage).ok());
    ExpectContent(s->get(), "v1", v[1]);
    if (!crashed) break;  // the run finished before its k-th mutation: every point is covered
  }
}

TEST_F(ClusterGcTest, DaemonCollectsEveryIntervalUntilStopped) {
  if (!SyncPoint::kCompiledIn) GTEST_SKIP() << "built with -DCKPTFS_SYNC_POINTS=OFF";
  const ObjectId p = Seal(a_.get(), "f", test::MixedContent(kChunk, 8));
  Unlink("f");
  {
    ScopedSyncPoints points({{"PeriodicClusterGc::Loop:AfterRun", "ClusterGcTest:FirstRunDone"}});
    PeriodicClusterGc gc(b_.get(), 1, ClusterGcOptions{.grace_seconds = 0, .holder = "b"});
    CKPTFS_SYNC_POINT("ClusterGcTest:FirstRunDone");  // returns once a run has ended
  }  // stops the thread, ending a run in progress
  EXPECT_FALSE(HasPack(p));
  EXPECT_FALSE(std::filesystem::exists(dir_.Sub("gc/lease")));
}

TEST_F(ClusterGcTest, AStoppedRunEndsWithECANCELEDAndReleasesTheLease) {
  const ObjectId p = Seal(a_.get(), "f", test::MixedContent(kChunk, 12));
  Unlink("f");
  const std::atomic<bool> stop{true};
  auto rep = a_->CollectClusterGarbage(ClusterGcOptions{.grace_seconds = 0, .holder = "a", .stop = &stop});
  ASSERT_FALSE(rep.ok());
  EXPECT_EQ(rep.status().code(), ECANCELED);
  EXPECT_TRUE(HasPack(p));
  EXPECT_FALSE(std::filesystem::exists(dir_.Sub("gc/lease")));
}

TEST(PinFileTest, ALineStillBeingAppendedIsSkipped) {
  const std::string a = ObjectIdHex(0x1111), b = ObjectIdHex(0x2222);
  EXPECT_EQ(ParsePinFile(a + "\n" + b + "\n"), (std::vector<ObjectId>{0x1111, 0x2222}));
  EXPECT_EQ(ParsePinFile(a + "\n" + b.substr(0, 7)), (std::vector<ObjectId>{0x1111}));
  EXPECT_EQ(ParsePinFile("junk\n" + a + "\n"), (std::vector<ObjectId>{0x1111}));
  EXPECT_TRUE(ParsePinFile("").empty());
}

// An Env on which node c, dead when GC reads the membership, rejoins right
// as GC opens its pins directory (and so may pin bases from then on).
class RejoinEnv : public FaultEnv {
 public:
  Result<UniqueFd> OpenAt(int dirfd, const std::string& path, int flags, mode_t mode) override {
    if (path == "c/pins" && root_fd_ >= 0 && !member_) {
      auto m = Membership::Join(this, root_fd_, MemberRecord{.node = "c", .lease_seconds = 30});
      EXPECT_TRUE(m.ok()) << m.status().ToString();
      if (m.ok()) member_ = std::move(m).value();
    }
    return FaultEnv::OpenAt(dirfd, path, flags, mode);
  }
  int root_fd_ = -1;
  std::unique_ptr<Membership> member_;
};

TEST(ClusterGcRejoin, ANodeThatRejoinsDuringARunKeepsItsPins) {
  TempDir dir;
  RejoinEnv env;
  StoreOptions o = test::SmallChunks(kChunk);
  o.take_lock = false;
  o.cluster.enabled = true;
  o.cluster.node = "c";
  auto s = Store::Open(&env, dir.path(), o);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->Recover().ok());
  const auto p = test::MakeSealedFile(s->get(), "f", test::MixedContent(kChunk, 9));
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(::unlink(dir.Sub("ns/f").c_str()), 0);
  auto pin = SealPin::Create(&env, (*s)->pins_dir_fd());  // node c has no record: dead
  ASSERT_TRUE(pin.ok());
  const ObjectId ids[] = {p->object};
  ASSERT_OK((*pin)->Add(ids));
  env.root_fd_ = (*s)->root_fd();
  auto rep = (*s)->CollectClusterGarbage(ClusterGcOptions{.grace_seconds = 0, .holder = "gc"});
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ASSERT_TRUE(env.member_);
  EXPECT_EQ(rep->dead_pins_removed, 0u);
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("nodes/c/pins/" + (*pin)->name())));
  EXPECT_TRUE(rep->deleted.empty());
  EXPECT_TRUE((*s)->PackFileSize(p->object).ok());
}

class GcLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    now_ = env_.WallTimeNs();
    env_.SetWallTime(now_);
    std::filesystem::create_directories(dir_.Sub("gc"));
    gc_ = std::move(env_.OpenAt(AT_FDCWD, dir_.Sub("gc"), O_RDONLY | O_DIRECTORY)).value();
  }
  TempDir dir_;
  FaultEnv env_;
  uint64_t now_ = 0;
  UniqueFd gc_;
};

TEST_F(GcLeaseTest, SecondCollectorIsRefusedWhileTheFirstHoldsIt) {
  auto first = GcLease::Acquire(&env_, gc_.get(), "a", 60 * kSecond);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = GcLease::Acquire(&env_, gc_.get(), "b", 60 * kSecond);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), EBUSY);
  EXPECT_NE(second.status().message().find("held by a"), std::string::npos) << second.status().message();
  ASSERT_OK((*first)->Release());
  EXPECT_TRUE(GcLease::Acquire(&env_, gc_.get(), "b", 60 * kSecond).ok());
}

TEST_F(GcLeaseTest, ExpiredLeaseIsTakenOverAndItsHolderLosesIt) {
  auto first = GcLease::Acquire(&env_, gc_.get(), "a", 60 * kSecond);
  ASSERT_TRUE(first.ok());
  FaultEnv later;
  later.SetWallTime(now_ + 61 * kSecond);
  auto second = GcLease::Acquire(&later, gc_.get(), "b", 60 * kSecond);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(ReadGcLease(&env_, gc_.get())->holder, "b");
  const Status held = (*first)->Hold();
  EXPECT_FALSE(held.ok());
  EXPECT_NE(held.message().find("to b"), std::string::npos) << held.message();
  first->reset();  // must not release b's lease
  EXPECT_EQ(ReadGcLease(&env_, gc_.get())->token, (*second)->token());
  EXPECT_TRUE(std::filesystem::exists(dir_.Sub("gc/lease")));
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_.Sub("gc"))) files += (void(e), 1);
  EXPECT_EQ(files, 1u);  // no tmp or stale copies left
}

TEST_F(GcLeaseTest, HolderRenewsWhileCollecting) {
  auto lease = GcLease::Acquire(&env_, gc_.get(), "a", 60 * kSecond);
  ASSERT_TRUE(lease.ok());
  for (int i = 0; i < 10; ++i) {
    env_.SetWallTime(now_ += 40 * kSecond);  // longer than the lease in all
    ASSERT_OK((*lease)->Hold());
  }
  EXPECT_GT(ReadGcLease(&env_, gc_.get())->expires_ns, now_);
}

// An Env that lets another collector take the lease over (its clock says
// it expired) right after the first pack deletion.
class ThiefEnv : public FaultEnv {
 public:
  Status UnlinkAt(int dirfd, const std::string& path, int flags) override {
    Status s = FaultEnv::UnlinkAt(dirfd, path, flags);
    if (path.ends_with(".pack") && !stolen_ && !gc_dir_.empty()) {
      stolen_ = true;
      later_.SetWallTime(WallTimeNs() + 3600 * kSecond);
      auto gc = later_.OpenAt(AT_FDCWD, gc_dir_, O_RDONLY | O_DIRECTORY);
      auto lease = gc.ok() ? GcLease::Acquire(&later_, gc->get(), "thief", 60 * kSecond)
                           : Result<std::unique_ptr<GcLease>>(gc.status());
      EXPECT_TRUE(lease.ok()) << lease.status().ToString();
      if (lease.ok()) thief_ = std::move(lease).value();
    }
    return s;
  }
  std::string gc_dir_;
  bool stolen_ = false;
  FaultEnv later_;  // the thief's clock: the lease expired an hour ago
  std::unique_ptr<GcLease> thief_;
};

TEST(ClusterGcLeaseLoss, CollectorStopsDeletingOnceItLostTheLease) {
  TempDir dir;
  ThiefEnv env;
  StoreOptions o = test::SmallChunks(kChunk);
  o.take_lock = false;
  o.cluster.enabled = true;
  o.cluster.node = "a";
  auto s = Store::Open(&env, dir.path(), o);
  ASSERT_TRUE(s.ok());
  auto m = Membership::Join(&env, (*s)->root_fd(), MemberRecord{.node = "a", .lease_seconds = 30});
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE((*s)->Recover().ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(test::MakeSealedFile(s->get(), "f" + std::to_string(i), test::MixedContent(kChunk, 10 + i)).ok());
    ASSERT_EQ(::unlink(dir.Sub("ns/f" + std::to_string(i)).c_str()), 0);
  }
  env.gc_dir_ = dir.Sub("gc");
  auto rep = (*s)->CollectClusterGarbage(ClusterGcOptions{.grace_seconds = 0, .holder = "a"});
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_TRUE(rep->lease_lost);
  EXPECT_EQ(rep->deleted.size(), 1u);
  EXPECT_EQ(test::CountFiles(dir.Sub("packs"), true), 2u);
  auto gc = env.OpenAt(AT_FDCWD, dir.Sub("gc"), O_RDONLY | O_DIRECTORY);
  ASSERT_TRUE(gc.ok());
  auto lease = ReadGcLease(&env, gc->get());
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->holder, "thief");
}

}  // namespace
}  // namespace ckptfs
