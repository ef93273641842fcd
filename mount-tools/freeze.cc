#include "mount-tools/freeze.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "base/status.h"
#include "base/unique_fd.h"
#include "fuse/mount.h"

namespace ckptfs {
namespace {

struct Daemon {
  std::string mountpoint;
  std::string backing;
  pid_t pid = 0;
};

// The daemon serving MOUNTPOINT: LOCK in its store names it.
Result<Daemon> DaemonOf(const std::string& mountpoint) {
  std::string abs = std::filesystem::absolute(mountpoint).lexically_normal().string();
  while (abs.size() > 1 && abs.back() == '/') abs.pop_back();
  const std::optional<MountEntry> m = FuseMountAt(abs);
  if (!m || m->fstype != "fuse.ckptfs") return Status::Error(EINVAL, abs + " is not a ckptfs mount point");
  if (std::filesystem::exists(m->source + "/nodes"))
    return Status::Error(ENOTSUP, m->source + " is a shared (cluster) store: its daemons on other nodes keep "
                                              "writing; back it up with the file system's own snapshots");
  std::ifstream lock(m->source + "/LOCK");
  long pid = 0;
  if (!(lock >> pid) || pid <= 0) return Status::Error(ESRCH, "no daemon pid in " + m->source + "/LOCK");
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec);
  if (ec || exe.filename() != "ckptfs")
    return Status::Error(ESRCH, "process " + std::to_string(pid) + " named in " + m->source +
                                    "/LOCK is not a ckptfs daemon");
  return Daemon{abs, m->source, static_cast<pid_t>(pid)};
}

// Every thread of `pid` is stopped ('T' in /proc/PID/task/TID/stat).
bool AllThreadsStopped(pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream stat(task.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos || paren + 2 >= line.size()) continue;  // exited meanwhile
    const char state = line[paren + 2];
    if (state != 'T' && state != 't') return false;
  }
  return !ec;
}

Status SyncMount(const std::string& mountpoint) {
  UniqueFd fd(::open(mountpoint.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno("cannot open " + mountpoint);
  if (::syncfs(fd.get()) != 0) return Status::FromErrno("syncfs " + mountpoint);
  return Status::Ok();
}

Status Freeze(const Daemon& d, double timeout_s) {
  RETURN_IF_ERROR(SyncMount(d.mountpoint));
  if (::kill(d.pid, SIGSTOP) != 0) return Status::FromErrno("cannot stop daemon " + std::to_string(d.pid));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!AllThreadsStopped(d.pid)) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(d.pid, SIGCONT);
      return Status::Error(ETIMEDOUT, "the daemon's threads did not all stop within " + std::to_string(timeout_s) +
                                          " s (one is in a long disk write?); thawed it again");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return Status::Ok();
}

}  // namespace

int RunFreeze(const std::string& mountpoint, double timeout_s) {
  auto d = DaemonOf(mountpoint);
  Status st = d.ok() ? Freeze(*d, timeout_s) : d.status();
  if (!st.ok()) {
    std::cerr << "ckptfs freeze: " << st.message() << "\n";
    return 2;
  }
  std::cout << "frozen: " << d->backing << " does not change until `ckptfs thaw " << d->mountpoint
            << "`; copy it now (every access to " << d->mountpoint << " waits meanwhile)\n";
  return 0;
}

int RunThaw(const std::string& mountpoint) {
  auto d = DaemonOf(mountpoint);
  if (!d.ok() || ::kill(d->pid, SIGCONT) != 0) {
    std::cerr << "ckptfs thaw: " << (d.ok() ? Status::FromErrno("SIGCONT") : d.status()).message() << "\n";
    return 2;
  }
  return 0;
}

}  // namespace ckptfs
