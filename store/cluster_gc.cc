// Store::CollectClusterGarbage: cluster GC's run (store/cluster_gc.h). Why
// the order of its steps makes it safe against seals on other nodes is in
// docs/ARCHITECTURE.md, "Cluster mode: GC".
#include "store/cluster_gc.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "base/log.h"
#include "base/sync_point.h"
#include "store/cluster/gc_lease.h"
#include "store/cluster/membership.h"
#include "store/cluster/seal_pin.h"
#include "store/live_packs.h"
#include "store/private_store.h"
#include "store/store.h"
#include "store/store_internal.h"

namespace ckptfs {
namespace {

constexpr uint64_t kNsPerSecond = 1000000000ull;

std::string PackPath(ObjectId id) { return "packs/" + internal::PackDirName(id) + "/" + internal::PackFileName(id); }

// Doomed markers hold a time and pins a pack id: anything larger is damage.
constexpr size_t kMaxMarkerBytes = 4096;

Result<std::string> ReadText(Env* env, int dir_fd, const std::string& name) {
  return ReadFileToString(env, dir_fd, name, kMaxMarkerBytes);
}

// What a dead node left: pin files and unpublished packs, by name.
struct DeadNode {
  std::string node;
  std::vector<std::string> pins, tmp;
};

class ClusterGc {
 public:
  ClusterGc(Store* store, const ClusterGcOptions& opts, ClusterGcReport* rep)
      : store_(store), env_(store->env()), opts_(opts), rep_(rep) {}
  Status Run();

 private:
  Status Round();
  Status ListPacksAndMarkers();
  Status ReadPins();
  Status ReadNodePins(const MemberRecord& m, bool alive, std::vector<DeadNode>* dead);
  Status CollectDeadNodes(const std::vector<DeadNode>& dead);
  Status ReadStubs();
  void Mark();
  internal::PackBases BasesOf(ObjectId id);
  Status Sweep();
  Status DeleteDoomed(const std::vector<ObjectId>& doomed);
  Status CreateMarker(ObjectId id);
  Status RemoveMarker(ObjectId id, bool counted = true);
  void Unreadable(const std::string& where, const std::string& why) {
    rep_->unreadable.push_back(where + ": " + why);
    Note("cannot read " + where + ": " + why);
  }
  // Logged at debug: `ckptfs gc` prints the actions, the daemon logs them.
  void Note(const std::string& line) {
    spdlog::debug("gc: {}", line);
    rep_->actions.push_back(line);
  }
  uint64_t grace_ns() const { return opts_.grace_seconds * kNsPerSecond; }
  Status Stopping() const {
    if (opts_.stop == nullptr || !opts_.stop->load()) return Status::Ok();
    return Status::Error(ECANCELED, "gc: stopped (unmounting)");
  }
  // Renews the lease through the long phases (the walk, the mark); whether
  // it is still ours is what step 5 checks.
  void KeepLease() {
    if (lease_->RenewalDue()) (void)lease_->Hold();
  }

  Store* store_;
  Env* env_;
  ClusterGcOptions opts_;
  ClusterGcReport* rep_;
  UniqueFd gc_dir_, doomed_dir_, nodes_dir_;
  std::unique_ptr<GcLease> lease_;
  // One round's view.
  std::map<ObjectId, Store::PackStat> packs_;
  std::unordered_map<ObjectId, uint64_t> markers_;  // -> when it was marked doomed
  std::vector<std::pair<ObjectId, std::string>> stub_roots_, pin_roots_, young_roots_;
  std::unordered_map<ObjectId, internal::PackBases> bases_;
  std::unordered_set<ObjectId> by_stub_, by_pin_, by_youth_;
};

Status ClusterGc::Run() {
  const int root = store_->root_fd();
  ASSIGN_OR_RETURN(gc_dir_, EnsurePrivateDir(env_, root, kGcDirName));
  ASSIGN_OR_RETURN(doomed_dir_, EnsurePrivateDir(env_, gc_dir_.get(), kGcDoomedDirName));
  ASSIGN_OR_RETURN(nodes_dir_, EnsurePrivateDir(env_, root, kNodesDirName));
  const std::string holder =
      opts_.holder.empty() ? "gc@" + ThisHostName() + ":" + std::to_string(::getpid()) : opts_.holder;
  ASSIGN_OR_RETURN(lease_, GcLease::Acquire(env_, gc_dir_.get(), holder, opts_.lease_seconds * kNsPerSecond));
  RETURN_IF_ERROR(Round());
  // A marker made in this run's round counts only for a later round (whose
  // pins are read after it): with no grace to wait, that round is now.
  if (opts_.grace_seconds == 0 && rep_->swept() && rep_->markers_created > 0) {
    // What is kept is what the last round kept; what was done adds up.
    rep_->kept_referenced = rep_->kept_pinned = rep_->kept_young = rep_->kept_doomed = 0;
    RETURN_IF_ERROR(Round());
  }
  return lease_->Release();
}

Status ClusterGc::Round() {
  RETURN_IF_ERROR(ListPacksAndMarkers());
  RETURN_IF_ERROR(Stopping());
  RETURN_IF_ERROR(ReadPins());
  RETURN_IF_ERROR(Stopping());
  RETURN_IF_ERROR(ReadStubs());
  RETURN_IF_ERROR(Stopping());
  Mark();
  RETURN_IF_ERROR(Stopping());
  if (!rep_->unreadable.empty()) {
    Note("changed nothing: " + std::to_string(rep_->unreadable.size()) +
         " object(s) could not be read, and any pack may be what they need");
    return Status::Ok();
  }
  return Sweep();
}

// Step 1. Markers are listed before the pins are read: a seal that pinned a
// pack after that read checks for the marker, which then already exists.
Status ClusterGc::ListPacksAndMarkers() {
  packs_.clear();
  markers_.clear();
  ASSIGN_OR_RETURN(std::vector<Store::PackStat> packs, store_->ListPacks());
  for (const Store::PackStat& p : packs) packs_.emplace(p.id, p);
  ASSIGN_OR_RETURN(std::vector<DirEntry> entries, env_->ListDir(doomed_dir_.get()));
  for (const DirEntry& e : entries) {
    std::optional<ObjectId> id = ParseObjectIdHex(e.name);
    if (!id) continue;
    Result<std::string> text = ReadText(env_, doomed_dir_.get(), e.name);
    if (!text.ok() && text.status().code() == ENOENT) continue;
    // A marker that cannot be read waits from now; one whose time does not
    // parse (torn by a crash) is removed, and made again in step 5.
    uint64_t when = env_->WallTimeNs();
    if (text.ok()) {
      try {
        when = std::stoull(*text);
      } catch (const std::exception&) {
        (void)RemoveMarker(*id);
        continue;
      }
    }
    markers_[*id] = when;
  }
  return Status::Ok();
}

// Step 2: the pins of every node.
Status ClusterGc::ReadPins() {
  pin_roots_.clear();
  ASSIGN_OR_RETURN(std::vector<MemberRecord> members, ReadMembers(env_, store_->root_fd()));
  const std::string host = ThisHostName();
  std::vector<DeadNode> dead;
  for (const MemberRecord& m : members) {
    RETURN_IF_ERROR(ReadNodePins(m, MemberIsAlive(m, env_->WallTimeNs(), host), &dead));
  }
  return CollectDeadNodes(dead);
}

// A dead node's pins count in this round too: the node may have rejoined
// since its record was read, and pinned a base since.
Status ClusterGc::ReadNodePins(const MemberRecord& m, bool alive, std::vector<DeadNode>* dead) {
  const std::string dir = std::string(kNodesDirName) + "/" + m.node + "/";
  DeadNode left{m.node, {}, {}};
  Result<UniqueFd> pins = env_->OpenAt(nodes_dir_.get(), m.node + "/" + kNodePinsDirName, O_RDONLY | O_DIRECTORY);
  Result<std::vector<DirEntry>> names =
      pins.ok() ? env_->ListDir(pins->get()) : Result<std::vector<DirEntry>>(pins.status());
  if (!names.ok() && names.status().code() != ENOENT) {
    Unreadable(dir + kNodePinsDirName + "/", names.status().message());
  }
  for (const DirEntry& e : names.ok() ? *names : std::vector<DirEntry>{}) {
    if (!e.name.ends_with(kPinSuffix)) continue;
    Result<std::string> text = ReadText(env_, pins->get(), e.name);
    if (!text.ok() && text.status().code() == ENOENT) continue;  // that seal is over: its stub names its pack
    if (!text.ok()) {
      Unreadable(dir + kNodePinsDirName + "/" + e.name, text.status().message());
      continue;
    }
    for (ObjectId id : ParsePinFile(*text)) pin_roots_.emplace_back(id, "pin " + dir + kNodePinsDirName + "/" + e.name);
    left.pins.push_back(e.name);
  }
  if (alive) return Status::Ok();
  Result<UniqueFd> tmp = env_->OpenAt(nodes_dir_.get(), m.node + "/" + kNodeTmpDirName, O_RDONLY | O_DIRECTORY);
  if (tmp.ok()) {
    if (Result<std::vector<DirEntry>> t = env_->ListDir(tmp->get()); t.ok()) {
      for (const DirEntry& e : *t) left.tmp.push_back(e.name);
    }
  }
  if (!left.pins.empty() || !left.tmp.empty()) dead->push_back(std::move(left));
  return Status::Ok();
}

// What dead nodes left goes, once their records, read again now (after
// everything was listed), still say dead: a node that rejoined meanwhile
// keeps what it made since.
Status ClusterGc::CollectDeadNodes(const std::vector<DeadNode>& dead) {
  if (dead.empty()) return Status::Ok();
  ASSIGN_OR_RETURN(std::vector<MemberRecord> members, ReadMembers(env_, store_->root_fd()));
  const std::string host = ThisHostName();
  for (const DeadNode& d : dead) {
    auto m = std::find_if(members.begin(), members.end(), [&](const MemberRecord& r) { return r.node == d.node; });
    if (m != members.end() && MemberIsAlive(*m, env_->WallTimeNs(), host)) continue;
    const std::string dir = std::string(kNodesDirName) + "/" + d.node + "/";
    for (const std::string& name : d.pins) {
      Status s = env_->UnlinkAt(nodes_dir_.get(), d.node + "/" + kNodePinsDirName + "/" + name);
      if (!s.ok() && s.code() != ENOENT) return s.WithContext("gc: removing a dead node's pin " + dir + name);
      ++rep_->dead_pins_removed;
      Note("removed pin " + dir + kNodePinsDirName + "/" + name + " of dead node " + d.node);
    }
    for (const std::string& name : d.tmp) {
      Status s = env_->UnlinkAt(nodes_dir_.get(), d.node + "/" + kNodeTmpDirName + "/" + name);
      if (!s.ok() && s.code() != ENOENT) return s.WithContext("gc: removing a dead node's " + dir + "tmp/" + name);
      ++rep_->dead_tmp_removed;
      Note("removed unpublished " + dir + kNodeTmpDirName + "/" + name + " of dead node " + d.node);
    }
  }
  return Status::Ok();
}

// Step 3: what every stub names. Staged stubs name node-local staging
// files, no pack.
Status ClusterGc::ReadStubs() {
  stub_roots_.clear();
  std::unordered_set<ino_t> seen;
  auto visit = [this](const std::string& path, int fd, const Status& open_status) {
    RETURN_IF_ERROR(Stopping());
    KeepLease();
    const std::string where = "ns/" + path;
    if (path.ends_with('/')) {
      Unreadable(where + " (directory)", open_status.message());
    } else if (!open_status.ok()) {
      // A stub unlinked between the listing and the open names nothing now.
      if (open_status.code() != ENOENT) Unreadable(where + " (stub)", "cannot open: " + open_status.message());
    } else if (Result<StubSlots> slots = ReadStubSlots(env_, fd); !slots.ok()) {
      Unreadable(where + " (stub)", slots.status().message());
    } else if (!slots->damaged.empty()) {
      Unreadable(where + " (stub)", "damaged slot: " + slots->damaged);
    } else if (slots->current.state == StubState::kSealed && slots->current.object != 0) {
      stub_roots_.emplace_back(slots->current.object, where);
    }
    return Status::Ok();
  };
  return internal::WalkTree(env_, store_->ns_fd(), "", visit, &seen).WithContext("gc");
}

internal::PackBases ClusterGc::BasesOf(ObjectId id) {
  if (auto it = bases_.find(id); it != bases_.end()) return it->second;
  KeepLease();
  internal::PackBases pack;
  pack.where = PackPath(id);
  if (Result<uint64_t> size = store_->PackFileSize(id); !size.ok() && size.status().code() == ENOENT) {
    return bases_[id] = pack;
  }
  pack.exists = true;
  Result<std::shared_ptr<PackReader>> r = store_->OpenPack(id);
  if (!r.ok()) {
    Unreadable(pack.where + " (pack header or chunk table)", r.status().message());
  } else if (!(*r)->meta_status().ok()) {
    Unreadable(pack.where + " (meta block)", (*r)->meta_status().message());
  } else {
    pack.bases = (*r)->meta().bases;
  }
  return bases_[id] = pack;
}

// Step 4. Only a pack a stub needs may not be missing: a pin may name a
// pack not yet published, or one gone that its seal will find gone.
void ClusterGc::Mark() {
  bases_.clear();
  young_roots_.clear();
  const uint64_t now = env_->WallTimeNs();
  for (const auto& [id, p] : packs_) {
    // With no grace, no youth either: the pack's mtime is the file
    // server's clock, and the mark must not hang on clock skew.
    if (grace_ns() > 0 && p.mtime_ns + grace_ns() > now) young_roots_.emplace_back(id, "the grace period");
  }
  auto lookup = [this](ObjectId id) { return BasesOf(id); };
  auto damage = [this](ObjectId id, const std::string& needer) {
    Unreadable(PackPath(id), "missing, but " + needer + " needs it");
  };
  auto fine = [](ObjectId, const std::string&) {};
  by_stub_ = internal::MarkLive(stub_roots_, lookup, damage);
  by_pin_ = internal::MarkLive(pin_roots_, lookup, fine);
  by_youth_ = internal::MarkLive(young_roots_, lookup, fine);
}

// Step 5.
Status ClusterGc::Sweep() {
  if (Status held = lease_->Hold(); !held.ok()) {
    rep_->lease_lost = true;
    Note(held.message());
    return Status::Ok();
  }
  const uint64_t now = env_->WallTimeNs();
  std::vector<ObjectId> doomed;
  for (const auto& [id, p] : packs_) {
    const bool by_stub = by_stub_.count(id) > 0, by_pin = by_pin_.count(id) > 0, young = by_youth_.count(id) > 0;
    const auto marker = markers_.find(id);
    if (by_stub || by_pin || young) {
      by_stub ? ++rep_->kept_referenced : by_pin ? ++rep_->kept_pinned : ++rep_->kept_young;
      if (by_pin && !by_stub) Note("kept " + PackPath(id) + ": pinned by a seal in flight");
      if (young && !by_stub && !by_pin) Note("kept " + PackPath(id) + ": unneeded, but within the grace period");
      if (marker != markers_.end()) RETURN_IF_ERROR(RemoveMarker(id));
    } else if (marker == markers_.end()) {
      RETURN_IF_ERROR(CreateMarker(id));
      ++rep_->kept_doomed;
    } else if (now >= marker->second && now - marker->second >= grace_ns()) {
      doomed.push_back(id);
    } else {
      ++rep_->kept_doomed;
      Note("kept " + PackPath(id) + ": doomed, deleted after " +
           std::to_string((marker->second + grace_ns() - std::min(now, marker->second + grace_ns())) / kNsPerSecond) +
           " more second(s) of grace");
    }
  }
  for (const auto& [id, when] : markers_) {
    if (!packs_.count(id)) RETURN_IF_ERROR(RemoveMarker(id));  // a deletion interrupted before its marker went
  }
  return DeleteDoomed(doomed);
}

Status ClusterGc::DeleteDoomed(const std::vector<ObjectId>& doomed) {
  if (doomed.empty()) return Status::Ok();
  // The unlinks and renames that dropped the stubs naming these must not
  // come back after a power cut naming deleted packs.
  RETURN_IF_ERROR(env_->SyncFs(store_->root_fd()).WithContext("gc: making the namespace durable before deleting"));
  for (ObjectId id : doomed) {
    RETURN_IF_ERROR(Stopping());
    if (Status held = lease_->Hold(); !held.ok()) {
      rep_->lease_lost = true;
      Note(held.message());
      return Status::Ok();
    }
    const uint64_t bytes = packs_[id].bytes;
    RETURN_IF_ERROR(store_->DeletePack(id).WithContext("gc: deleting " + PackPath(id)));
    RETURN_IF_ERROR(RemoveMarker(id, /*counted=*/false));
    rep_->deleted.push_back({id, bytes});
    rep_->bytes_deleted += bytes;
    Note("deleted " + PackPath(id) + " (" + std::to_string(bytes) + " bytes): unneeded for the whole grace period");
  }
  return Status::Ok();
}

Status ClusterGc::CreateMarker(ObjectId id) {
  const std::string text = std::to_string(env_->WallTimeNs()) + "\n";
  Result<UniqueFd> fd =
      env_->OpenAt(doomed_dir_.get(), ObjectIdHex(id), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, kPrivateFileMode);
  if (!fd.ok() && fd.status().code() == EEXIST) return Status::Ok();
  if (!fd.ok()) return fd.status().WithContext("gc: marking " + PackPath(id) + " doomed");
  const std::span bytes(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  RETURN_IF_ERROR(env_->PWriteAll(fd->get(), bytes, 0).WithContext("gc: marking " + PackPath(id) + " doomed"));
  RETURN_IF_ERROR(env_->Fdatasync(fd->get()).WithContext("gc: marking " + PackPath(id) + " doomed"));
  ++rep_->markers_created;
  Note("marked " + PackPath(id) + " doomed: no stub, pin or live pack needs it");
  return Status::Ok();
}

Status ClusterGc::RemoveMarker(ObjectId id, bool counted) {
  Status s = env_->UnlinkAt(doomed_dir_.get(), ObjectIdHex(id));
  if (!s.ok() && s.code() != ENOENT) return s.WithContext("gc: removing marker gc/doomed/" + ObjectIdHex(id));
  if (counted) ++rep_->markers_removed;
  return Status::Ok();
}

}  // namespace

Result<ClusterGcReport> Store::CollectClusterGarbage(const ClusterGcOptions& gc) {
  if (!opts_.cluster.enabled) {
    return Status::InvalidArgument("store " + path_ + " is not shared: cluster GC runs on cluster stores only");
  }
  ClusterGcReport rep;
  RETURN_IF_ERROR(ClusterGc(this, gc, &rep).Run());
  return rep;
}

PeriodicClusterGc::PeriodicClusterGc(Store* store, uint32_t interval_seconds, ClusterGcOptions gc)
    : store_(store), interval_seconds_(std::max(1u, interval_seconds)), gc_(std::move(gc)) {
  gc_.stop = &stopping_;
  thread_ = std::thread([this] { Loop(); });
}

PeriodicClusterGc::~PeriodicClusterGc() {
  stopping_ = true;
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void PeriodicClusterGc::Loop() {
  std::unique_lock lk(mu_);
  while (!cv_.wait_for(lk, std::chrono::seconds(interval_seconds_), [this] { return stop_; })) {
    lk.unlock();
    Result<ClusterGcReport> rep = store_->CollectClusterGarbage(gc_);
    if (!rep.ok()) {
      if (rep.status().code() == ECANCELED) {
        spdlog::info("gc: stopped for the unmount");
      } else if (rep.status().code() == EBUSY) {
        spdlog::info("gc: skipped this run: {}", rep.status().message());
      } else {
        spdlog::error("gc: {}", rep.status().message());
      }
    } else {
      for (const std::string& line : rep->actions) spdlog::info("gc: {}", line);
      spdlog::info("gc: deleted {} pack(s) ({} bytes); kept {} needed, {} pinned, {} young, {} doomed{}",
                   rep->deleted.size(), rep->bytes_deleted, rep->kept_referenced, rep->kept_pinned, rep->kept_young,
                   rep->kept_doomed, rep->swept() ? "" : "; stopped early or changed nothing (see above)");
    }
    CKPTFS_SYNC_POINT("PeriodicClusterGc::Loop:AfterRun");
    lk.lock();
  }
}

}  // namespace ckptfs
