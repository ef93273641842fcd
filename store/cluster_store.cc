// Opening a store in cluster mode (docs/ARCHITECTURE.md "Cluster mode"):
// the superblock records it as shared, this daemon joins as a node, and
// its unpublished packs and staged bytes live in directories of its own.
#include <fcntl.h>
#include <unistd.h>

#include <string>

#include "base/hash.h"
#include "base/log.h"
#include "store/private_store.h"
#include "store/store.h"
#include "store/store_internal.h"

namespace ckptfs {
namespace {

// mkdir -p through Env, each new component private to the daemon.
Status MakeDirs(Env* env, const std::string& dir) {
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    const std::string at = dir.substr(0, slash);
    Status s = env->MkdirAt(AT_FDCWD, at, kPrivateDirMode);
    if (!s.ok() && s.code() != EEXIST) return s.WithContext("creating staging directory " + dir);
    if (slash == std::string::npos) return Status::Ok();
  }
}

}  // namespace

Status Store::OpenCluster(bool shared_already) {
  ClusterOptions& c = opts_.cluster;
  if (c.node.empty()) c.node = ThisHostName();
  node_id_ = NodeId(c.node);
  if (!opts_.take_lock) return OpenPinsWithoutJoining();
  if (!shared_already) {
    // A single-node daemon holds LOCK; it must not be serving the store
    // while it becomes shared. Stores are never turned back.
    ASSIGN_OR_RETURN(UniqueFd lock, internal::TakeLock(env_, root_.get(), path_));
    ASSIGN_OR_RETURN(internal::Superblock sb, internal::ReadSuperblock(env_, root_.get(), path_));
    sb.shared = true;
    RETURN_IF_ERROR(internal::WriteSuperblock(env_, root_.get(), path_, sb));
    spdlog::info("store {} is now shared (cluster mode, format version {})", path_, kStoreFormatVersion);
  }
  RETURN_IF_ERROR(OpenNodeStaging());
  MemberRecord self{.node = c.node, .staging = c.staging_dir, .lease_seconds = c.lease_seconds};
  ASSIGN_OR_RETURN(membership_, Membership::Join(env_, root_.get(), self));
  ASSIGN_OR_RETURN(tmp_, env_->OpenAt(membership_->tmp_dir_fd(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSIGN_OR_RETURN(pins_, env_->OpenAt(membership_->pins_dir_fd(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  spdlog::info("cluster: node {} (id {:016x}) joined store {}, staging in {}", c.node, node_id_, path_, c.staging_dir);
  return Status::Ok();
}

// A store opened without joining (tools, library users that manage a
// Membership themselves) still pins what its seals use, in the node's pins
// directory, when it may create it; `ckptfs gc` seals nothing and skips it.
Status Store::OpenPinsWithoutJoining() {
  if (!opts_.create_if_missing) return Status::Ok();
  const std::string node_dir = std::string(kNodesDirName) + "/" + opts_.cluster.node;
  for (const std::string& d : {std::string(kNodesDirName), node_dir, node_dir + "/" + kNodePinsDirName}) {
    Status s = env_->MkdirAt(root_.get(), d, kPrivateDirMode);
    if (!s.ok() && s.code() != EEXIST) return s.WithContext("store " + path_ + ": creating " + d + "/");
  }
  ASSIGN_OR_RETURN(pins_, env_->OpenAt(root_.get(), node_dir + "/" + kNodePinsDirName,
                                       O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  return Status::Ok();
}

// Where this node stages: -o staging=DIR, else for a shared store a
// node-local default named after the store, never the shared directory: a
// save must stall only on local disk.
Status Store::OpenNodeStaging() {
  ClusterOptions& c = opts_.cluster;
  if (c.staging_dir.empty()) {
    if (!cluster()) return Status::Ok();
    ASSIGN_OR_RETURN(const std::string real, env_->ReadlinkAt(AT_FDCWD, ProcFdPath(root_.get())));
    const uint64_t h = Checksum64(std::span(reinterpret_cast<const uint8_t*>(real.data()), real.size()));
    c.staging_dir = "/var/tmp/ckptfs/" + ObjectIdHex(h) + "/" + c.node;
  }
  RETURN_IF_ERROR(MakeDirs(env_, c.staging_dir));
  ASSIGN_OR_RETURN(UniqueFd dir, env_->OpenAt(AT_FDCWD, c.staging_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  // Staged bytes are the user's: the same rules as the store root.
  RETURN_IF_ERROR(CheckStoreRootIsTrusted(env_, dir.get(), c.staging_dir));
  // Through the fd just checked: by name, a parent that others can write
  // (/var/tmp/ckptfs) lets them swap a symlink in first.
  RETURN_IF_ERROR(env_->FchmodAt(AT_FDCWD, ProcFdPath(dir.get()), kPrivateDirMode, 0));
  staging_ = std::move(dir);
  return Status::Ok();
}

Result<StubRecord> Store::MarkStubClosed(int stub_fd, const StubRecord& rec, uint64_t size) {
  StubRecord next = rec;
  next.closed = true;
  next.size = size;
  ASSIGN_OR_RETURN(StubRecord written, WriteStub(env_, stub_fd, rec, next));
  // NFS shows another client a write only after it reaches the server.
  RETURN_IF_ERROR(env_->Fdatasync(stub_fd));
  return written;
}

Result<StubRecord> Store::MarkStubOpen(int stub_fd, const StubRecord& rec) {
  StubRecord next = rec;
  next.closed = false;
  ASSIGN_OR_RETURN(StubRecord written, WriteStub(env_, stub_fd, rec, next));
  RETURN_IF_ERROR(env_->Fdatasync(stub_fd));
  return written;
}

bool Store::NodeAlive(uint64_t node_id) {
  std::lock_guard lk(members_mu_);
  const uint64_t now = env_->WallTimeNs();
  if (now >= members_read_ns_ + 1000000000ull) {
    Result<std::vector<MemberRecord>> members = ReadMembers(env_, root_.get());
    if (!members.ok()) return true;  // cannot tell: treat as alive, and look again next time
    alive_nodes_.clear();
    for (const MemberRecord& m : *members) {
      if (MemberIsAlive(m, now, ThisHostName())) alive_nodes_.insert(NodeId(m.node));
    }
    members_read_ns_ = now;
  }
  return alive_nodes_.count(node_id) != 0;
}

bool Store::HiddenOnThisNode(int dir_fd, const std::string& name) {
  Result<UniqueFd> fd = env_->OpenAt(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (!fd.ok()) return false;
  Result<StubRecord> rec = ReadStub(env_, fd->get());
  return rec.ok() && rec->state == StubState::kStaged && rec->node != node_id_ &&
         (!rec->closed || !NodeAlive(rec->node));
}

void Store::RefreshIndexFromOtherNodes() {
  if (!cluster() || !index_loaded_) return;
  std::lock_guard lk(refresh_mu_);
  const uint64_t now = env_->WallTimeNs();
  // Checkpoint steps can follow each other within a second, and a step's
  // shards must find the last step's, sealed on other nodes a moment ago.
  if (now < last_refresh_ns_ + 100000000ull) return;
  last_refresh_ns_ = now;
  Result<std::vector<PackStat>> packs = ListPacks();
  if (!packs.ok()) {
    spdlog::warn("cluster: cannot list packs to find other nodes' files: {}", packs.status().message());
    return;
  }
  size_t added = 0;
  for (const PackStat& p : *packs) {
    if (index_.Contains(p.id)) continue;
    Result<std::shared_ptr<PackReader>> r = OpenPack(p.id);
    if (!r.ok() || !(*r)->meta_status().ok()) continue;  // being written, or deleted meanwhile
    index_.Add(p.id, (*r)->meta(), (*r)->header().logical_size, (*r)->header().chunk_size, (*r)->stored_size());
    // Another node's file: a lineage candidate. Whether a stub still names
    // it is that node's business; cluster GC never deletes it under a seal
    // that pinned it.
    index_.AddRoot(p.id);
    ++added;
  }
  if (added > 0) spdlog::debug("cluster: indexed {} pack(s) other nodes published", added);
}

}  // namespace ckptfs
