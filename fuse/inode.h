// Inodes of the mount, one per backing inode (keyed by st_dev/st_ino as in
// libfuse's passthrough_hp), each holding an O_PATH fd to its backing entry.
// The fuse_ino_t handed to the kernel is the Inode's address.
#pragma once

#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "base/status.h"
#include "base/unique_fd.h"
#include "fuse/file_content.h"

namespace ckptfs {

struct Inode {
  UniqueFd fd;  // O_PATH | O_NOFOLLOW
  dev_t dev = 0;
  ino_t ino = 0;
  mode_t type = 0;       // S_IFMT bits
  uint64_t nlookup = 0;  // guarded by InodeTable's mutex

  std::mutex content_mu;
  std::shared_ptr<FileContent> content;  // regular files, loaded on first use
};

class InodeTable {
 public:
  explicit InodeTable(UniqueFd root_fd);

  Inode& root() { return *root_; }
  Inode& Get(fuse_ino_t ino) {
    return ino == FUSE_ROOT_ID ? *root_ : *reinterpret_cast<Inode*>(static_cast<uintptr_t>(ino));
  }
  fuse_ino_t IdOf(const Inode& inode) const {
    return &inode == root_.get() ? FUSE_ROOT_ID : static_cast<fuse_ino_t>(reinterpret_cast<uintptr_t>(&inode));
  }

  // Finds or creates the inode for `name` in `parent` and counts a lookup.
  // `st` receives the backing stat.
  Result<Inode*> Lookup(Inode& parent, const std::string& name, struct stat* st);
  // Finds an existing inode by backing identity without counting a lookup.
  Inode* Find(dev_t dev, ino_t ino);
  void Forget(Inode& inode, uint64_t n);

 private:
  std::mutex mu_;
  std::unique_ptr<Inode> root_;
  std::map<std::pair<dev_t, ino_t>, std::unique_ptr<Inode>> inodes_;
};

}  // namespace ckptfs
