// A store mounted for one command only (export, import): on a fresh 0700
// directory that no other user can enter, served by its own daemon, and
// unmounted (after the seals) when the command is done. A store that is
// mounted elsewhere is refused, as `ckptfs mount` refuses it.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"

namespace ckptfs {

class PrivateMount {
 public:
  // `options`: an -o list for the mount ("" for none).
  static Result<std::unique_ptr<PrivateMount>> Open(const std::string& store, const std::string& options);
  ~PrivateMount();  // Close(), its error logged
  PrivateMount(const PrivateMount&) = delete;
  PrivateMount& operator=(const PrivateMount&) = delete;

  const std::string& path() const { return path_; }
  // `message` with paths in the mount told as STORE:PATH (the private
  // mount point means nothing to the user).
  std::string InStoreTerms(std::string message) const;
  // Unmounts, waits until the daemon has sealed every file and exited,
  // and removes the directory. Once.
  Status Close();

 private:
  PrivateMount(std::string store, std::string path) : store_(std::move(store)), path_(std::move(path)) {}
  std::string store_;
  std::string path_;
  bool closed_ = false;
};

}  // namespace ckptfs
