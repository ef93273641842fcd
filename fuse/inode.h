// Inodes of the mount, one per backing inode (keyed by st_dev/st_ino as in
// libfuse's passthrough_hp), each reaching its backing entry through an
// O_PATH fd in the FdCache (fuse/fd_cache.h): open while a request leases
// it or while it is among the cache's recent idle ones, else reopened by
// file handle. The fuse_ino_t handed to the kernel is the Inode's address.
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
#include "fuse/fd_cache.h"
#include "fuse/file_content.h"
#include "base/env.h"

namespace ckptfs {

struct Inode {
  FdCache::Slot path;  // O_PATH | O_NOFOLLOW; lease it with Path()
  // name_to_handle_at's handle, "" where the file system gives none (then
  // `path` stays open while the Inode lives).
  std::string handle;
  dev_t dev = 0;
  ino_t ino = 0;
  mode_t type = 0;       // S_IFMT bits
  uint64_t nlookup = 0;  // guarded by InodeTable's mutex
  uint64_t nopen = 0;    // handles open on it; guarded by InodeTable's mutex

  std::mutex content_mu;
  std::shared_ptr<FileContent> content;  // regular files, loaded on first use

  // The O_PATH fd, open until the lease goes.
  Result<FdCache::Lease> Path() { return path.Take(); }
};

class InodeTable {
 public:
  // root_st: the stat of root_fd, taken by the caller, which can report a
  // failure. root_fd stays open; the other inodes' fds live in `fds`.
  InodeTable(Env* env, FdCache* fds, UniqueFd root_fd, const struct stat& root_st);

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
  // How an evicted fd of the inode with this handle is opened again
  // (flags: O_PATH or an access mode), checking it is still dev/ino (ESTALE
  // if not); null without a handle.
  FdCache::Reopen ReopenByHandle(const std::string& handle, int flags, dev_t dev, ino_t ino) const;
  FdCache* fds() const { return fds_; }
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

  // Opens mount_fd_ and reopens the root by its handle: whether evicted
  // fds can come back (else mount_fd_ stays closed and no fd is evicted).
  Status ProbeHandles(int root_fd, const struct stat& root_st);
  // The new inode's handle and path slot, from its freshly opened fd.
  void AssignPath(Inode& inode, UniqueFd fd);

  Env* const env_;
  FdCache* const fds_;
  // The root's directory opened for reading: open_by_handle_at's mount fd
  // (an O_PATH fd is refused there). -1 where handles do not work here.
  UniqueFd mount_fd_;
  std::mutex mu_;  // may be held while taking a FileContent's mutex, never the reverse
  std::unique_ptr<Inode> root_;
  std::map<std::pair<dev_t, ino_t>, std::unique_ptr<Inode>> inodes_;
  // Content of forgotten Inodes that something else (the seal queue) still
  // held when they were dropped: the next Inode of that file takes it over
  // instead of loading a second FileContent for the same stub.
  std::map<std::pair<dev_t, ino_t>, std::weak_ptr<FileContent>> detached_;
};

}  // namespace ckptfs
