#include "mount-tools/commands.h"
#include "mount-tools/daemon.h"
#include "mount-tools/progress.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/log.h"
#include "fuse/mount.h"
#include "store/cluster_gc.h"
#include "store/store.h"
#include "seal/seal_planner.h"

namespace ckptfs {
namespace {

namespace fs = std::filesystem;

std::string Normal(const std::string& path) {
  std::string s = fs::absolute(path).lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

const MountEntry* FindMount(const std::vector<MountEntry>& mounts, const std::string& path) {
  const MountEntry* best = nullptr;
  for (const auto& m : mounts) {
    if (m.fstype != "fuse.ckptfs") continue;
    const bool inside = path == m.mountpoint || path.rfind(m.mountpoint == "/" ? "/" : m.mountpoint + "/", 0) == 0;
    if (inside && (!best || m.mountpoint.size() > best->mountpoint.size())) best = &m;
  }
  return best;
}


double Ratio(uint64_t logical, uint64_t stored) {
  return stored == 0 ? 0.0 : static_cast<double>(logical) / static_cast<double>(stored);
}

bool RunProgram(std::vector<std::string> argv) {
  pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    ::execvp(a[0], a.data());
    ::_exit(127);
  }
  int status = 0;
  return pid > 0 && ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// The daemon holds LOCK until it has drained its seals and exited.
bool WaitForStoreRelease(const std::string& backing, double timeout_s) {
  UniqueFd fd(::open((backing + "/LOCK").c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return true;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::flock(fd.get(), LOCK_UN);
  return true;
}

Result<std::pair<std::string, std::string>> ResolveStore(const std::string& path) {
  const std::string abs = Normal(path);
  auto mounts = ReadMounts();
  const MountEntry* m = FindMount(mounts, abs);
  std::error_code ec;
  // The kernel answers from its caches for names and attributes below a
  // dead mount (ENOTDIR for FILE/CKPTFS); statfs always asks the daemon.
  struct statvfs sv {};
  if (m != nullptr && ::statvfs(m->mountpoint.c_str(), &sv) != 0 && errno == ENOTCONN)
    ec = std::make_error_code(std::errc::not_connected);
  const bool is_store = !ec && fs::exists(abs + "/CKPTFS", ec);
  if (ec == std::errc::not_connected) {
    const std::string mnt = m != nullptr ? m->mountpoint : abs;
    return Status::Error(ENOTCONN, path + " is on a stale ckptfs mount (its daemon is gone); run `ckptfs umount " +
                                       mnt + "` and mount it again, or run stats on the backing directory" +
                                       (m != nullptr ? " " + m->source : std::string()));
  }
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory && m == nullptr)
    return Status::Error(ec.value(), "cannot look at " + path + ": " + ec.message());
  if (is_store) return std::make_pair(abs, std::string());
  if (m == nullptr)
    return Status::Error(ENOENT, path + " is neither a ckptfs store (no CKPTFS file) nor inside a ckptfs mount");
  std::string sub =
      abs.size() > m->mountpoint.size() ? abs.substr(m->mountpoint.size() + (m->mountpoint == "/" ? 0 : 1)) : "";
  return std::make_pair(m->source, sub);
}

Result<std::unique_ptr<Store>> OpenReadOnly(const std::string& backing, const std::string& ceph_conf) {
  StoreOptions so;
  so.planner = &FormatSealPlanner();
  so.cluster.ceph_conf = ceph_conf;
  so.create_if_missing = false;
  so.take_lock = false;
  return Store::Open(Env::Default(), backing, so);
}

}  // namespace

int RunUmount(const std::string& mountpoint, bool lazy, double timeout_s) {
  const std::string abs = Normal(mountpoint);
  const std::optional<MountEntry> m = FuseMountAt(abs);
  if (!m) {
    std::cerr << "ckptfs umount: " << abs << " is not a FUSE mount point\n";
    return 2;
  }
  const std::string backing = m->source;
  if (::umount2(abs.c_str(), lazy ? MNT_DETACH : 0) != 0) {
    const int err = errno;
    if (err == EBUSY) {
      std::cerr << "ckptfs umount: " << abs << " is busy (files are open or a process has its cwd there); "
                << "close them, or use --lazy to detach now and finish when they close\n";
      return 2;
    }
    // Not root: the setuid helper may unmount our own mounts.
    std::vector<std::string> argv = {"fusermount3", lazy ? "-uz" : "-u", abs};
    if (!RunProgram(argv)) {
      std::cerr << "ckptfs umount: " << abs << ": " << std::strerror(err) << "\n";
      return 2;
    }
  }
  if (!WaitForStoreRelease(backing, timeout_s) || !WaitForMountLock(abs, timeout_s)) {
    std::cerr << "ckptfs umount: unmounted " << abs << ", but the daemon is still sealing files after " << timeout_s
              << " s; it will finish in the background\n";
    return 2;
  }
  return 0;
}

namespace {

// Lossy files: the largest error measured per role.
std::string LossyErrors(const std::optional<LossyInfo>& l) {
  if (!l) return "-";
  static const char* kRole[3] = {"w", "m", "v"};
  std::string out;
  for (size_t r = 0; r < 3; ++r) {
    if (l->roles[r].elements == 0) continue;
    char buf[48];
    std::snprintf(buf, sizeof(buf), "%s%s %.3g", out.empty() ? "" : " ", kRole[r], l->roles[r].max_error);
    out += buf;
  }
  if (out.empty()) return "none lossy";
  // How the weights' errors were weighed, when it is not the file's own moments.
  if (l->sensitivity == SensitivityRule::kMagnitude) out += " (magnitude)";
  if (l->sensitivity == SensitivityRule::kSibling) out += " (sibling)";
  // Weights bounded in steps of the optimizer, not relative error.
  if (l->measure == BudgetMeasure::kOneStep) out += " (w in steps)";
  return out;
}

nlohmann::json LossyJson(const std::optional<LossyInfo>& l) {
  if (!l) return nullptr;
  static const char* kRole[3] = {"weights", "first_moments", "second_moments"};
  nlohmann::json j = {{"fidelity", l->fidelity},
                      {"exact_elements", l->exact_elements},
                      {"scope", lossy::LossyScopeName(l->scope)},
                      {"sensitivity", SensitivityRuleName(l->sensitivity)},
                      {"measure", BudgetMeasureName(l->measure)}};
  for (size_t r = 0; r < 3; ++r) {
    j[kRole[r]] = {{"target", l->roles[r].target},
                   {"max_error", l->roles[r].max_error},
                   {"elements", l->roles[r].elements},
                   {"stored", l->roles[r].stored}};
  }
  return j;
}

// Which file each pack holds, for naming a file's base. Stats of a subtree
// or one file list only its files, while a base may be anywhere in the
// store: then the whole store is listed too.
std::unordered_map<ObjectId, std::string> FileOfPack(Store& store, const std::vector<FileUsage>& usage,
                                                     const std::string& subpath) {
  std::unordered_map<ObjectId, std::string> out;
  auto add = [&out](const std::vector<FileUsage>& files) {
    for (const auto& f : files)
      if (f.pack != 0 && !f.staged) out.emplace(f.pack, f.path);
  };
  add(usage);
  const bool missing = std::any_of(usage.begin(), usage.end(),
                                   [&out](const FileUsage& f) { return f.base != 0 && !out.contains(f.base); });
  if (!subpath.empty() && missing) {
    if (Result<std::vector<FileUsage>> all = store.Usage(""); all.ok()) add(*all);
  }
  return out;
}

}  // namespace

int RunStats(const std::string& path, bool json, const std::string& ceph_conf) {
  auto where = ResolveStore(path);
  if (!where.ok()) {
    std::cerr << "ckptfs stats: " << where.status().message() << "\n";
    return 2;
  }
  auto store = OpenReadOnly(where->first, ceph_conf);
  if (!store.ok()) {
    std::cerr << "ckptfs stats: " << store.status().message();
    if (store.status().code() == EACCES)
      std::cerr << " (stats reads the backing store, which is private to the daemon's user)";
    std::cerr << "\n";
    return 2;
  }
  auto usage = store.value()->Usage(where->second);
  if (!usage.ok()) {
    std::cerr << "ckptfs stats: " << usage.status().message() << "\n";
    return 2;
  }
  std::sort(usage->begin(), usage->end(), [](const FileUsage& a, const FileUsage& b) { return a.path < b.path; });
  uint64_t logical = 0, stored = 0;
  for (const auto& f : usage.value()) {
    logical += f.logical;
    stored += f.stored;
  }
  const std::unordered_map<ObjectId, std::string> file_of_pack = FileOfPack(*store.value(), *usage, where->second);
  auto base_name = [&](const FileUsage& f) -> std::string {
    if (f.base == 0) return "";
    auto it = file_of_pack.find(f.base);
    return it != file_of_pack.end() ? it->second : "(deleted file, pack " + ObjectIdHex(f.base) + ")";
  };
  // Packs of deleted files kept as bases of others, or for an inode the
  // kernel has not forgotten yet, belong to no file: shown
  // separately for a whole store, so the total is what the disk holds.
  uint64_t kept = 0;
  if (where->second.empty()) {
    uint64_t own = 0;
    for (const auto& f : usage.value())
      if (!f.staged && f.pack != 0) own += f.stored;
    if (Result<uint64_t> all = store.value()->AllPackBytes(); all.ok() && *all > own) kept = *all - own;
  }
  if (json) {
    nlohmann::json out;
    out["files"] = nlohmann::json::array();
    for (const auto& f : usage.value())
      out["files"].push_back({{"path", f.path},
                              {"logical", f.logical},
                              {"stored", f.stored},
                              {"ratio", Ratio(f.logical, f.stored)},
                              {"staged", f.staged},
                              {"base", base_name(f)},
                              {"depth", f.depth},
                              {"lossy", LossyJson(f.lossy)}});
    out["total"] = {{"logical", logical},
                    {"stored", stored + kept},
                    {"ratio", Ratio(logical, stored + kept)},
                    {"files", usage->size()},
                    {"kept_for_bases", kept}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::printf("%-50s %12s %12s %8s %-7s %5s %-28s %s\n", "file", "logical", "stored", "ratio", "state", "depth",
              "lossy error (max)", "base");
  for (const auto& f : usage.value())
    std::printf("%-50s %12s %12s %7.2fx %-7s %5u %-28s %s\n", f.path.c_str(), HumanBytes(f.logical).c_str(),
                HumanBytes(f.stored).c_str(), Ratio(f.logical, f.stored),
                f.staged ? "staged" : f.lossy ? "lossy" : "sealed", static_cast<unsigned>(f.depth),
                LossyErrors(f.lossy).c_str(), base_name(f).c_str());
  if (kept > 0) std::printf("%-50s %12s %12s\n", "(packs of deleted files: bases, or still open)", "", HumanBytes(kept).c_str());
  std::printf("%-50s %12s %12s %7.2fx %zu files\n", "total", HumanBytes(logical).c_str(), HumanBytes(stored + kept).c_str(),
              Ratio(logical, stored + kept), usage->size());
  return 0;
}

namespace {

// Whether the superblock records the store as shared by several nodes
// ("shared": true). Unreadable: not shared; Store::Open then says why.
bool StoreIsShared(const std::string& backing) {
  Result<UniqueFd> fd = Env::Default()->OpenAt(AT_FDCWD, backing + "/CKPTFS", O_RDONLY);
  if (!fd.ok()) return false;
  std::string text(64 * 1024, '\0');
  Result<size_t> n =
      Env::Default()->PRead(fd->get(), std::span(reinterpret_cast<uint8_t*>(text.data()), text.size()), 0);
  if (!n.ok()) return false;
  text.resize(*n);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("shared") && j["shared"].is_boolean() && j["shared"].get<bool>();
}

void PrintClusterGcSummary(const ClusterGcReport& r, uint64_t grace) {
  std::cout << "gc: deleted " << r.deleted.size() << " pack(s), " << HumanBytes(r.bytes_deleted) << "; kept "
            << r.kept_referenced << " that files need, " << r.kept_pinned << " pinned by seals in flight, "
            << r.kept_young << " written less than the grace period (" << grace << " s) ago, " << r.kept_doomed
            << " marked doomed and waiting out the grace period\n";
  if (r.dead_pins_removed + r.dead_tmp_removed > 0) {
    std::cout << "gc: removed " << r.dead_pins_removed << " pin(s) and " << r.dead_tmp_removed
              << " unpublished pack(s) of dead nodes\n";
  }
}

nlohmann::json ClusterGcJson(const ClusterGcReport& r, uint64_t grace) {
  return {{"cluster", true},
          {"deleted_packs", r.deleted.size()},
          {"bytes_deleted", r.bytes_deleted},
          {"kept_referenced", r.kept_referenced},
          {"kept_pinned", r.kept_pinned},
          {"kept_young", r.kept_young},
          {"kept_doomed", r.kept_doomed},
          {"grace_seconds", grace},
          {"lease_lost", r.lease_lost},
          {"unreadable", r.unreadable},
          {"actions", r.actions}};
}

// Cluster GC beside the mounted daemons: no LOCK (they do not hold it
// either), one collector at a time through the GC lease.
int RunClusterGc(const std::string& backing, std::optional<uint32_t> grace, const std::string& ceph_conf, bool json) {
  StoreOptions so;
  so.planner = &FormatSealPlanner();
  so.cluster.ceph_conf = ceph_conf;
  so.create_if_missing = false;
  so.take_lock = false;
  so.cluster.enabled = true;
  auto store = Store::Open(Env::Default(), backing, so);
  if (!store.ok()) {
    std::cerr << "ckptfs gc: " << store.status().message() << "\n";
    return 2;
  }
  const uint64_t g = grace.value_or((*store)->options().cluster.gc_grace_seconds);
  auto rep = (*store)->CollectClusterGarbage(ClusterGcOptions{.grace_seconds = g});
  if (!rep.ok()) {
    std::cerr << "ckptfs gc: " << rep.status().message() << "\n";
    return 2;
  }
  if (json) {
    std::cout << ClusterGcJson(*rep, g).dump(2) << "\n";
  } else {
    for (const std::string& line : rep->actions) std::cout << line << "\n";
    PrintClusterGcSummary(*rep, g);
  }
  if (rep->lease_lost) {
    std::cerr << "ckptfs gc: stopped early: the GC lease was lost (another collector took it over)\n";
    return 2;
  }
  if (!rep->unreadable.empty()) {
    std::cerr << "ckptfs gc: changed nothing: " << rep->unreadable.size()
              << " object(s) could not be read, and any pack may be what they need:\n";
    for (const std::string& u : rep->unreadable) std::cerr << "  " << u << "\n";
    std::cerr << "ckptfs gc: run `ckptfs fsck " << backing << "`, repair or restore what it names, then run gc again\n";
    return 1;
  }
  return 0;
}

}  // namespace

int RunGc(const std::string& backing, std::optional<uint32_t> grace, const std::string& ceph_conf, bool json) {
  // stdout is the JSON alone; what recovery logs is in its "actions".
  if (json) (void)InitLogging("", "warn");  // stderr only: cannot fail
  if (StoreIsShared(Normal(backing))) return RunClusterGc(Normal(backing), grace, ceph_conf, json);
  if (grace) {
    std::cerr << "ckptfs gc: --grace applies to shared (cluster) stores only; " << Normal(backing)
              << " is a single-node store, whose gc deletes what nothing needs at once\n";
    return 2;
  }
  StoreOptions so;
  so.planner = &FormatSealPlanner();
  so.cluster.ceph_conf = ceph_conf;
  so.create_if_missing = false;
  auto store = Store::Open(Env::Default(), Normal(backing), so);
  if (!store.ok()) {
    std::cerr << "ckptfs gc: " << store.status().message();
    if (store.status().code() == EBUSY) std::cerr << " (a mounted store collects its own garbage as files are deleted)";
    std::cerr << "\n";
    return 2;
  }
  if (!json)
    for (const std::string& line : store.value()->made_private()) std::cout << line << "\n";
  Progress progress("gc", 0, ShouldShowProgress(), "packs");
  auto rep = store.value()->Recover([&](uint64_t read, uint64_t total) {
    progress.SetTotal(total);
    progress.Update(read);
  });
  progress.Finish();
  if (!rep.ok()) {
    std::cerr << "ckptfs gc: " << rep.status().message() << "\n";
    return 2;
  }
  if (json) {
    const nlohmann::json out = {{"cluster", false},
                                {"deleted_packs", rep->orphan_packs_removed},
                                {"deleted_staging", rep->orphan_staging_removed},
                                {"kept_packs", store.value()->index().size()},
                                {"packs_read", progress.done()},
                                {"unreadable", rep->unreadable},
                                {"actions", rep->actions}};
    std::cout << out.dump(2) << "\n";
    return rep->swept() ? 0 : 1;
  }
  for (const std::string& line : rep->actions) std::cout << line << "\n";
  if (!rep->swept()) {
    // Exit 1 as fsck does for a damaged store: the command ran, but could
    // not do its job, and says why.
    std::cerr << "ckptfs gc: deleted nothing: " << rep->unreadable.size()
              << " object(s) could not be read, and any pack or staging file may be what they need:\n";
    for (const std::string& u : rep->unreadable) std::cerr << "  " << u << "\n";
    std::cerr << "ckptfs gc: run `ckptfs fsck " << Normal(backing)
              << "`, repair or restore what it names, then run gc again\n";
    return 1;
  }
  std::cout << "gc: removed " << rep->orphan_packs_removed << " pack(s) and " << rep->orphan_staging_removed
            << " staging file(s) that nothing needs; " << store.value()->index().size() << " pack(s) kept\n";
  return 0;
}

namespace {

// What fsck will verify, for its progress line: the sealed files' bytes.
uint64_t SealedLogicalBytes(Store& store) {
  auto files = store.Usage();
  uint64_t sum = 0;
  if (files.ok())
    for (const FileUsage& f : *files) sum += f.staged ? 0 : f.logical;
  return sum;
}

}  // namespace

int RunFsck(const std::string& backing, bool json, const std::string& ceph_conf) {
  auto store = OpenReadOnly(Normal(backing), ceph_conf);
  if (!store.ok()) {
    std::cerr << "ckptfs fsck: " << store.status().message() << "\n";
    return 2;
  }
  Progress progress("fsck", SealedLogicalBytes(**store), ShouldShowProgress());
  auto report = store.value()->Fsck([&](uint64_t checked) { progress.Update(checked); });
  progress.Finish();
  if (!report.ok()) {
    std::cerr << "ckptfs fsck: " << report.status().message() << "\n";
    return 2;
  }
  const FsckReport& r = report.value();
  if (json) {
    nlohmann::json out = {{"clean", r.clean()},         {"files", r.files_checked}, {"packs", r.packs_checked},
                          {"chunks", r.chunks_checked}, {"bytes", r.bytes_checked}, {"errors", r.errors},
                          {"warnings", r.warnings}};
    std::cout << out.dump(2) << "\n";
  } else {
    for (const auto& e : r.errors) std::cout << "error: " << e << "\n";
    for (const auto& w : r.warnings) std::cout << "warning: " << w << "\n";
    std::cout << (r.clean() ? "clean" : "CORRUPT") << ": " << r.files_checked << " files, " << r.packs_checked
              << " packs, " << r.chunks_checked << " chunks, " << HumanBytes(r.bytes_checked) << " verified; "
              << r.errors.size() << " errors, " << r.warnings.size() << " warnings\n";
  }
  return r.clean() ? 0 : 1;
}

}  // namespace ckptfs
