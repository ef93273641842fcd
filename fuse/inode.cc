#include "fuse/inode.h"

#include <fcntl.h>

namespace ckptfs {

InodeTable::InodeTable(UniqueFd root_fd) : root_(std::make_unique<Inode>()) {
  struct stat st {};
  ::fstat(root_fd.get(), &st);
  root_->fd = std::move(root_fd);
  root_->dev = st.st_dev;
  root_->ino = st.st_ino;
  root_->type = S_IFDIR;
  root_->nlookup = 2;  // never forgotten
}

Result<Inode*> InodeTable::Lookup(Inode& parent, const std::string& name, struct stat* st) {
  int fd = ::openat(parent.fd.get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno("lookup " + name);
  UniqueFd owned(fd);
  if (::fstat(fd, st) != 0) return Status::FromErrno("stat " + name);
  std::lock_guard lk(mu_);
  auto key = std::make_pair(st->st_dev, st->st_ino);
  auto it = inodes_.find(key);
  if (it != inodes_.end()) {
    ++it->second->nlookup;
    return it->second.get();
  }
  auto inode = std::make_unique<Inode>();
  inode->fd = std::move(owned);
  inode->dev = st->st_dev;
  inode->ino = st->st_ino;
  inode->type = st->st_mode & S_IFMT;
  inode->nlookup = 1;
  Inode* raw = inode.get();
  inodes_.emplace(key, std::move(inode));
  return raw;
}

Inode* InodeTable::Find(dev_t dev, ino_t ino) {
  std::lock_guard lk(mu_);
  auto it = inodes_.find({dev, ino});
  return it == inodes_.end() ? nullptr : it->second.get();
}

void InodeTable::Forget(Inode& inode, uint64_t n) {
  if (&inode == root_.get()) return;
  std::lock_guard lk(mu_);
  if (inode.nlookup > n) {
    inode.nlookup -= n;
    return;
  }
  inodes_.erase({inode.dev, inode.ino});
}

}  // namespace ckptfs
