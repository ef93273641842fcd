// Sync points, RocksDB's TEST_SYNC_POINT pattern: named places in the code
// where a test can force the interleaving a race test is about, instead of
// sleeping and hoping. A point is written
//   CKPTFS_SYNC_POINT("Store::PublishPack:BeforePublish");
//   CKPTFS_SYNC_POINT_CALLBACK("Class::Method:Where", &some_state);
// and a test, before it starts the threads:
//   SyncPoint::Get()->LoadDependency({{"A", "B"}});  // B waits until A was passed
//   SyncPoint::Get()->SetCallBack("C", [&](void* arg) { ... });  // runs at C
//   SyncPoint::Get()->EnableProcessing();
// (or a ScopedSyncPoints, which also clears everything when it goes).
//
// Built in where CMake's CKPTFS_SYNC_POINTS option is ON (the default but
// for Release and MinSizeRel builds; the unit tests', the TSan and ASan
// builds' and build/ckptfs's): a point then costs one relaxed atomic load
// while no test has enabled processing, which the daemon never does. With
// -DCKPTFS_SYNC_POINTS=OFF CMake defines CKPTFS_NO_SYNC_POINTS, the macros
// expand to nothing, and the tests that need them skip (kCompiledIn).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <initializer_list>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace ckptfs {

class SyncPoint {
 public:
#ifndef CKPTFS_NO_SYNC_POINTS
  static constexpr bool kCompiledIn = true;
#else
  static constexpr bool kCompiledIn = false;
#endif

  // "successor waits until predecessor has been passed".
  struct Dependency {
    std::string predecessor;
    std::string successor;
  };

  // The process's registry (never destroyed: a point may be passed at exit).
  static SyncPoint* Get();

  // Replaces the dependencies and forgets which points were passed.
  void LoadDependency(const std::vector<Dependency>& dependencies);
  // `callback` runs, with the point's argument, each time a thread passes
  // `point`, before the point waits for its predecessors.
  void SetCallBack(const std::string& point, std::function<void(void*)> callback);
  void ClearCallBack(const std::string& point);
  // Waits for the callbacks running now to return.
  void ClearAllCallBacks();

  void EnableProcessing() { enabled_.store(true, std::memory_order_relaxed); }
  // Also releases the points waiting now.
  void DisableProcessing();
  // Forgets which points were passed.
  void ClearTrace();
  // Disables processing and clears dependencies, callbacks and the trace.
  void Reset();

  // Whether any test enabled processing: all a point costs otherwise.
  static bool Enabled() { return enabled_.load(std::memory_order_relaxed); }
  // What the macros call: runs the point's callback, waits until every
  // predecessor of `point` was passed, then marks `point` passed. A wait
  // longer than kMaxWaitSeconds is a test that cannot go on (a dependency
  // that is never passed): it aborts, naming the point.
  void Process(std::string_view point, void* arg = nullptr);

  static constexpr int kMaxWaitSeconds = 300;

 private:
  bool PredecessorsPassed(const std::string& point) const;

  static std::atomic<bool> enabled_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<std::string>> predecessors_;
  std::map<std::string, std::function<void(void*)>> callbacks_;
  std::set<std::string> passed_;
  int callbacks_running_ = 0;
};

// For tests: loads `dependencies` and enables processing; on destruction
// disables it and clears everything (SyncPoint::Reset), so that a failed
// test leaves no points behind for the next.
class ScopedSyncPoints {
 public:
  explicit ScopedSyncPoints(std::initializer_list<SyncPoint::Dependency> dependencies = {}) {
    SyncPoint::Get()->Reset();
    SyncPoint::Get()->LoadDependency(dependencies);
    SyncPoint::Get()->EnableProcessing();
  }
  ScopedSyncPoints(const ScopedSyncPoints&) = delete;
  ScopedSyncPoints& operator=(const ScopedSyncPoints&) = delete;
  ~ScopedSyncPoints() { SyncPoint::Get()->Reset(); }
};

}  // namespace ckptfs

#ifndef CKPTFS_NO_SYNC_POINTS
#define CKPTFS_SYNC_POINT(name)                                                   \
  do {                                                                            \
    if (::ckptfs::SyncPoint::Enabled()) ::ckptfs::SyncPoint::Get()->Process(name); \
  } while (0)
#define CKPTFS_SYNC_POINT_CALLBACK(name, arg)                                           \
  do {                                                                                  \
    if (::ckptfs::SyncPoint::Enabled()) ::ckptfs::SyncPoint::Get()->Process(name, arg); \
  } while (0)
#else
#define CKPTFS_SYNC_POINT(name) \
  do {                          \
  } while (0)
#define CKPTFS_SYNC_POINT_CALLBACK(name, arg) \
  do {                                        \
  } while (0)
#endif
