// The daemon behind `ckptfs mount`: going to the background, and the
// compute device it seals with.
#pragma once

#include <thread>

#include "base/status.h"
#include "base/unique_fd.h"
#include "gpu/cuda_device.h"
#include "store/store.h"

namespace ckptfs {

// Forks into the background. The parent waits until the child reports on
// the returned pipe (ReportStarted), so `ckptfs mount` returns only once
// the daemon serves and LOCK names it; if the child dies first, it fails.
Result<UniqueFd> Daemonize();
// Tells the waiting parent (if any) that the daemon serves, and closes the
// pipe; and tells systemd (a Type=notify unit, NOTIFY_SOCKET set) READY=1,
// which a unit's dependants wait for: recovery is done and the mount serves.
void ReportStarted(UniqueFd* pipe);
// Tells systemd that the mount is gone and the daemon drains its seals.
void ReportStopping();

// Whether stderr is the journal: systemd sets JOURNAL_STREAM to its
// device:inode for a service's stdout and stderr (systemd.exec(5)).
bool StderrIsJournal();

// While alive, SIGHUP reopens the log file (logrotate's postrotate sends
// it) instead of ending the mount, as libfuse's handler would. The
// handler only writes to a pipe; a thread reopens and logs that it did.
// The same thread reports the log lines the rate limits dropped, once
// their flood is over (every second), and all of them when it stops.
class LogUpkeep {
 public:
  LogUpkeep();
  ~LogUpkeep();
  LogUpkeep(const LogUpkeep&) = delete;
  LogUpkeep& operator=(const LogUpkeep&) = delete;

 private:
  UniqueFd read_end_;
  std::thread thread_;
};

// A shared store's daemons hold no LOCK (no lock is assumed across
// nodes), so `ckptfs umount` waits for a cluster daemon to drain its seals
// through a node-local lock of the mount point: /run/ckptfs/<hash>.lock,
// flock'd by the daemon until it exits.
std::string MountLockPath(const std::string& mountpoint);
Result<UniqueFd> HoldMountLock(const std::string& mountpoint);
// Waits until no process holds the mount point's lock (or `timeout_s`).
bool WaitForMountLock(const std::string& mountpoint, double timeout_s);

// Chooses the compute device in a short-lived child; an error says why
// device=gpu cannot be had. The daemon forks later, and a CUDA context does
// not survive a fork: so the parent never initialises CUDA, yet an
// impossible device=gpu still fails here, on the user's terminal.
Status ProbeDevice(DeviceRequest request, const gpu::CudaOptions& cuda);
// Opens the device for this process (after any fork) and hands it to the
// store. A device=gpu that the probe found but that fails now falls back to
// the CPU with an error in the log: the mount is already up.
void UseDevice(Store* store, DeviceRequest request, const gpu::CudaOptions& cuda);

}  // namespace ckptfs
