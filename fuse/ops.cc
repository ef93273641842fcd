// libfuse low-level callbacks. Each one translates the request into calls
// on the inode table, FileContent or Env, and replies exactly once.
#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "base/log.h"
#include "base/metrics.h"
#include "base/metrics_text.h"
#include "codec/lossy/policy.h"
#include "fuse/fs.h"
#include "store/lossy_xattrs.h"
#include "store/usage_xattrs.h"

namespace ckptfs {
namespace {

// The daemon runs with umask 077 so that what it creates for itself in the
// store is private. A request that creates an entry of the logical tree
// carries the mode the caller asked for with the caller's umask already
// applied by the kernel (no FUSE_CAP_DONT_MASK), so request threads take a
// umask of their own (unshare(CLONE_FS)), 0, and pass that mode through.
void UseRequestModesOnThisThread() {
  thread_local bool done = false;
  if (done) return;
  done = true;
  if (::unshare(CLONE_FS) == 0) {
    ::umask(0);
    return;
  }
  // Without it, new files lose group/other bits (0644 becomes 0600): safe,
  // but not what the caller asked for.
  spdlog::error("unshare(CLONE_FS) failed ({}): files created through the mount get umask 077", std::strerror(errno));
}

Filesystem& Fs(fuse_req_t req) {
  UseRequestModesOnThisThread();
  auto* fs = static_cast<Filesystem*>(fuse_req_userdata(req));
  fs->RunAfterInitOnce();
  return *fs;
}
Env* E(fuse_req_t req) { return Fs(req).store()->env(); }
Inode& In(fuse_req_t req, fuse_ino_t ino) { return Fs(req).inodes().Get(ino); }
// The inode's O_PATH fd (fuse/fd_cache.h), open while the lease lives.
Result<FdCache::Lease> PathOf(fuse_req_t req, fuse_ino_t ino) { return In(req, ino).Path(); }

struct FileHandle {
  FileHandle(Inode* i, std::shared_ptr<FileContent> c, bool w, DecodeAhead* ahead)
      : inode(i), content(std::move(c)), writable(w), stream(ahead) {}
  Inode* inode;
  std::shared_ptr<FileContent> content;
  bool writable;
  DecodeAhead::Stream stream;  // where this handle reads, for decode-ahead
  // A read-only handle on a staged lossy file: its first read seals the
  // file (FileContent::SealForLossyRead), so the open need not wait.
  std::atomic<bool> seal_before_read{false};
};

struct DirHandle {
  UniqueFd fd;
  std::vector<DirEntry> entries;
};

FileHandle* FH(fuse_file_info* fi) { return reinterpret_cast<FileHandle*>(static_cast<uintptr_t>(fi->fh)); }
DirHandle* DH(fuse_file_info* fi) { return reinterpret_cast<DirHandle*>(static_cast<uintptr_t>(fi->fh)); }

// Replies with `code` (0: success), counting the errors the metrics show.
void ReplyCode(fuse_req_t req, int code) {
  if (code == EIO) GlobalMetrics().eio_errors.Add();
  if (code == ENOSPC || code == EDQUOT) GlobalMetrics().enospc_errors.Add();
  fuse_reply_err(req, code);
}

void ReplyErr(fuse_req_t req, const Status& st) {
  const bool expected = st.code() == ENOENT || st.code() == EEXIST || st.code() == ENOTEMPTY || st.code() == ENODATA;
  if (!expected && spdlog::should_log(spdlog::level::debug)) spdlog::debug("request failed: {}", LogSafe(st.message()));
  ReplyCode(req, st.code());
}

bool IsWritable(int flags) { return (flags & O_ACCMODE) != O_RDONLY; }

// Looks up `name` in `parent` (counting one lookup) and fills `e` with its
// attributes and cache timeouts. On failure nothing stays counted.
Result<Inode*> LookupEntry(fuse_req_t req, Inode& parent, const char* name, fuse_entry_param* e) {
  Filesystem& fs = Fs(req);
  *e = fuse_entry_param{};
  ASSIGN_OR_RETURN(Inode * inode, fs.inodes().Lookup(parent, name, &e->attr));
  if (Status st = fs.Stat(*inode, &e->attr); !st.ok()) {
    fs.inodes().Forget(*inode, 1);
    return st;
  }
  e->ino = fs.inodes().IdOf(*inode);
  e->attr_timeout = fs.config().attr_timeout;
  e->entry_timeout = fs.config().entry_timeout;
  return inode;
}

// Replies with an entry for `name` in `parent` (counting one lookup).
void ReplyEntry(fuse_req_t req, Inode& parent, const char* name) {
  fuse_entry_param e;
  auto inode = LookupEntry(req, parent, name, &e);
  if (!inode.ok()) return ReplyErr(req, inode.status());
  // The request was interrupted: the kernel never counts this lookup.
  if (fuse_reply_entry(req, &e) == -ENOENT) Fs(req).inodes().Forget(*inode.value(), 1);
}

// The daemon runs as root; new entries belong to the process that made them.
// `type` is what was just created (S_IFREG, S_IFDIR, ...).
Status GiveToCaller(fuse_req_t req, Inode& parent, const char* name, mode_t type) {
  if (!Fs(req).config().chown_new_files || ::geteuid() != 0) return Status::Ok();
  const fuse_ctx* ctx = fuse_req_ctx(req);
  ASSIGN_OR_RETURN(FdCache::Lease dir, parent.Path());
  auto pst = E(req)->FstatAt(dir.get(), "", AT_EMPTY_PATH);
  // A setgid directory hands its group down; the kernel already did that.
  gid_t gid = (pst.ok() && (pst->st_mode & S_ISGID)) ? static_cast<gid_t>(-1) : ctx->gid;
  // Whoever may write `parent` can rename another entry over the new one
  // before this chown: only the daemon's own fresh entry changes hands,
  // never a file someone linked or moved there.
  ASSIGN_OR_RETURN(UniqueFd fd, E(req)->OpenAt(dir.get(), name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
  ASSIGN_OR_RETURN(struct stat st, E(req)->Fstat(fd.get()));
  if ((st.st_mode & S_IFMT) != type || st.st_uid != ::geteuid() || (type != S_IFDIR && st.st_nlink != 1)) {
    return Status::Error(EEXIST, std::string("new entry ") + name + " was replaced before it was handed to uid " +
                                     std::to_string(ctx->uid));
  }
  return E(req)->FchownAt(fd.get(), "", ctx->uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
}

// The inode currently named `name` in a directory, if the kernel knows
// it, with its fd leased: the fd keeps the inode reachable after its last
// name goes, for ForgetLinkIfGone.
struct Victim {
  Inode* inode = nullptr;
  FdCache::Lease path;
};
Victim FindVictim(fuse_req_t req, int dir_fd, const char* name) {
  auto st = E(req)->FstatAt(dir_fd, name, AT_SYMLINK_NOFOLLOW);
  if (!st.ok() || !S_ISREG(st->st_mode)) return {};
  Inode* inode = Fs(req).inodes().Find(st->st_dev, st->st_ino);
  if (inode == nullptr) return {};
  auto path = inode->Path();
  if (!path.ok()) return {};
  return Victim{inode, std::move(path).value()};
}

void OpInit(void* userdata, fuse_conn_info* conn) {
  auto* fs = static_cast<Filesystem*>(userdata);
  if (fs->config().writeback_cache && (conn->capable & FUSE_CAP_WRITEBACK_CACHE))
    conn->want |= FUSE_CAP_WRITEBACK_CACHE;
  else
    conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
  if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
  // Write payloads can be spliced from /dev/fuse into the staging file.
  if (conn->capable & FUSE_CAP_SPLICE_READ) conn->want |= FUSE_CAP_SPLICE_READ;
  if (conn->capable & FUSE_CAP_SPLICE_MOVE) conn->want |= FUSE_CAP_SPLICE_MOVE;
  conn->max_write = fs->config().max_write;
  conn->max_background = 64;
  conn->congestion_threshold = 48;
}

void OpDestroy(void* userdata) {
  auto* fs = static_cast<Filesystem*>(userdata);
  fs->page_push().Stop();
  fs->deferred().Stop();  // after the pushes its requests wait for
  fs->seals().Drain();
  fs->inodes().DropAll();
}

void OpLookup(fuse_req_t req, fuse_ino_t parent, const char* name) { ReplyEntry(req, In(req, parent), name); }

void OpForget(fuse_req_t req, fuse_ino_t ino, uint64_t n) {
  Fs(req).inodes().Forget(In(req, ino), n);
  fuse_reply_none(req);
}

void OpForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  for (size_t i = 0; i < count; ++i) Fs(req).inodes().Forget(In(req, forgets[i].ino), forgets[i].nlookup);
  fuse_reply_none(req);
}

void OpGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  struct stat st {};
  Status s = Fs(req).Stat(In(req, ino), &st);
  if (!s.ok()) return ReplyErr(req, s);
  fuse_reply_attr(req, &st, Fs(req).config().attr_timeout);
}

Status SetTimes(fuse_req_t req, Inode& inode, const struct stat* attr, int valid) {
  struct timespec tv[2];
  tv[0].tv_nsec = tv[1].tv_nsec = UTIME_OMIT;
  if (valid & FUSE_SET_ATTR_ATIME_NOW)
    tv[0].tv_nsec = UTIME_NOW;
  else if (valid & FUSE_SET_ATTR_ATIME)
    tv[0] = attr->st_atim;
  if (valid & FUSE_SET_ATTR_MTIME_NOW)
    tv[1].tv_nsec = UTIME_NOW;
  else if (valid & FUSE_SET_ATTR_MTIME)
    tv[1] = attr->st_mtim;
  if (inode.type == S_IFREG) {
    ASSIGN_OR_RETURN(auto content, Fs(req).ContentOf(inode));
    return content->SetTimes(tv);
  }
  if (inode.type == S_IFLNK) return Status::Ok();  // no portable way through O_PATH; times stay
  ASSIGN_OR_RETURN(FdCache::Lease path, inode.Path());
  return E(req)->UtimensAt(AT_FDCWD, ProcFdPath(path.get()), tv, 0);
}

Status ApplySetattr(fuse_req_t req, Inode& inode, const struct stat* attr, int valid) {
  Env* env = E(req);
  ASSIGN_OR_RETURN(FdCache::Lease path, inode.Path());
  if ((valid & FUSE_SET_ATTR_MODE) && inode.type != S_IFLNK)
    RETURN_IF_ERROR(env->FchmodAt(AT_FDCWD, ProcFdPath(path.get()), attr->st_mode & 07777, 0));
  if (valid & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
    uid_t uid = (valid & FUSE_SET_ATTR_UID) ? attr->st_uid : static_cast<uid_t>(-1);
    gid_t gid = (valid & FUSE_SET_ATTR_GID) ? attr->st_gid : static_cast<gid_t>(-1);
    RETURN_IF_ERROR(env->FchownAt(path.get(), "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW));
  }
  if (valid & FUSE_SET_ATTR_SIZE) {
    if (inode.type != S_IFREG) return Status::Error(EINVAL, "truncate of a non-regular file");
    ASSIGN_OR_RETURN(auto content, Fs(req).ContentOf(inode));
    RETURN_IF_ERROR(content->Truncate(static_cast<uint64_t>(attr->st_size)));
    if (content->NeedsSeal()) Fs(req).seals().Push(content);
  }
  if (valid & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_ATIME_NOW | FUSE_SET_ATTR_MTIME_NOW))
    RETURN_IF_ERROR(SetTimes(req, inode, attr, valid));
  return Status::Ok();
}

// Applies the setattr and replies with the attributes it leaves.
void FinishSetattr(fuse_req_t req, fuse_ino_t ino, const struct stat* attr, int valid) {
  Status s = ApplySetattr(req, In(req, ino), attr, valid);
  if (!s.ok()) return ReplyErr(req, s);
  OpGetattr(req, ino, nullptr);
}

// A truncate that waits, off the FUSE threads, for page pushes in flight.
class DeferredSetattr : public DeferredOp {
 public:
  DeferredSetattr(fuse_req_t req, fuse_ino_t ino, const struct stat& attr, int valid, FileContent::PushHold hold)
      : req_(req), ino_(ino), attr_(attr), valid_(valid), hold_(std::move(hold)) {}
  void Wait() override { hold_.Wait(); }
  void Run() override { FinishSetattr(req_, ino_, &attr_, valid_); }
  void Cancel() override { ReplyCode(req_, ENOTCONN); }

 private:
  fuse_req_t req_;
  fuse_ino_t ino_;
  struct stat attr_;
  int valid_;
  FileContent::PushHold hold_;
};

void OpSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int valid, fuse_file_info*) {
  Inode& inode = In(req, ino);
  FileContent::PushHold hold;  // a truncate keeps pushes of the old bytes out
  if ((valid & FUSE_SET_ATTR_SIZE) && inode.type == S_IFREG) {
    auto content = Fs(req).ContentOf(inode);
    if (!content.ok()) return ReplyErr(req, content.status());
    hold = content.value()->HoldPagePushes();
    if (hold.must_wait())
      return Fs(req).deferred().Push(std::make_unique<DeferredSetattr>(req, ino, *attr, valid, std::move(hold)));
  }
  FinishSetattr(req, ino, attr, valid);
}

void OpReadlink(fuse_req_t req, fuse_ino_t ino) {
  auto path = PathOf(req, ino);
  if (!path.ok()) return ReplyErr(req, path.status());
  auto target = E(req)->ReadlinkAt(path->get(), "");
  if (!target.ok()) return ReplyErr(req, target.status());
  fuse_reply_readlink(req, target->c_str());
}

void OpMknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  Inode& dir = In(req, parent);
  auto dir_fd = dir.Path();
  if (!dir_fd.ok()) return ReplyErr(req, dir_fd.status());
  Status s = S_ISREG(mode)
                 ? E(req)->OpenAt(dir_fd->get(), name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, mode & 07777).status()
                 : E(req)->MknodAt(dir_fd->get(), name, mode, rdev);
  if (s.ok()) s = GiveToCaller(req, dir, name, (mode & S_IFMT) != 0 ? mode & S_IFMT : S_IFREG);
  if (!s.ok()) return ReplyErr(req, s);
  ReplyEntry(req, dir, name);
}

void OpMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  Inode& dir = In(req, parent);
  auto dir_fd = dir.Path();
  if (!dir_fd.ok()) return ReplyErr(req, dir_fd.status());
  Status s = E(req)->MkdirAt(dir_fd->get(), name, mode);
  if (s.ok()) s = GiveToCaller(req, dir, name, S_IFDIR);
  if (!s.ok()) return ReplyErr(req, s);
  ReplyEntry(req, dir, name);
}

void OpSymlink(fuse_req_t req, const char* link, fuse_ino_t parent, const char* name) {
  Inode& dir = In(req, parent);
  auto dir_fd = dir.Path();
  if (!dir_fd.ok()) return ReplyErr(req, dir_fd.status());
  Status s = E(req)->SymlinkAt(link, dir_fd->get(), name);
  if (s.ok()) s = GiveToCaller(req, dir, name, S_IFLNK);
  if (!s.ok()) return ReplyErr(req, s);
  ReplyEntry(req, dir, name);
}

void OpLink(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  Inode& dir = In(req, newparent);
  auto path = PathOf(req, ino);
  auto dir_fd = dir.Path();
  if (!path.ok() || !dir_fd.ok()) return ReplyErr(req, path.ok() ? dir_fd.status() : path.status());
  Status s = E(req)->LinkAt(AT_FDCWD, ProcFdPath(path->get()), dir_fd->get(), newname, AT_SYMLINK_FOLLOW);
  if (!s.ok()) return ReplyErr(req, s);
  ReplyEntry(req, dir, newname);
}

void OpUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto dir_fd = PathOf(req, parent);
  if (!dir_fd.ok()) return ReplyErr(req, dir_fd.status());
  Victim victim = FindVictim(req, dir_fd->get(), name);
  Status s = E(req)->UnlinkAt(dir_fd->get(), name, 0);
  if (!s.ok()) return ReplyErr(req, s);
  Fs(req).ForgetLinkIfGone(victim.inode);
  fuse_reply_err(req, 0);
}

void OpRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto dir_fd = PathOf(req, parent);
  if (!dir_fd.ok()) return ReplyErr(req, dir_fd.status());
  Status s = E(req)->UnlinkAt(dir_fd->get(), name, AT_REMOVEDIR);
  ReplyCode(req, s.code());
}

void OpRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent, const char* newname,
              unsigned int flags) {
  auto from = PathOf(req, parent);
  auto to = PathOf(req, newparent);
  if (!from.ok() || !to.ok()) return ReplyErr(req, from.ok() ? to.status() : from.status());
  Victim victim = (flags & RENAME_EXCHANGE) ? Victim{} : FindVictim(req, to->get(), newname);
  Status s = E(req)->RenameAt(from->get(), name, to->get(), newname, flags);
  if (!s.ok()) return ReplyErr(req, s);
  Fs(req).ForgetLinkIfGone(victim.inode);
  fuse_reply_err(req, 0);
}

// An open counted (InodeTable::Opened, FileContent::OnOpen) and not yet
// answered: what the rest of it needs, on a FUSE thread or off it.
struct PendingOpen {
  Filesystem* fs;
  fuse_req_t req;
  Inode* inode;
  std::shared_ptr<FileContent> content;
  fuse_file_info fi;
  std::optional<fuse_entry_param> created;  // set for a create
  bool writable;
  bool seal_before_read;
};

// Undoes what the open counted (and the create's lookup), when it gives no
// handle to the kernel.
void UndoOpen(const PendingOpen& p) {
  if (p.content->OnRelease(p.writable)) p.fs->seals().Push(p.content);
  if (p.created) p.fs->inodes().Forget(*p.inode, 1);
  p.fs->inodes().Released(*p.inode);
}

// The rest of an open, once no page push of the file is in flight: the
// O_TRUNC, the handle, the reply.
void FinishOpen(PendingOpen& p) {
  if ((p.fi.flags & O_TRUNC) && p.writable) {
    if (Status s = p.content->Truncate(0); !s.ok()) {
      ReplyErr(p.req, s);
      return UndoOpen(p);
    }
  }
  Filesystem& fs = *p.fs;
  fs.page_push().Opened(*p.inode, p.content);
  auto* handle = new FileHandle(p.inode, p.content, p.writable, &fs.decode_ahead());
  handle->seal_before_read.store(p.seal_before_read, std::memory_order_relaxed);
  p.fi.fh = reinterpret_cast<uintptr_t>(handle);
  // Every write passes through this kernel, so its page cache stays valid,
  // except across a seal, which may rewrite the bytes (lossy mode): the
  // pages of the bytes as written go now, before the seal that the first
  // read makes.
  p.fi.keep_cache = p.content->TakeCacheDrop() || p.seal_before_read ? 0 : 1;
  const int rc = p.created ? fuse_reply_create(p.req, &*p.created, &p.fi) : fuse_reply_open(p.req, &p.fi);
  if (rc != 0) {  // the opener went away: undo the open (and the create's lookup)
    fs.page_push().Released(*p.inode);
    delete handle;
    UndoOpen(p);
  }
}

// An open that waits, off the FUSE threads, for page pushes in flight.
class DeferredOpen : public DeferredOp {
 public:
  DeferredOpen(PendingOpen p, FileContent::PushHold hold) : p_(std::move(p)), hold_(std::move(hold)) {}
  void Wait() override { hold_.Wait(); }
  void Run() override {
    FinishOpen(p_);
    hold_ = FileContent::PushHold();  // a writable handle keeps pushes out from here on
  }
  void Cancel() override {
    ReplyCode(p_.req, ENOTCONN);
    hold_ = FileContent::PushHold();
    UndoOpen(p_);
  }

 private:
  PendingOpen p_;
  FileContent::PushHold hold_;
};

// Opens a handle on an existing regular-file inode and replies, now or,
// when page pushes of the file are in flight, once they have landed.
void OpenHandle(fuse_req_t req, Inode& inode, fuse_file_info* fi, const fuse_entry_param* created) {
  Filesystem& fs = Fs(req);
  // A create that fails here never hands the kernel its entry: undo its lookup.
  auto fail = [&](const Status& st) {
    ReplyErr(req, st);
    if (created) fs.inodes().Forget(inode, 1);
  };
  auto content = fs.ContentOf(inode);
  if (!content.ok()) return fail(content.status());
  if (Status s = content.value()->WaitUntilServable(); !s.ok()) return fail(s);
  const bool writable = IsWritable(fi->flags);
  PendingOpen p{.fs = &fs,
                .req = req,
                .inode = &inode,
                .content = content.value(),
                .fi = *fi,
                .created = created ? std::optional(*created) : std::nullopt,
                .writable = writable,
                .seal_before_read = !writable && content.value()->LossySealPending()};
  fs.inodes().Opened(inode);
  FileContent::PushHold hold = p.content->OnOpen(writable);
  if (hold.must_wait()) return fs.deferred().Push(std::make_unique<DeferredOpen>(std::move(p), std::move(hold)));
  FinishOpen(p);
}

void OpOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Inode& inode = In(req, ino);
  if (inode.type != S_IFREG) return (void)fuse_reply_err(req, inode.type == S_IFDIR ? EISDIR : EINVAL);
  OpenHandle(req, inode, fi, nullptr);
}

// Cluster mode: the new stub is made in this node's nodes/NODE/tmp/,
// staged there (a staged record naming this node), given to the caller,
// and only then linked into its directory, so that other nodes never see
// the name before the record that hides it until it is closed.
Status CreateStagedElsewhere(fuse_req_t req, Inode& dir, const char* name, mode_t mode, bool* made) {
  Store* store = Fs(req).store();
  const int tmp_dir = store->creation_dir_fd();
  const std::string tmp = "create-" + ObjectIdHex(NewObjectId());
  ASSIGN_OR_RETURN(UniqueFd fd,
                   E(req)->OpenAt(tmp_dir, tmp, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_NOFOLLOW, mode & 07777));
  struct RemoveTmp {
    Env* env;
    int dir;
    std::string name;
    ~RemoveTmp() { (void)env->UnlinkAt(dir, name); }
  } remove_tmp{E(req), tmp_dir, tmp};
  if (Fs(req).config().chown_new_files && ::geteuid() == 0) {
    const fuse_ctx* ctx = fuse_req_ctx(req);
    ASSIGN_OR_RETURN(FdCache::Lease dir_fd, dir.Path());
    auto pst = E(req)->FstatAt(dir_fd.get(), "", AT_EMPTY_PATH);
    const gid_t gid = (pst.ok() && (pst->st_mode & S_ISGID)) ? pst->st_gid : ctx->gid;
    RETURN_IF_ERROR(E(req)->FchownAt(fd.get(), "", ctx->uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW));
  }
  ASSIGN_OR_RETURN(Store::Staged staged, store->StageStub(fd.get(), StubRecord{}, 0));
  ASSIGN_OR_RETURN(FdCache::Lease dir_fd, dir.Path());
  Status linked = E(req)->LinkAt(tmp_dir, tmp, dir_fd.get(), name, 0);
  if (!linked.ok()) (void)store->DeleteStaging(staged.rec.object);
  *made = linked.ok();
  return linked;
}

void OpCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  Filesystem& fs = Fs(req);
  Inode& dir = In(req, parent);
  const int excl = fi->flags & O_EXCL;
  Status s;
  bool made_ok = false;
  if (fs.store()->cluster()) {
    s = CreateStagedElsewhere(req, dir, name, mode, &made_ok);
  } else if (auto dir_fd = dir.Path(); !dir_fd.ok()) {
    s = dir_fd.status();
  } else {
    auto made = E(req)->OpenAt(dir_fd->get(), name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, mode & 07777);
    s = made.status();
    made_ok = made.ok();
    if (s.ok()) s = GiveToCaller(req, dir, name, S_IFREG);
  }
  if (s.code() == EEXIST && !excl && !made_ok) s = Status::Ok();  // lost a race with another creator: open it
  if (!s.ok()) return ReplyErr(req, s);
  fuse_entry_param e;
  auto inode = LookupEntry(req, dir, name, &e);
  if (!inode.ok()) return ReplyErr(req, inode.status());
  if (!S_ISREG(e.attr.st_mode)) {
    fs.inodes().Forget(*inode.value(), 1);
    return ReplyErr(req, Status::Error(EISDIR, "create over a non-regular file"));
  }
  if (made_ok) {
    if (auto content = fs.ContentOf(*inode.value()); content.ok()) content.value()->MarkCreated();
  }
  OpenHandle(req, *inode.value(), fi, &e);
}

// A read of bytes its lossy seal keeps exact (seal/read_hints.h) is served as
// written without waiting (FileContent::ReadableBeforeLossySeal): the seal
// keeps those bytes, and the handle's next read elsewhere still waits.
Status SealBeforeFirstRead(FileHandle& h, uint64_t off, uint64_t length) {
  if (!h.seal_before_read.load(std::memory_order_acquire)) return Status::Ok();
  if (h.content->ReadableBeforeLossySeal(off, length)) return Status::Ok();
  RETURN_IF_ERROR(h.content->SealForLossyRead());
  h.seal_before_read.store(false, std::memory_order_release);
  return Status::Ok();
}

// Replies straight from the decoded chunks in the cache (fuse_reply_iov
// gathers them in one writev to /dev/fuse); `pieces` holds them until then.
void OpRead(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  const auto arrived = std::chrono::steady_clock::now();
  FileHandle* h = FH(fi);
  if (Status s = SealBeforeFirstRead(*h, static_cast<uint64_t>(off), size); !s.ok()) return ReplyErr(req, s);
  // A staged file is read into one buffer per worker thread, reused: a fresh
  // megabyte per read costs page faults and TLB shootdowns on every request.
  auto staged_buffer = [size] {
    thread_local std::vector<uint8_t> buf;
    if (buf.size() < size) buf.resize(size);
    return std::span<uint8_t>(buf.data(), size);
  };
  auto pieces = h->content->ReadForReply(static_cast<uint64_t>(off), size, &h->stream, staged_buffer);
  if (!pieces.ok()) return ReplyErr(req, pieces.status());
  uint64_t bytes = 0;
  for (const iovec& v : pieces->iov) bytes += v.iov_len;
  GlobalMetrics().read_bytes.Add(bytes);
  GlobalMetrics().read_requests.Add();
  fuse_reply_iov(req, pieces->iov.data(), static_cast<int>(pieces->iov.size()));
  GlobalMetrics().read_nanoseconds.Add(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - arrived).count()));
}

// Moves the payload from the request buffer (a pipe, when libfuse spliced
// it from /dev/fuse) straight into the staging file.
void OpWriteBuf(fuse_req_t req, fuse_ino_t, fuse_bufvec* in, off_t off, fuse_file_info* fi) {
  FileContent& content = *FH(fi)->content;
  if (Status big = content.CheckWriteEnd(static_cast<uint64_t>(off), fuse_buf_size(in)); !big.ok()) {
    return ReplyErr(req, big);
  }
  ssize_t n = 0;
  {
    auto fd = content.BeginWrite();
    if (!fd.ok()) return ReplyErr(req, fd.status());
    fuse_bufvec out = FUSE_BUFVEC_INIT(fuse_buf_size(in));
    out.buf[0].flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK | FUSE_BUF_FD_RETRY);
    out.buf[0].fd = fd->get();
    out.buf[0].pos = off;
    n = fuse_buf_copy(&out, in, static_cast<fuse_buf_copy_flags>(0));
  }  // the staging fd's lease goes before the write is counted out
  content.EndWrite();
  if (n < 0) return ReplyErr(req, Status::FromErrno(static_cast<int>(-n), "write to staging file"));
  fuse_reply_write(req, static_cast<size_t>(n));
}

void OpFlush(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  // Staged bytes are already in the backing file: a daemon crash cannot
  // lose them, so close() need not wait for the seal. In cluster mode the
  // stub says the file is closed, so other nodes wait for its seal.
  FileHandle* h = FH(fi);
  ReplyCode(req, h->writable ? h->content->OnFlush().code() : 0);
}

void OpRelease(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  FileHandle* h = FH(fi);
  Inode& inode = *h->inode;
  Fs(req).page_push().Released(inode);
  if (h->content->OnRelease(h->writable)) Fs(req).seals().Push(h->content);
  delete h;
  Fs(req).inodes().Released(inode);  // may free a deleted file's content
  fuse_reply_err(req, 0);
}

void OpFsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info* fi) {
  FileHandle* h = FH(fi);
  Status s = h->content->Sync();
  if (s.ok() && h->content->NeedsSeal()) Fs(req).seals().Push(h->content);
  ReplyCode(req, s.code());
}

void OpOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto path = PathOf(req, ino);
  if (!path.ok()) return ReplyErr(req, path.status());
  auto fd = E(req)->OpenAt(AT_FDCWD, ProcFdPath(path->get()), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (!fd.ok()) return ReplyErr(req, fd.status());
  auto* dh = new DirHandle{std::move(fd).value(), {}};
  fi->fh = reinterpret_cast<uintptr_t>(dh);
  fi->cache_readdir = 0;
  if (fuse_reply_open(req, fi) != 0) delete dh;
}

void OpReaddir(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  DirHandle* dh = DH(fi);
  if (off == 0) {  // (re)start: take a fresh listing, as rewinddir expects
    auto list = E(req)->ListDir(dh->fd.get());
    if (!list.ok()) return ReplyErr(req, list.status());
    dh->entries = std::move(list).value();
    if (Fs(req).store()->cluster()) {
      std::erase_if(dh->entries, [&](const DirEntry& d) {
        return d.type == DT_REG && Fs(req).store()->HiddenOnThisNode(dh->fd.get(), d.name);
      });
    }
  }
  std::vector<char> buf(size);
  size_t used = 0;
  for (size_t i = static_cast<size_t>(off); i < dh->entries.size(); ++i) {
    const DirEntry& d = dh->entries[i];
    struct stat st {};
    st.st_ino = d.ino;
    st.st_mode = static_cast<mode_t>(DTTOIF(d.type));
    size_t need =
        fuse_add_direntry(req, buf.data() + used, size - used, d.name.c_str(), &st, static_cast<off_t>(i + 1));
    if (need > size - used) break;
    used += need;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void OpReleasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  delete DH(fi);
  fuse_reply_err(req, 0);
}

void OpFsyncdir(fuse_req_t req, fuse_ino_t, int, fuse_file_info* fi) {
  ReplyCode(req, E(req)->Fsync(DH(fi)->fd.get()).code());
}

void OpStatfs(fuse_req_t req, fuse_ino_t ino) {
  auto path = PathOf(req, ino);
  if (!path.ok()) return ReplyErr(req, path.status());
  auto st = E(req)->Fstatvfs(path->get());
  if (!st.ok()) return ReplyErr(req, st.status());
  fuse_reply_statfs(req, &st.value());
}

// The policy decides how a whole subtree is stored, files of other users
// included, so only the directory's owner (or root) sets or removes it;
// the kernel's own check for user.* xattrs is mere write permission.
Status CheckPolicyOwner(fuse_req_t req, Inode& inode) {
  const uid_t caller = fuse_req_ctx(req)->uid;
  if (caller == 0) return Status::Ok();
  ASSIGN_OR_RETURN(FdCache::Lease path, inode.Path());
  ASSIGN_OR_RETURN(struct stat st, E(req)->FstatAt(path.get(), "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW));
  if (st.st_uid == caller) return Status::Ok();
  return Status::Error(EPERM, std::string(kPolicyXattr) + ": uid " + std::to_string(caller) +
                                  " does not own the directory (only its owner or root may set a policy)");
}

// The policy attribute is checked here, so a typo fails the setxattr
// instead of silently sealing files losslessly later.
Status CheckPolicyXattr(fuse_req_t req, Inode& inode, std::string_view name, std::string_view value) {
  if (name != kPolicyXattr) return Status::Ok();
  if (inode.type != S_IFDIR) {
    return Status::InvalidArgument(std::string(kPolicyXattr) + " applies to directories (their whole subtree)");
  }
  RETURN_IF_ERROR(CheckPolicyOwner(req, inode));
  return ParseLossyPolicy(value).status();
}

// A lossy file's user.ckptfs.lossy.* attributes (store/lossy_xattrs.h);
// none for directories and files that are staged or lossless.
Result<std::vector<std::pair<std::string, std::string>>> LossyAttrs(fuse_req_t req, Inode& inode) {
  if (inode.type != S_IFREG) return std::vector<std::pair<std::string, std::string>>{};
  ASSIGN_OR_RETURN(FdCache::Lease path, inode.Path());
  ASSIGN_OR_RETURN(std::optional<LossyInfo> info, Fs(req).store()->LossyInfoOf(ProcFdPath(path.get())));
  return LossyXattrs(info);
}

// A usage attribute (store/usage_xattrs.h), from the stub and pack at each
// call, so that a poll sees a seal finish; nothing where there is none.
Result<std::optional<std::string>> UsageAttr(fuse_req_t req, Inode& inode, std::string_view name) {
  Store* store = Fs(req).store();
  const bool dir = inode.type == S_IFDIR;
  ASSIGN_OR_RETURN(FdCache::Lease path, inode.Path());
  if (name == kEffectivePolicyXattr && (dir || inode.type == S_IFREG)) {
    const int fd = path.get();
    return std::optional<std::string>(FormatLossyPolicy(dir ? store->PolicyOfDirectory(fd) : store->PolicyFor(fd)));
  }
  if (inode.type != S_IFREG) return std::optional<std::string>();
  ASSIGN_OR_RETURN(FileUsage usage, store->UsageOf(ProcFdPath(path.get())));
  return UsageXattr(usage, name);
}

// Replies with `value` to a getxattr or listxattr that offered `size` bytes.
void ReplyXattrValue(fuse_req_t req, std::string_view value, size_t size) {
  if (size == 0) return (void)fuse_reply_xattr(req, value.size());
  if (size < value.size()) return (void)fuse_reply_err(req, ERANGE);
  fuse_reply_buf(req, value.data(), value.size());
}

// user.ckptfs.metrics on the mount's root: the daemon's figures now, in
// Prometheus text (what `ckptfs top` reads). Not listed, so that copying
// the root's attributes does not copy it; nobody sets it.
bool IsMetricsXattr(fuse_ino_t ino, std::string_view name) { return ino == FUSE_ROOT_ID && name == kMetricsXattr; }

void ReplyMetrics(fuse_req_t req, size_t size) {
  const std::string text = FormatPrometheusText(Fs(req).SampleMetrics());
  // The size a probe gets leaves room for the counters to grow before the
  // read that follows it.
  if (size == 0) return (void)fuse_reply_xattr(req, text.size() + 4096);
  ReplyXattrValue(req, text, size);
}

void OpSetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size, int flags) {
  // They report how the file was sealed and is stored, or the daemon's figures: only ckptfs writes them.
  if (IsLossyXattr(name) || IsUsageXattr(name) || IsMetricsXattr(ino, name)) return (void)fuse_reply_err(req, EPERM);
  if (Status s = CheckPolicyXattr(req, In(req, ino), name, std::string_view(value, size)); !s.ok()) {
    if (LogAllowed(log_kind::kXattr, fuse_req_ctx(req)->uid))
      spdlog::warn("setxattr {}: {}", LogSafe(name), LogSafe(s.message()));
    return ReplyErr(req, s);
  }
  auto path = PathOf(req, ino);
  if (!path.ok()) return ReplyErr(req, path.status());
  Status s =
      E(req)->SetXattr(ProcFdPath(path->get()), name, std::span(reinterpret_cast<const uint8_t*>(value), size), flags);
  ReplyCode(req, s.code());
}

void OpGetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  if (IsMetricsXattr(ino, name)) return ReplyMetrics(req, size);
  if (IsUsageXattr(name)) {
    auto value = UsageAttr(req, In(req, ino), name);
    if (!value.ok()) return ReplyErr(req, value.status());
    if (!value->has_value()) return (void)fuse_reply_err(req, ENODATA);
    return ReplyXattrValue(req, **value, size);
  }
  if (IsLossyXattr(name)) {
    auto attrs = LossyAttrs(req, In(req, ino));
    if (!attrs.ok()) return ReplyErr(req, attrs.status());
    for (const auto& [n, v] : *attrs) {
      if (n == name) return ReplyXattrValue(req, v, size);
    }
    return (void)fuse_reply_err(req, ENODATA);
  }
  std::vector<uint8_t> buf(size);
  auto path = PathOf(req, ino);
  if (!path.ok()) return ReplyErr(req, path.status());
  auto n = E(req)->GetXattr(ProcFdPath(path->get()), name, buf);
  if (!n.ok()) return ReplyErr(req, n.status());
  if (size == 0) return (void)fuse_reply_xattr(req, n.value());
  fuse_reply_buf(req, reinterpret_cast<const char*>(buf.data()), n.value());
}

void OpListxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  auto attrs = LossyAttrs(req, In(req, ino));
  if (!attrs.ok()) return ReplyErr(req, attrs.status());
  auto fd = PathOf(req, ino);
  if (!fd.ok()) return ReplyErr(req, fd.status());
  const std::string path = ProcFdPath(fd->get());
  // The stored names first: sized by a probe, so both come in one reply.
  auto n = E(req)->ListXattr(path, {});
  if (!n.ok()) return ReplyErr(req, n.status());
  std::vector<char> names(*n);
  if (!names.empty()) {
    n = E(req)->ListXattr(path, names);
    if (!n.ok()) return ReplyErr(req, n.status());
    names.resize(*n);
  }
  for (const auto& [name, value] : *attrs) names.insert(names.end(), name.c_str(), name.c_str() + name.size() + 1);
  ReplyXattrValue(req, std::string_view(names.data(), names.size()), size);
}

void OpRemovexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  if (IsLossyXattr(name) || IsUsageXattr(name) || IsMetricsXattr(ino, name)) return (void)fuse_reply_err(req, EPERM);
  if (name == std::string_view(kPolicyXattr)) {
    if (Status s = CheckPolicyOwner(req, In(req, ino)); !s.ok()) {
      if (LogAllowed(log_kind::kXattr, fuse_req_ctx(req)->uid))
        spdlog::warn("removexattr {}: {}", LogSafe(name), LogSafe(s.message()));
      return ReplyErr(req, s);
    }
  }
  auto path = PathOf(req, ino);
  if (!path.ok()) return ReplyErr(req, path.status());
  ReplyCode(req, E(req)->RemoveXattr(ProcFdPath(path->get()), name).code());
}

fuse_lowlevel_ops MakeOps() {
  fuse_lowlevel_ops ops{};
  ops.init = OpInit;
  ops.destroy = OpDestroy;
  ops.lookup = OpLookup;
  ops.forget = OpForget;
  ops.forget_multi = OpForgetMulti;
  ops.getattr = OpGetattr;
  ops.setattr = OpSetattr;
  ops.readlink = OpReadlink;
  ops.mknod = OpMknod;
  ops.mkdir = OpMkdir;
  ops.symlink = OpSymlink;
  ops.link = OpLink;
  ops.unlink = OpUnlink;
  ops.rmdir = OpRmdir;
  ops.rename = OpRename;
  ops.open = OpOpen;
  ops.create = OpCreate;
  ops.read = OpRead;
  ops.write_buf = OpWriteBuf;
  ops.flush = OpFlush;
  ops.release = OpRelease;
  ops.fsync = OpFsync;
  ops.opendir = OpOpendir;
  ops.readdir = OpReaddir;
  ops.releasedir = OpReleasedir;
  ops.fsyncdir = OpFsyncdir;
  ops.statfs = OpStatfs;
  ops.setxattr = OpSetxattr;
  ops.getxattr = OpGetxattr;
  ops.listxattr = OpListxattr;
  ops.removexattr = OpRemovexattr;
  return ops;
}

}  // namespace

const fuse_lowlevel_ops& Filesystem::Ops() {
  static const fuse_lowlevel_ops ops = MakeOps();
  return ops;
}

}  // namespace ckptfs
