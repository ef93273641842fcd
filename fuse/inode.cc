#include "fuse/inode.h"

#include <fcntl.h>

#include <algorithm>
#include <vector>

namespace ckptfs {

InodeTable::InodeTable(Env* env, UniqueFd root_fd, const struct stat& root_st)
    : env_(env), root_(std::make_unique<Inode>()) {
  root_->fd = std::move(root_fd);
  root_->dev = root_st.st_dev;
  root_->ino = root_st.st_ino;
  root_->type = S_IFDIR;
  root_->nlookup = 2;  // never forgotten
}

Result<Inode*> InodeTable::Lookup(Inode& parent, const std::string& name, struct stat* st) {
  ASSIGN_OR_RETURN(UniqueFd owned, env_->OpenAt(parent.fd.get(), name, O_PATH | O_NOFOLLOW));
  ASSIGN_OR_RETURN(*st, env_->Fstat(owned.get()));
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
  if (auto d = detached_.find(key); d != detached_.end()) {
    std::shared_ptr<FileContent> content = d->second.lock();
    detached_.erase(d);
    if (content && content->Reattach(key.first, key.second)) inode->content = std::move(content);
  }
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
  std::unique_ptr<Inode> dropped;
  {
    std::lock_guard lk(mu_);
    inode.nlookup -= std::min(n, inode.nlookup);
    dropped = TakeIfUnusedLocked(inode);
  }
  Drop(std::move(dropped));
}

void InodeTable::Opened(Inode& inode) {
  std::lock_guard lk(mu_);
  ++inode.nopen;
}

void InodeTable::Released(Inode& inode) {
  if (&inode == root_.get()) return;
  std::unique_ptr<Inode> dropped;
  {
    std::lock_guard lk(mu_);
    if (inode.nopen > 0) --inode.nopen;
    dropped = TakeIfUnusedLocked(inode);
  }
  Drop(std::move(dropped));
}

std::unique_ptr<Inode> InodeTable::TakeIfUnusedLocked(Inode& inode) {
  if (inode.nlookup > 0 || inode.nopen > 0) return nullptr;
  auto it = inodes_.find({inode.dev, inode.ino});
  if (it == inodes_.end() || it->second.get() != &inode) return nullptr;
  std::unique_ptr<Inode> taken = std::move(it->second);
  inodes_.erase(it);
  std::lock_guard c(taken->content_mu);
  if (taken->content && taken->content.use_count() > 1) {
    std::erase_if(detached_, [](const auto& kv) { return kv.second.expired(); });
    detached_[{taken->dev, taken->ino}] = taken->content;
  }
  return taken;
}

void InodeTable::Drop(std::unique_ptr<Inode> inode) {
  if (inode == nullptr) return;
  std::shared_ptr<FileContent> content;
  {
    std::lock_guard lk(inode->content_mu);
    content = inode->content;
  }
  if (content) content->MarkForgotten();
}

void InodeTable::DropAll() {
  std::vector<std::unique_ptr<Inode>> dropped;
  {
    std::lock_guard lk(mu_);
    for (auto it = inodes_.begin(); it != inodes_.end();) {
      Inode& inode = *it->second;
      inode.nlookup = 0;
      // A RELEASE may still be in flight (DESTROY does not wait for them):
      // an inode with a handle goes when it arrives, not under its feet.
      if (inode.nopen > 0) {
        ++it;
        continue;
      }
      dropped.push_back(std::move(it->second));
      it = inodes_.erase(it);
    }
  }
  for (auto& inode : dropped) Drop(std::move(inode));
}

}  // namespace ckptfs
