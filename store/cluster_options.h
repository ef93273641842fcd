// Options of a store shared by several nodes' daemons (cluster mode,
// docs/ARCHITECTURE.md "Cluster mode"). A store opened with `enabled` is
// recorded as shared in its superblock; a shared store is always opened in
// cluster mode.
#pragma once

#include <cstdint>
#include <string>

namespace ckptfs {

struct ClusterOptions {
  bool enabled = false;
  // This node's name, unique among the daemons serving the store; stub
  // records of files staged here carry its hash. Empty: the host name.
  std::string node;
  // Node-local directory for the bytes of files being written. Empty: the
  // store's staging/ for a single-node store, and
  // /var/tmp/ckptfs/<hash of the store path>/<node> for a shared one.
  std::string staging_dir;
  // Membership lease: the daemon renews its record every third of it; a
  // node whose record is older is dead, and any node may collect what it left.
  uint32_t lease_seconds = 30;
  // A pack is deleted only once it has been unreferenced for this long.
  uint32_t gc_grace_seconds = 600;
  // The daemon runs cluster GC (under the GC lease) this often; 0: never
  // (`ckptfs gc` does).
  uint32_t gc_interval_seconds = 0;
  // Where packs live: "" or "dir" (BACKING/packs/), or "rados:POOL".
  std::string packs;
  std::string ceph_conf = "/etc/ceph/ceph.conf";
};

}  // namespace ckptfs
