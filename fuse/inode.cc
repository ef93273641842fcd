#include "fuse/inode.h"

#include <fcntl.h>

#include <algorithm>
#include <vector>

#include "base/log.h"

namespace ckptfs {

InodeTable::InodeTable(Env* env, FdCache* fds, UniqueFd root_fd, const struct stat& root_st)
    : env_(env), fds_(fds), root_(std::make_unique<Inode>()) {
  if (Status st = ProbeHandles(root_fd.get(), root_st); !st.ok()) {
    mount_fd_.reset();
    spdlog::warn(
        "backing inodes cannot be reopened by file handle ({}): each inode the kernel caches keeps "
        "its fds open, and -o max_fds does not bound them",
        st.message());
  }
  root_->path.Assign(fds_, std::move(root_fd), nullptr);  // the root's fd stays open
  root_->dev = root_st.st_dev;
  root_->ino = root_st.st_ino;
  root_->type = S_IFDIR;
  root_->nlookup = 2;  // never forgotten
}

Status InodeTable::ProbeHandles(int root_fd, const struct stat& root_st) {
  ASSIGN_OR_RETURN(mount_fd_, env_->OpenAt(AT_FDCWD, ProcFdPath(root_fd), O_RDONLY | O_DIRECTORY));
  ASSIGN_OR_RETURN(std::string handle, env_->NameToHandleAt(root_fd, "", AT_EMPTY_PATH));
  // Needs CAP_DAC_READ_SEARCH: a daemon without it finds out here, not at a reopen.
  return ReopenByHandle(handle, O_PATH, root_st.st_dev, root_st.st_ino)().status();
}

FdCache::Reopen InodeTable::ReopenByHandle(const std::string& handle, int flags, dev_t dev, ino_t ino) const {
  if (handle.empty() || !mount_fd_.valid()) return nullptr;
  return [env = env_, mount_fd = mount_fd_.get(), handle, flags, dev, ino]() -> Result<UniqueFd> {
    ASSIGN_OR_RETURN(UniqueFd fd, env->OpenByHandleAt(mount_fd, handle, flags | O_NOFOLLOW));
    ASSIGN_OR_RETURN(struct stat st, env->Fstat(fd.get()));
    if (st.st_dev != dev || st.st_ino != ino) {
      return Status::Error(ESTALE, "inode " + std::to_string(ino) + " is gone (its handle names another)");
    }
    return fd;
  };
}

void InodeTable::AssignPath(Inode& inode, UniqueFd fd) {
  if (!mount_fd_.valid()) return inode.path.Assign(fds_, std::move(fd), nullptr);  // warned at start
  auto handle = env_->NameToHandleAt(fd.get(), "", AT_EMPTY_PATH);
  if (handle.ok()) {
    inode.handle = std::move(handle).value();
  } else {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      spdlog::warn("no file handle for backing inodes ({}): their fds stay open while the kernel caches them",
                   handle.status().message());
    });
  }
  inode.path.Assign(fds_, std::move(fd), ReopenByHandle(inode.handle, O_PATH, inode.dev, inode.ino));
}

Result<Inode*> InodeTable::Lookup(Inode& parent, const std::string& name, struct stat* st) {
  UniqueFd owned;
  {
    ASSIGN_OR_RETURN(FdCache::Lease dir, parent.Path());
    ASSIGN_OR_RETURN(owned, env_->OpenAt(dir.get(), name, O_PATH | O_NOFOLLOW));
  }
  ASSIGN_OR_RETURN(*st, env_->Fstat(owned.get()));
  std::lock_guard lk(mu_);
  auto key = std::make_pair(st->st_dev, st->st_ino);
  auto it = inodes_.find(key);
  if (it != inodes_.end()) {
    ++it->second->nlookup;
    return it->second.get();
  }
  auto inode = std::make_unique<Inode>();
  inode->dev = st->st_dev;
  inode->ino = st->st_ino;
  inode->type = st->st_mode & S_IFMT;
  inode->nlookup = 1;
  AssignPath(*inode, std::move(owned));
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
