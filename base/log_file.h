// The daemon's log file: opened so that nobody else can choose what it
// writes into, and rotated at a size cap so that nobody can fill the disk
// through it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"
#include "base/unique_fd.h"

namespace ckptfs {

// Opens `path` for the daemon to append to (a log, a pid file): never
// through a symlink (O_NOFOLLOW), close-on-exec, created 0600 when
// missing. A file that exists must be a regular file with one link, owned
// by the daemon's effective uid, that neither group nor others may write:
// otherwise whoever could create or change it chose where the daemon
// writes (a symlink or a hard link to a file of root's, a file they own),
// and the open fails with a message saying why.
Result<UniqueFd> OpenOwnFileForAppend(const std::string& path);
// The same rule for a file already open: `path` only names it in messages.
Status CheckOwnFile(int fd, const std::string& path);

struct LogFileOptions {
  uint64_t max_bytes = 64ull << 20;  // rotate before the file passes this; 0: never
  int keep = 2;                      // rotated files kept: PATH.1 (newest) .. PATH.keep
};

// Appends whole lines to a file opened by OpenOwnFileForAppend; when a line
// would take the file past max_bytes, PATH.i becomes PATH.i+1 (the oldest
// is replaced), PATH becomes PATH.1, and a new PATH is opened by the same
// rule. Not thread-safe: the log sink holds a lock around it.
class LogFile {
 public:
  static Result<LogFile> Open(std::string path, LogFileOptions opts);

  // Appends `line`. When the file cannot be rotated (a new PATH refused, a
  // rename failed), lines are dropped until Reopen succeeds, so that the
  // cap holds; the status says so, once.
  Status Write(std::string_view line);
  // Opens PATH again by name (logrotate moved it away), by the same rule;
  // on failure the old file stays in use.
  Status Reopen();
  const std::string& path() const { return path_; }

 private:
  LogFile(std::string path, LogFileOptions opts, UniqueFd fd, uint64_t size)
      : path_(std::move(path)), opts_(opts), fd_(std::move(fd)), size_(size) {}
  Status Rotate();
  bool NeedsRotation(size_t line_bytes);

  std::string path_;
  LogFileOptions opts_;
  UniqueFd fd_;  // invalid while rotation has failed
  uint64_t size_ = 0;
};

}  // namespace ckptfs
