// `ckptfs mount`: checks what it was given, opens and recovers the store,
// mounts it and serves, in the background unless -f.
#include <dirent.h>
#include <malloc.h>
#include <spdlog/sinks/systemd_sink.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "base/log.h"
#include "base/metrics_text.h"
#include "fuse/mount.h"
#include "mount-tools/commands.h"
#include "mount-tools/daemon.h"
#include "mount-tools/metrics_server.h"
#include "store/cluster_gc.h"
#include "store/private_store.h"

namespace ckptfs {
namespace {

// RLIMIT_NOFILE before and after RaiseFdLimit.
struct FdLimit {
  uint64_t was = 0;   // the soft limit the daemon started with
  uint64_t soft = 0;  // the soft limit now
  uint64_t hard = 0;
  int error = 0;  // errno of a failed getrlimit/setrlimit
};

// The soft limit goes up to the hard one: descriptors held for the files
// in use count against it (docs/SEMANTICS.md "File descriptors").
FdLimit RaiseFdLimit() {
  FdLimit out;
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    out.error = errno;
    return out;
  }
  out.was = out.soft = rl.rlim_cur;
  out.hard = rl.rlim_max;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &rl) == 0) {
      out.soft = rl.rlim_max;
    } else {
      out.error = errno;
    }
  }
  return out;
}

// max_fds, derived from the limit unless -o max_fds set it; says both.
uint64_t ChooseMaxFds(uint64_t configured, const FdLimit& limit) {
  const uint64_t derived = DefaultMaxFds(limit.soft);
  const uint64_t max_fds = configured != 0 ? configured : derived;
  if (limit.error != 0) {
    spdlog::warn("RLIMIT_NOFILE: soft {} (hard {}) could not be raised: {}", limit.soft, limit.hard,
                 std::strerror(limit.error));
  } else {
    spdlog::info("RLIMIT_NOFILE: soft {} (was {}), hard {}", limit.soft, limit.was, limit.hard);
  }
  spdlog::info("max_fds {}{}: at most {} fds of idle files stay open", max_fds,
               configured != 0 ? "" : " (from RLIMIT_NOFILE)", max_fds - FdReserve(max_fds));
  if (max_fds > derived) {
    spdlog::warn(
        "max_fds {} is above what RLIMIT_NOFILE {} leaves free ({}): a full fd table is met by closing "
        "idle fds",
        max_fds, limit.soft, derived);
  }
  return max_fds;
}

void LogRecovery(const RecoveryReport& r, bool to_stderr) {
  spdlog::info(
      "recovery: scanned {} files, resealed {}, removed {} temporary, {} orphan packs, {} orphan staging; {} broken",
      r.stubs_scanned, r.staged_resealed, r.tmp_files_removed, r.orphan_packs_removed, r.orphan_staging_removed,
      r.broken_stubs);
  if (to_stderr)
    for (const auto& a : r.actions) std::cerr << "ckptfs: recovery: " << LogSafe(a, kLogSafeLineMaxBytes) << "\n";
  // Mounting goes on (every readable file is served), but the user must hear
  // of it: the mount's own terminal, even when the daemon goes to the
  // background.
  if (!r.swept()) {
    if (!to_stderr)
      for (const auto& u : r.unreadable)
        std::cerr << "ckptfs: recovery: cannot read " << LogSafe(u, kLogSafeLineMaxBytes) << "\n";
    std::cerr << "ckptfs: warning: " << r.unreadable.size()
              << " object(s) in the store could not be read; nothing was deleted, and no pack will be until "
                 "they are repaired (run `ckptfs fsck`)\n";
  }
}

// Exit 2: an operational error, as for every command.
int Fail(const std::string& msg) {
  std::cerr << "ckptfs mount: " << msg << "\n";
  return 2;
}

// The first entry of a directory other than . and .., if any.
Result<std::optional<std::string>> FirstEntry(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return Status::FromErrno("cannot list mount point " + dir);
  std::optional<std::string> first;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    first = e->d_name;
    break;
  }
  const int err = errno;
  ::closedir(d);
  if (!first && err != 0) return Status::FromErrno(err, "cannot list mount point " + dir);
  return first;
}

// Checks the mount point: exists, is a directory, is not stale, not busy,
// and (unless allow_nonempty) empty, since a mount would hide its files.
Result<std::string> CheckMountpoint(const std::string& path, bool allow_nonempty) {
  char* real = ::realpath(path.c_str(), nullptr);
  if (real == nullptr) {
    int err = errno;
    if (err == ENOTCONN)
      return Status::Error(
          ENOTCONN,
          "mount point " + path + " is a stale FUSE mount (its daemon died); run `ckptfs umount " + path + "` first");
    if (err == ENOENT) return Status::Error(ENOENT, "mount point " + path + " does not exist; create it with mkdir");
    return Status::FromErrno(err, "mount point " + path);
  }
  std::string abs(real);
  std::free(real);
  struct stat st {};
  if (::stat(abs.c_str(), &st) != 0) {
    if (errno == ENOTCONN)
      return Status::Error(ENOTCONN,
                           "mount point " + abs + " is a stale FUSE mount; run `ckptfs umount " + abs + "` first");
    return Status::FromErrno("mount point " + abs);
  }
  if (!S_ISDIR(st.st_mode)) return Status::Error(ENOTDIR, "mount point " + abs + " is not a directory");
  if (auto m = FuseMountAt(abs))
    return Status::Error(EBUSY, "mount point " + abs + " is busy: " + m->fstype + " from " + m->source +
                                    " is already mounted there; run `ckptfs umount " + abs + "` first");
  if (!allow_nonempty) {
    ASSIGN_OR_RETURN(std::optional<std::string> entry, FirstEntry(abs));
    if (entry)
      return Status::Error(ENOTEMPTY, "mount point " + abs + " is not empty (it holds '" + *entry +
                                          "', for one); mounting would hide its files until the unmount. Use an "
                                          "empty directory, or pass -o nonempty to mount over them anyway");
  }
  return abs;
}

// Checks the backing directory: exists, is a directory this user may write.
Result<std::string> CheckBacking(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT)
      return Status::Error(ENOENT, "backing directory " + path + " does not exist; create it (mkdir -p " + path + ")");
    return Status::FromErrno("backing directory " + path);
  }
  if (!S_ISDIR(st.st_mode)) return Status::Error(ENOTDIR, "backing path " + path + " is not a directory");
  if (::access(path.c_str(), W_OK | X_OK) != 0)
    return Status::FromErrno("backing directory " + path + " is not writable by this user");
  char* real = ::realpath(path.c_str(), nullptr);
  std::string abs(real ? real : path.c_str());
  std::free(real);
  return abs;
}

struct MountPaths {  // absolute
  std::string backing;
  std::string mountpoint;
};

// Both checked, and neither inside the other.
Result<MountPaths> CheckPaths(const MountOptions& opts) {
  ASSIGN_OR_RETURN(std::string mountpoint, CheckMountpoint(opts.mountpoint, opts.nonempty));
  ASSIGN_OR_RETURN(std::string backing, CheckBacking(opts.backing));
  if ((mountpoint + "/").rfind(backing + "/", 0) == 0 || (backing + "/").rfind(mountpoint + "/", 0) == 0)
    return Status::InvalidArgument("backing directory " + backing + " and mount point " + mountpoint +
                                   " must not contain each other");
  return MountPaths{backing, mountpoint};
}

void SetUpProcess() {
  // Before anything is created, the log included: what the daemon creates
  // for itself is private. Entries of the logical tree get the modes the
  // kernel sends (FUSE request threads run with umask 0, see fuse/ops.cc).
  ::umask(077);
  // Chunk buffers are megabytes: a fixed mmap threshold hands them back to
  // the kernel when freed, instead of glibc raising the threshold and
  // keeping freed chunks in per-thread arenas (RSS would grow past the
  // cache limit with the number of FUSE threads).
  ::mallopt(M_MMAP_THRESHOLD, 256 * 1024);
}

// From here on the log goes to its file (and to stderr with -f). Under
// systemd, whose journal is stderr, it goes to the journal with each line's
// priority, and to a file only when log= names one. A file that someone
// else could have chosen (a symlink, another user's file) fails the mount.
Status StartDaemonLog(const MountOptions& opts, const MountPaths& paths) {
  std::string log_path = opts.log_path.empty() ? paths.backing + "/ckptfs.log" : opts.log_path;
  std::vector<spdlog::sink_ptr> journal;
  if (opts.foreground && StderrIsJournal()) {
    journal.push_back(std::make_shared<spdlog::sinks::systemd_sink_mt>());
    if (opts.log_path.empty()) log_path.clear();
  }
  // On failure the stderr logger stays.
  Status s = InitLogging(log_path, opts.log_level, opts.foreground && journal.empty(), journal, opts.log_file);
  return s.ok() ? s : s.WithContext(opts.log_path.empty() ? "daemon log" : "option log=" + opts.log_path);
}

void LogMountStart(const MountPaths& paths, const Store& store) {
  spdlog::info("ckptfs {} mounting {} on {}", CKPTFS_VERSION, LogSafe(paths.backing), LogSafe(paths.mountpoint));
  for (const std::string& line : store.made_private()) spdlog::warn("store permissions: {}", LogSafe(line, 1000));
  for (const std::string& line : LooseParentsOf(Env::Default(), paths.backing))
    spdlog::warn("store permissions: {}", LogSafe(line, 1000));
}

// Goes to the background (unless -f), then seals and serves until unmounted.
int ServeMount(FuseMount& mount, Store* store, const MountOptions& opts, const MountPaths& paths) {
  // Sealing threads come and go with each seal, and glibc's dynamic mmap
  // threshold let each new thread's arena keep the megabyte buffers of the
  // last (with 2 lossy workers, 238 MiB at peak against 95 MiB): buffers
  // from 1 MiB up are mapped and returned on free instead.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  UniqueFd started;
  if (!opts.foreground) {
    store->ClosePackConnection();
    auto pipe = Daemonize();
    if (!pipe.ok()) return Fail(pipe.status().message());
    started = std::move(pipe).value();
    if (Status s = store->OpenPackConnection(); !s.ok()) return Fail(s.message());
  }
  Status pid = store->RecordOwnerPid();
  if (!pid.ok()) spdlog::warn("{}", pid.message());
  Result<UniqueFd> mount_lock = UniqueFd();
  if (store->cluster()) {
    mount_lock = HoldMountLock(paths.mountpoint);
    if (!mount_lock.ok()) spdlog::warn("`ckptfs umount` will not wait for sealing: {}", mount_lock.status().message());
  }
  UseDevice(store, opts.device, opts.cuda);
  mount.StartSealing();
  const LogUpkeep log_upkeep;
  std::unique_ptr<MetricsServer> metrics;
  if (opts.metrics.enabled()) {
    auto server =
        MetricsServer::Start(opts.metrics, [&mount] { return FormatPrometheusText(mount.fs().SampleMetrics()); });
    if (!server.ok()) {
      spdlog::error("{}", server.status().message());
      return Fail(server.status().message());
    }
    metrics = std::move(server).value();
  }
  // Threads do not survive the fork above: started here, stopped at unmount.
  std::unique_ptr<PeriodicClusterGc> gc;
  const ClusterOptions& cluster = store->options().cluster;
  if (cluster.enabled && cluster.gc_interval_seconds > 0) {
    gc = std::make_unique<PeriodicClusterGc>(
        store, cluster.gc_interval_seconds,
        ClusterGcOptions{.grace_seconds = cluster.gc_grace_seconds, .holder = cluster.node});
  }
  spdlog::info("mounted {} on {}", paths.backing, paths.mountpoint);
  ReportStarted(&started);
  const int rc = mount.Serve();
  ReportStopping();
  return rc;
}

}  // namespace

int RunMount(const MountOptions& opts) {
  SetUpProcess();
  (void)InitLogging("", opts.log_level);  // stderr only: cannot fail
  const FdLimit fd_limit = RaiseFdLimit();  // before the store opens its files
  auto paths = CheckPaths(opts);
  if (!paths.ok()) return Fail(paths.status().message());
  if (opts.metrics.enabled()) {
    if (Status s = CheckMetricsAddress(opts.metrics); !s.ok()) return Fail(s.message());
  }
  if (opts.device == DeviceRequest::kGpu) {
    if (Status probe = ProbeDevice(opts.device, opts.cuda); !probe.ok()) return Fail(probe.message());
  }
  auto store = Store::Open(Env::Default(), paths->backing, opts.store);
  if (!store.ok()) return Fail(store.status().message());
  if (Status s = StartDaemonLog(opts, *paths); !s.ok()) return Fail(s.message());
  LogMountStart(*paths, **store);

  auto report = store.value()->Recover();
  if (!report.ok()) return Fail("recovery of " + paths->backing + " failed: " + report.status().message());
  LogRecovery(report.value(), opts.foreground);
  FuseOptions fuse = opts.fuse;
  fuse.fs.max_fds = ChooseMaxFds(opts.fuse.fs.max_fds, fd_limit);
  // Destroyed on every return below: no path leaves a mount or a session behind.
  auto mount = FuseMount::Mount(store->get(), paths->backing, paths->mountpoint, fuse);
  if (!mount.ok()) return Fail(mount.status().message());
  const int rc = ServeMount(**mount, store->get(), opts, *paths);
  ReportSuppressedLogLines(/*all=*/true);
  spdlog::shutdown();
  return rc;
}

}  // namespace ckptfs
