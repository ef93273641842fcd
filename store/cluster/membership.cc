#include "store/cluster/membership.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include <nlohmann/json.hpp>

#include "base/hash.h"
#include "base/log.h"
#include "store/object_id.h"
#include "store/private_store.h"

namespace ckptfs {
namespace {

constexpr size_t kMaxMemberBytes = 64 * 1024;
constexpr uint64_t kSeedNodeId = 0x4e4f4445ull;  // "NODE"

std::string Encode(const MemberRecord& r) {
  nlohmann::json j = {{"node", r.node},       {"host", r.host},
                      {"pid", r.pid},         {"staging", r.staging},
                      {"renewed_ns", r.renewed_ns}, {"lease_seconds", r.lease_seconds}};
  return j.dump() + "\n";
}

std::optional<MemberRecord> Decode(const std::string& node, const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  MemberRecord r;
  r.node = node;
  try {
    r.host = j.value("host", std::string());
    r.pid = j.value("pid", int64_t{0});
    r.staging = j.value("staging", std::string());
    r.renewed_ns = j.value("renewed_ns", uint64_t{0});
    r.lease_seconds = j.value("lease_seconds", uint32_t{0});
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  return r;
}

Result<std::string> ReadAll(Env* env, int dir_fd, const std::string& name) {
  return ReadFileToString(env, dir_fd, name, kMaxMemberBytes);
}

// tmp + rename: a reader on any node sees the old record or the new one.
// Not synced into the directory: a record lost with its node's power is an
// older lease, which only makes the node look dead sooner; it joins again.
Status WriteRecord(Env* env, int node_dir, const MemberRecord& r) {
  return WriteFileAtomically(env, node_dir, kMemberFileName, Encode(r), kPrivateFileMode, Durability::kData);
}

}  // namespace

std::string ThisHostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "unknown-host";
  return host;
}

uint64_t NodeId(const std::string& node) {
  const uint64_t h = Checksum64(std::span(reinterpret_cast<const uint8_t*>(node.data()), node.size()), kSeedNodeId);
  return h == 0 ? 1 : h;
}

bool MemberIsAlive(const MemberRecord& rec, uint64_t now_ns, const std::string& this_host) {
  if (rec.renewed_ns == 0) return false;
  if (rec.host == this_host && rec.pid > 0 && ::kill(static_cast<pid_t>(rec.pid), 0) != 0 && errno == ESRCH) {
    return false;
  }
  const uint64_t lease_ns = uint64_t{rec.lease_seconds} * 1000000000ull;
  return now_ns < rec.renewed_ns + lease_ns;
}

Result<std::vector<MemberRecord>> ReadMembers(Env* env, int root_fd) {
  std::vector<MemberRecord> out;
  Result<UniqueFd> nodes = env->OpenAt(root_fd, kNodesDirName, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (!nodes.ok() && nodes.status().code() == ENOENT) return out;
  if (!nodes.ok()) return nodes.status().WithContext("listing nodes/");
  ASSIGN_OR_RETURN(std::vector<DirEntry> entries, env->ListDir(nodes->get()));
  for (const DirEntry& e : entries) {
    if (e.type != DT_DIR && e.type != DT_UNKNOWN) continue;
    MemberRecord rec;
    rec.node = e.name;
    Result<UniqueFd> dir = env->OpenAt(nodes->get(), e.name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir.ok()) {
      if (Result<std::string> text = ReadAll(env, dir->get(), kMemberFileName); text.ok()) {
        if (std::optional<MemberRecord> r = Decode(e.name, *text)) rec = *r;
      }
    }
    out.push_back(std::move(rec));
  }
  return out;
}

Result<std::unique_ptr<Membership>> Membership::Join(Env* env, int root_fd, MemberRecord self) {
  self.host = ThisHostName();
  self.pid = ::getpid();
  ASSIGN_OR_RETURN(std::vector<MemberRecord> members, ReadMembers(env, root_fd));
  for (const MemberRecord& m : members) {
    if (m.node == self.node && MemberIsAlive(m, env->WallTimeNs(), self.host) && m.pid != self.pid) {
      return Status::Error(EBUSY, "node name " + self.node + " is in use by the ckptfs daemon of pid " +
                                      std::to_string(m.pid) + " on " + m.host +
                                      " (its lease is live); give each daemon its own -o node=NAME");
    }
  }
  std::unique_ptr<Membership> m(new Membership(env, std::move(self)));
  ASSIGN_OR_RETURN(UniqueFd nodes, EnsurePrivateDir(env, root_fd, kNodesDirName));
  ASSIGN_OR_RETURN(m->node_dir_, EnsurePrivateDir(env, nodes.get(), m->self_.node));
  ASSIGN_OR_RETURN(m->tmp_dir_, EnsurePrivateDir(env, m->node_dir_.get(), kNodeTmpDirName));
  ASSIGN_OR_RETURN(m->pins_dir_, EnsurePrivateDir(env, m->node_dir_.get(), kNodePinsDirName));
  RETURN_IF_ERROR(m->Renew().WithContext("joining the cluster as node " + m->self_.node));
  return m;
}

Status Membership::Renew() {
  std::lock_guard lk(mu_);
  self_.renewed_ns = env_->WallTimeNs();
  return WriteRecord(env_, node_dir_.get(), self_);
}

Status Membership::StartRenewing() {
  {
    std::lock_guard lk(mu_);
    self_.pid = ::getpid();
  }
  RETURN_IF_ERROR(Renew());
  if (!renewer_.joinable()) renewer_ = std::thread([this] { RenewLoop(); });
  return Status::Ok();
}

void Membership::RenewLoop() {
  const auto period = std::chrono::milliseconds(std::max<uint64_t>(100, uint64_t{self_.lease_seconds} * 1000 / 3));
  std::unique_lock lk(mu_);
  while (!cv_.wait_for(lk, period, [this] { return stop_; })) {
    lk.unlock();
    if (Status s = Renew(); !s.ok()) spdlog::error("cluster: renewing the membership lease failed: {}", s.message());
    lk.lock();
  }
}

Membership::~Membership() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (renewer_.joinable()) renewer_.join();
  // A clean exit leaves no record: nobody need wait for this lease to run out.
  if (node_dir_.valid()) (void)env_->UnlinkAt(node_dir_.get(), kMemberFileName);
}

}  // namespace ckptfs
