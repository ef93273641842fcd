#include "mount-tools/private_mount.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "mount-tools/commands.h"
#include "mount-tools/mount_options.h"

namespace ckptfs {
namespace {

// `ckptfs mount` in a child: it returns once the daemon (its own child)
// serves, or fails with its message on stderr.
Status MountInChild(MountOptions opts) {
  const pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno("fork");
  if (pid == 0) ::_exit(RunMount(opts));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return Status::FromErrno("waitpid");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return Status::Error(EIO, "could not mount " + opts.backing + " (see above)");
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<PrivateMount>> PrivateMount::Open(const std::string& store, const std::string& options) {
  MountOptions opts;
  RETURN_IF_ERROR(ParseMountOptions(options, &opts));
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/ckptfs-mount-XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) return Status::FromErrno("cannot create a mount point like " + dir);
  opts.backing = store;
  opts.mountpoint = dir;
  opts.log_level = "warn";  // the command's own output is what the user reads
  if (Status st = MountInChild(opts); !st.ok()) {
    ::rmdir(dir.c_str());
    return st;
  }
  return std::unique_ptr<PrivateMount>(new PrivateMount(store, dir));
}

std::string PrivateMount::InStoreTerms(std::string message) const {
  for (size_t at; (at = message.find(path_)) != std::string::npos;) {
    const bool inside = message.compare(at + path_.size(), 1, "/") == 0;
    message.replace(at, path_.size() + (inside ? 1 : 0), store_ + ":");
  }
  return message;
}

Status PrivateMount::Close() {
  if (closed_) return Status::Ok();
  closed_ = true;
  // Sealing a large import may take a while: an hour before giving up.
  if (RunUmount(path_, false, 3600) != 0) return Status::Error(EIO, "could not unmount " + path_);
  if (::rmdir(path_.c_str()) != 0) return Status::FromErrno("rmdir " + path_);
  return Status::Ok();
}

PrivateMount::~PrivateMount() {
  if (Status st = Close(); !st.ok()) std::cerr << "ckptfs: " << st.message() << "\n";
}

}  // namespace ckptfs
