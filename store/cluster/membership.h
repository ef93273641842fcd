// Cluster membership (docs/ARCHITECTURE.md "Cluster mode"): each daemon
// serving a shared store keeps a lease record in BACKING/nodes/NODE/member,
// rewritten (tmp + rename) every third of its lease. Nothing here relies on
// a lock: Lustre mounted with localflock or noflock has none across nodes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"
#include "base/env.h"

namespace ckptfs {

inline constexpr char kNodesDirName[] = "nodes";
inline constexpr char kMemberFileName[] = "member";
inline constexpr char kNodeTmpDirName[] = "tmp";
inline constexpr char kNodePinsDirName[] = "pins";

struct MemberRecord {
  std::string node{};
  std::string host{};
  int64_t pid = 0;
  std::string staging{};    // the node's staging directory, for humans and fsck
  uint64_t renewed_ns = 0;  // wall clock of the last renewal
  uint32_t lease_seconds = 0;
};

// gethostname(), what member records hold as `host`.
std::string ThisHostName();

// The id a stub staged on `node` records (never 0: 0 is a single-node store).
uint64_t NodeId(const std::string& node);

// Alive while now < renewed + lease. A record from this host whose process
// is gone is dead at once (a kill -9 on one host need not wait a lease out).
// Clocks of nodes must agree to well within a lease (NTP), as documented.
bool MemberIsAlive(const MemberRecord& rec, uint64_t now_ns, const std::string& this_host);

// Every record under BACKING/nodes/ (a node directory without a readable
// record is returned with only `node` set and renewed_ns 0: dead).
Result<std::vector<MemberRecord>> ReadMembers(Env* env, int root_fd);

// This daemon's membership. Join writes the record, creating
// nodes/NODE/{tmp,pins}/, and refuses a live record of another process for
// the same node. StartRenewing (after the daemon forks: threads do not
// survive it) records the current pid and renews on a thread until
// destruction, which removes the record: a clean exit leaves nothing.
class Membership {
 public:
  static Result<std::unique_ptr<Membership>> Join(Env* env, int root_fd, MemberRecord self);
  ~Membership();
  Status StartRenewing();
  Status Renew();
  const MemberRecord& self() const { return self_; }
  int node_dir_fd() const { return node_dir_.get(); }
  int tmp_dir_fd() const { return tmp_dir_.get(); }
  int pins_dir_fd() const { return pins_dir_.get(); }

 private:
  Membership(Env* env, MemberRecord self) : env_(env), self_(std::move(self)) {}
  void RenewLoop();

  Env* env_;
  MemberRecord self_;
  UniqueFd node_dir_, tmp_dir_, pins_dir_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread renewer_;
};

}  // namespace ckptfs
