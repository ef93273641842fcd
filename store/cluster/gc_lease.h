// The GC lease (docs/ARCHITECTURE.md, "Cluster mode: GC"): one cluster GC
// at a time over a shared store, with no lock service and no flock (Lustre
// mounted with localflock or noflock has none across nodes). gc/lease holds
// JSON {holder, token, expires_ns}. It is taken by link(2)ing a complete
// file of one's own to the name (EEXIST: held), taken over once expired by
// renaming the stale one away and checking that what moved is what was
// judged stale, renewed while collecting, and checked before each deletion.
// Clocks of nodes must agree to well within a lease, as for membership.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "base/unique_fd.h"
#include "base/env.h"

namespace ckptfs {

inline constexpr char kGcLeaseName[] = "lease";

struct GcLeaseRecord {
  std::string holder;  // a node name, or "gc@host:pid" for `ckptfs gc`
  std::string token;   // unique per taking
  uint64_t expires_ns = 0;
};

class GcLease {
 public:
  // Takes gc/lease in `gc_dir_fd` for `term_ns`. EBUSY, naming the holder,
  // while another holder's lease has not expired.
  static Result<std::unique_ptr<GcLease>> Acquire(Env* env, int gc_dir_fd, const std::string& holder, uint64_t term_ns);
  GcLease(const GcLease&) = delete;
  GcLease& operator=(const GcLease&) = delete;
  ~GcLease();  // releases it, if still held

  // Ok while the lease is still ours and unexpired, renewed once less than
  // half its term is left; an error once it was lost (taken over, removed,
  // or expired): the caller must stop deleting.
  Status Hold();
  // Whether Hold would renew now: callers in a long phase (the stub walk)
  // call Hold when this says so, and do no lease I/O otherwise.
  bool RenewalDue() const { return held_ && env_->WallTimeNs() + term_ns_ / 2 >= mine_.expires_ns; }
  Status Release();
  const std::string& token() const { return mine_.token; }

 private:
  GcLease(Env* env, UniqueFd dir, GcLeaseRecord mine, uint64_t term_ns)
      : env_(env), dir_(std::move(dir)), mine_(std::move(mine)), term_ns_(term_ns) {}
  Status Renew();

  Env* env_;
  UniqueFd dir_;
  GcLeaseRecord mine_;
  uint64_t term_ns_;
  bool held_ = true;
};

// For tests and messages: what gc/lease holds now.
Result<GcLeaseRecord> ReadGcLease(Env* env, int gc_dir_fd);

}  // namespace ckptfs
