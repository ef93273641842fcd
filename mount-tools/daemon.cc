#include "mount-tools/daemon.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "base/hash.h"
#include "base/log.h"
#include "store/object_id.h"
#include "gpu/device_select.h"

namespace ckptfs {

Result<UniqueFd> Daemonize() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno("pipe");
  UniqueFd rd(fds[0]), wr(fds[1]);
  const pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno("fork");
  if (pid > 0) {
    wr.reset();
    char ok = 1;
    const ssize_t n = ::read(rd.get(), &ok, 1);
    ::_exit(n == 1 && ok == 0 ? 0 : 1);
  }
  rd.reset();
  ::setsid();
  if (::chdir("/") != 0) return Status::FromErrno("chdir /");
  const int null = ::open("/dev/null", O_RDWR);
  if (null >= 0) {
    ::dup2(null, 0);
    ::dup2(null, 1);
    ::dup2(null, 2);
    if (null > 2) ::close(null);
  }
  return wr;
}

void ReportStarted(UniqueFd* pipe) {
  // No-op without NOTIFY_SOCKET; the variable stays set for a later STOPPING=1.
  ::sd_notify(0, "READY=1\nSTATUS=serving");
  if (!pipe->valid()) return;
  const char ok = 0;
  (void)!::write(pipe->get(), &ok, 1);
  pipe->reset();
}

void ReportStopping() { ::sd_notify(0, "STOPPING=1\nSTATUS=unmounted; sealing pending files"); }

bool StderrIsJournal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  unsigned long long dev = 0, ino = 0;
  if (stream == nullptr || std::sscanf(stream, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st {};
  return ::fstat(STDERR_FILENO, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

namespace {

std::atomic<int> hangup_pipe{-1};  // the write end, for the signal handler

void OnHangup(int) {
  const int saved = errno;
  const int fd = hangup_pipe.load();
  const char c = 'h';
  if (fd >= 0) (void)!::write(fd, &c, 1);
  errno = saved;
}

// Reopens the log on 'h', reports suppressed lines each second and at the
// end; returns on 's' or when the pipe fails.
void RunLogUpkeep(int fd) {
  for (;;) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    const int ready = ::poll(&p, 1, 1000);
    if (ready < 0 && errno == EINTR) continue;
    ReportSuppressedLogLines(/*all=*/false);
    if (ready == 0) continue;
    char c;
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c != 'h') break;
    if (Status s = ReopenLogFile(); !s.ok()) {
      spdlog::error("SIGHUP: {}; still writing to the file opened before", s.message());
    } else {
      spdlog::info("log reopened (SIGHUP)");
    }
  }
  ReportSuppressedLogLines(/*all=*/true);
}

}  // namespace

LogUpkeep::LogUpkeep() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    spdlog::warn("SIGHUP will not reopen the log: pipe: {}", std::strerror(errno));
    return;
  }
  read_end_ = UniqueFd(fds[0]);
  hangup_pipe.store(fds[1]);
  struct sigaction sa {};
  sa.sa_handler = OnHangup;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGHUP, &sa, nullptr);
  thread_ = std::thread(RunLogUpkeep, read_end_.get());
}

LogUpkeep::~LogUpkeep() {
  if (!thread_.joinable()) return;
  struct sigaction sa {};
  sa.sa_handler = SIG_IGN;  // the daemon is stopping: a late SIGHUP changes nothing
  ::sigaction(SIGHUP, &sa, nullptr);
  const int fd = hangup_pipe.exchange(-1);
  const char stop = 's';
  (void)!::write(fd, &stop, 1);
  thread_.join();
  ::close(fd);
}

Status ProbeDevice(DeviceRequest request, const gpu::CudaOptions& cuda) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno("pipe");
  UniqueFd rd(fds[0]), wr(fds[1]);
  const pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno("fork");
  if (pid == 0) {
    Result<gpu::DeviceChoice> c = gpu::ChooseDevice(request, cuda);
    const std::string msg = c.ok() ? "+" : "-" + c.status().message();
    (void)!::write(wr.get(), msg.data(), msg.size());
    ::_exit(0);
  }
  wr.reset();
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = ::read(rd.get(), buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    msg.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (msg.empty()) return Status::Error(EIO, "the device probe exited without an answer");
  if (msg[0] == '-') return Status::Error(ENODEV, msg.substr(1));
  return Status::Ok();
}

void UseDevice(Store* store, DeviceRequest request, const gpu::CudaOptions& cuda) {
  Result<gpu::DeviceChoice> c = gpu::ChooseDevice(request, cuda);
  if (!c.ok()) {
    spdlog::error("{}; sealing runs on the CPU", c.status().message());
    c = gpu::ChooseDevice(DeviceRequest::kCpu, cuda);
  }
  spdlog::info("{}", c->why);
  store->SetComputeDevice(c->device);
}

std::string MountLockPath(const std::string& mountpoint) {
  const uint64_t h = Checksum64(std::span(reinterpret_cast<const uint8_t*>(mountpoint.data()), mountpoint.size()));
  return "/run/ckptfs/" + ObjectIdHex(h) + ".lock";
}

Result<UniqueFd> HoldMountLock(const std::string& mountpoint) {
  if (::mkdir("/run/ckptfs", 0700) != 0 && errno != EEXIST) return Status::FromErrno(errno, "mkdir /run/ckptfs");
  const std::string path = MountLockPath(mountpoint);
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return Status::FromErrno(errno, "open " + path);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) return Status::FromErrno(errno, "flock " + path);
  return fd;
}

bool WaitForMountLock(const std::string& mountpoint, double timeout_s) {
  UniqueFd fd(::open(MountLockPath(mountpoint).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::flock(fd.get(), LOCK_UN);
  return true;
}

}  // namespace ckptfs
