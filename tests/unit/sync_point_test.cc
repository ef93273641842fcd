// Sync points (base/sync_point.h): a dependency orders two threads, a
// callback runs at its point with the point's argument, and points do
// nothing while processing is off (as in the daemon), releasing any thread
// waiting at one when it is turned off.
#include "base/sync_point.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ckptfs {
namespace {

#define SKIP_WITHOUT_SYNC_POINTS() \
  if (!SyncPoint::kCompiledIn) GTEST_SKIP() << "built with -DCKPTFS_SYNC_POINTS=OFF"

TEST(SyncPointTest, ASuccessorWaitsUntilItsPredecessorWasPassed) {
  SKIP_WITHOUT_SYNC_POINTS();
  ScopedSyncPoints points({{"SyncPointTest:First", "SyncPointTest:Second"}});
  std::mutex mu;
  std::vector<std::string> order;
  auto note = [&](const char* what) {
    std::lock_guard lk(mu);
    order.push_back(what);
  };
  // Started first, it would note first if nothing held it at its point.
  std::thread second([&] {
    CKPTFS_SYNC_POINT("SyncPointTest:Second");
    note("second");
  });
  note("first");
  CKPTFS_SYNC_POINT("SyncPointTest:First");
  second.join();
  EXPECT_EQ(order, (std::vector<std::string>{"first", "second"}));
  // Passed once, a predecessor stays passed: the successor no longer waits.
  CKPTFS_SYNC_POINT("SyncPointTest:Second");
}

TEST(SyncPointTest, ACallbackRunsAtItsPointWithItsArgument) {
  SKIP_WITHOUT_SYNC_POINTS();
  ScopedSyncPoints points;
  int calls = 0;
  SyncPoint::Get()->SetCallBack("SyncPointTest:Count", [&](void* arg) {
    ++calls;
    ++*static_cast<int*>(arg);
  });
  int passed = 0;
  CKPTFS_SYNC_POINT_CALLBACK("SyncPointTest:Count", &passed);
  CKPTFS_SYNC_POINT_CALLBACK("SyncPointTest:Count", &passed);
  CKPTFS_SYNC_POINT("SyncPointTest:Other");
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(passed, 2);
  SyncPoint::Get()->ClearCallBack("SyncPointTest:Count");
  CKPTFS_SYNC_POINT_CALLBACK("SyncPointTest:Count", &passed);
  EXPECT_EQ(calls, 2);
}

TEST(SyncPointTest, NothingHappensWhileProcessingIsOff) {
  SKIP_WITHOUT_SYNC_POINTS();
  SyncPoint* sp = SyncPoint::Get();
  sp->Reset();
  sp->LoadDependency({{"SyncPointTest:Never", "SyncPointTest:Gated"}});
  int calls = 0;
  sp->SetCallBack("SyncPointTest:Gated", [&](void*) { ++calls; });
  EXPECT_FALSE(SyncPoint::Enabled());
  CKPTFS_SYNC_POINT("SyncPointTest:Gated");  // would wait for ever if processed
  EXPECT_EQ(calls, 0);
  sp->Reset();
}

TEST(SyncPointTest, TurningProcessingOffReleasesAWaitingThread) {
  SKIP_WITHOUT_SYNC_POINTS();
  ScopedSyncPoints points({{"SyncPointTest:Never", "SyncPointTest:Gated"}});
  std::promise<void> arrived;
  std::atomic<bool> passed{false};
  // The callback runs before the point waits: the thread is at the point.
  SyncPoint::Get()->SetCallBack("SyncPointTest:Gated", [&](void*) { arrived.set_value(); });
  std::thread waiter([&] {
    CKPTFS_SYNC_POINT("SyncPointTest:Gated");
    passed = true;
  });
  arrived.get_future().wait();
  EXPECT_FALSE(passed);  // its predecessor was never passed
  SyncPoint::Get()->DisableProcessing();
  waiter.join();
  EXPECT_TRUE(passed);
}

TEST(SyncPointTest, ScopedSyncPointsLeaveNothingBehind) {
  SKIP_WITHOUT_SYNC_POINTS();
  int calls = 0;
  {
    ScopedSyncPoints points({{"SyncPointTest:Never", "SyncPointTest:Gated"}});
    SyncPoint::Get()->SetCallBack("SyncPointTest:Gated", [&](void*) { ++calls; });
    EXPECT_TRUE(SyncPoint::Enabled());
  }
  EXPECT_FALSE(SyncPoint::Enabled());
  SyncPoint::Get()->EnableProcessing();  // the dependency and the callback went with the scope
  SyncPoint::Get()->Process("SyncPointTest:Gated");
  EXPECT_EQ(calls, 0);
  SyncPoint::Get()->Reset();
}

}  // namespace
}  // namespace ckptfs
