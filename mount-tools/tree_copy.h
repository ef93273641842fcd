// Copying a tree of plain files into or out of a mount (export, import):
// directories, regular files and symlinks, with their modes and mtimes.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "mount-tools/progress.h"

namespace ckptfs {

struct CopyTotals {
  uint64_t files = 0;
  uint64_t directories = 0;
  uint64_t symlinks = 0;
  uint64_t bytes = 0;
  uint64_t skipped = 0;  // sockets, devices, FIFOs: not checkpoint data
};

// The bytes of the regular files under `root` (or of `root` itself).
Result<uint64_t> TreeBytes(const std::string& root);
// Copies `from` (a directory or a file) to `to`, which must not exist, or
// for a directory may be an empty one. The files of each directory go in
// the order they were last written (mtime, then name): a checkpoint series
// reaches a mount oldest first, so each one is stored against the last.
Status CopyTree(const std::string& from, const std::string& to, Progress* progress, CopyTotals* totals);

}  // namespace ckptfs
