// Inodes of the mount, one per backing inode (keyed by st_dev/st_ino as in
// libfuse's passthrough_hp), each holding an O_PATH fd to its backing entry.
// The fuse_ino_t handed to the kernel is the Inode's address.
//
// An Inode, and with it its file's content, lives while the kernel holds a
// lookup on it or a handle is open on it, as in passthrough_hp. A file
// replaced or unlinked between an opener's LOOKUP and its OPEN (or while
// open) is therefore still whole when the OPEN and the reads arrive; its
// objects are freed when the Inode is dropped (FileContent::MarkForgotten).
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
#include "store/env.h"

namespace ckptfs {

struct Inode {
  UniqueFd fd;  // O_PATH | O_NOFOLLOW
  dev_t dev = 0;
  ino_t ino = 0;
  mode_t type = 0;       // S_IFMT bits
  uint64_t nlookup = 0;  // guarded by InodeTable's mutex
  uint64_t nopen = 0;    // handles open on it; guarded by InodeTable's mutex

  std::mutex content_mu;
  std::shared_ptr<FileContent> content;  // regular files, loaded on first use
};

class InodeTable {
 public:
  // root_st: the stat of root_fd, taken by the caller, which can report a failure.
  InodeTable(Env* env, UniqueFd root_fd, const struct stat& root_st);

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
  // The kernel dropped n lookups (FORGET). The kernel may deliver a FORGET
  // before the RELEASE of the inode's last handle, so an inode goes only
  // once both counts are zero.
  void Forget(Inode& inode, uint64_t n);
  // A handle was opened on / released from `inode`.
  void Opened(Inode& inode);
  void Released(Inode& inode);
  // At daemon exit: the kernel sends no FORGETs at unmount, so every
  // lookup counts as forgotten now. Inodes without a handle are dropped
  // (a deleted file's content is freed); one with a handle still counted
  // goes at its RELEASE, or, if none comes, is left to recovery.
  void DropAll();

 private:
  // Removes `inode` from the table when nothing holds it any more.
  std::unique_ptr<Inode> TakeIfUnusedLocked(Inode& inode);
  // Runs without mu_: freeing a deleted file's content does store I/O
  // under the content's and the store's locks.
  static void Drop(std::unique_ptr<Inode> inode);

  Env* const env_;
  std::mutex mu_;  // may be held while taking a FileContent's mutex, never the reverse
  std::unique_ptr<Inode> root_;
  std::map<std::pair<dev_t, ino_t>, std::unique_ptr<Inode>> inodes_;
  // Content of forgotten Inodes that something else (the seal queue) still
  // held when they were dropped: the next Inode of that file takes it over
  // instead of loading a second FileContent for the same stub.
  std::map<std::pair<dev_t, ino_t>, std::weak_ptr<FileContent>> detached_;
};

}  // namespace ckptfs
