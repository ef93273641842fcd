// The FUSE session: a Filesystem over a ready Store, mounted on a
// directory and served until it is unmounted. Option parsing, the daemon's
// fork and the compute device are the CLI's (mount-tools/).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "fuse/fs.h"

struct fuse_session;

namespace ckptfs {

// The FUSE layer's settings: the file system's and its session's.
struct FuseOptions {
  FsConfig fs;
  int max_threads = 8;                   // FUSE worker threads
  uint64_t read_ahead = 4u << 20;        // kernel readahead window for the mount
  bool debug = false;                    // libfuse request tracing
  std::vector<std::string> kernel_opts;  // passed to the kernel mount (allow_other, ro, ...)
};

// A Filesystem mounted through a FUSE session. Whatever path a caller
// leaves by, the destructor leaves no mount and no session behind: it
// unmounts (unless Serve has), removes the signal handlers and destroys
// the session.
class FuseMount {
 public:
  // Mounts a Filesystem over `store` (recovered already) on `mountpoint`;
  // /proc/mounts names `backing` as its source.
  static Result<std::unique_ptr<FuseMount>> Mount(Store* store, const std::string& backing,
                                                  const std::string& mountpoint, const FuseOptions& opts);
  ~FuseMount();
  FuseMount(const FuseMount&) = delete;
  FuseMount& operator=(const FuseMount&) = delete;

  // Starts the sealing, decode-ahead, page push and deferred-request
  // threads. Not part of Mount: a daemon forks after it
  // mounts (so that a failed mount is reported on the terminal), and
  // threads do not survive a fork.
  void StartSealing();
  // Serves requests until the mount is unmounted or a signal ends the loop,
  // then unmounts and seals what is pending. 0 on a clean exit, else 1.
  int Serve();
  Filesystem& fs() { return *fs_; }

 private:
  FuseMount(Store* store, const FuseOptions& opts, const std::string& mountpoint, std::unique_ptr<Filesystem> fs);
  Status CreateSession(const std::string& backing);
  void Unmount();

  Store* store_;
  FuseOptions opts_;
  std::string mountpoint_;
  std::unique_ptr<Filesystem> fs_;
  // libfuse's command line, alive as long as the session that parsed it.
  std::vector<std::string> session_args_;
  std::vector<char*> session_argv_;
  fuse_session* session_ = nullptr;
  bool signal_handlers_ = false;
  bool mounted_ = false;
};

// Where /proc/self/mountinfo says `mountpoint` is mounted from, if it is a
// ckptfs mount ("" otherwise). The source is the backing directory.
struct MountEntry {
  std::string mountpoint;
  std::string source;
  std::string fstype;
  std::string dev;  // "major:minor"
};
std::vector<MountEntry> ReadMounts();
// The FUSE mount whose mount point is exactly `path` (the last, i.e. top,
// one when several are stacked), or nullopt.
std::optional<MountEntry> FuseMountAt(const std::string& path);

}  // namespace ckptfs
