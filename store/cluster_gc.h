// Cluster GC (docs/ARCHITECTURE.md, "Cluster mode: GC"): garbage
// collection of packs on a store that several nodes' daemons serve at once.
// No daemon deletes a pack itself there; this does, under the GC lease
// (store/cluster/gc_lease.h). A run, in this order:
//   1. lists the packs and the gc/doomed/ markers;
//   2. reads the pins (store/cluster/seal_pin.h) of every node; a dead node's are
//      counted this once, then removed with its nodes/NODE/tmp/ leftovers;
//   3. reads every stub in ns/;
//   4. marks live what stubs name, what pins name, packs younger than the
//      grace period, and the bases of those, transitively;
//   5. marks doomed what is not live and has no marker, drops the marker of
//      a doomed pack that is live again, and deletes (pack, then marker)
//      each pack that is not live and whose marker, listed in step 1, is
//      older than the grace period.
// With grace 0, a second round runs, so markers made in the first delete.
// An object that cannot be read stops all changes, as in recovery.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "store/object_id.h"

namespace ckptfs {

struct ClusterGcOptions {
  uint64_t grace_seconds = 600;
  // Who collects, recorded in the lease: a node name, or "gc@host:pid".
  std::string holder{};
  uint64_t lease_seconds = 60;
  // When set and true, the run stops at the next step or deletion, with
  // ECANCELED (the daemon unmounting). What it did so far stays done.
  const std::atomic<bool>* stop = nullptr;
};

struct ClusterGcReport {
  struct Pack {
    ObjectId id = 0;
    uint64_t bytes = 0;
  };
  std::vector<Pack> deleted;
  uint64_t bytes_deleted = 0;
  uint64_t kept_referenced = 0;  // named by a stub, or a base of one that is
  uint64_t kept_pinned = 0;      // in use by a seal in flight (a pin), not by a stub
  uint64_t kept_young = 0;       // within the grace period of being written, otherwise unneeded
  uint64_t kept_doomed = 0;      // unneeded and marked doomed: deleted once the grace period is over
  uint64_t markers_created = 0;
  uint64_t markers_removed = 0;         // live again, or of a pack already gone
  uint64_t dead_pins_removed = 0;       // pin files of dead nodes
  uint64_t dead_tmp_removed = 0;        // unpublished packs in dead nodes' tmp/
  std::vector<std::string> actions;     // one human line per thing done or kept
  std::vector<std::string> unreadable;  // as RecoveryReport::unreadable: any there, nothing changed
  bool lease_lost = false;              // the lease was lost mid-run: the run stopped
  bool swept() const { return unreadable.empty() && !lease_lost; }
};

class Store;

// The daemon's cluster GC (-o gc_interval=SECS): a run every interval on a
// thread of its own, started after the daemon forks; destruction (at
// unmount) stops it: a run in progress ends at its next step or deletion. A run that finds the
// lease held by another collector is skipped.
class PeriodicClusterGc {
 public:
  PeriodicClusterGc(Store* store, uint32_t interval_seconds, ClusterGcOptions gc);
  PeriodicClusterGc(const PeriodicClusterGc&) = delete;
  PeriodicClusterGc& operator=(const PeriodicClusterGc&) = delete;
  ~PeriodicClusterGc();

 private:
  void Loop();

  Store* store_;
  uint32_t interval_seconds_;
  ClusterGcOptions gc_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<bool> stopping_{false};  // what gc_.stop points at
  std::thread thread_;
};

}  // namespace ckptfs
