#include "store/private_store.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

namespace ckptfs {
namespace {

constexpr mode_t kGroupOtherBits = 077;
// Internal trees are at most packs/XX/file deep; anything deeper is not
// ours, and is still tightened, but a bound keeps a pathological tree from
// recursing without end.
constexpr int kMaxDepth = 16;

std::string Octal(mode_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

std::string UserName(uid_t uid) {
  struct passwd pw {};
  struct passwd* found = nullptr;
  char buf[1024];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found != nullptr) {
    return std::to_string(uid) + " (" + found->pw_name + ")";
  }
  return std::to_string(uid);
}

// What one top-level entry of the store needed.
struct Tightened {
  uint64_t dirs = 0;
  uint64_t files = 0;
  std::string example;  // the first change, "packs/ab 0755 -> 0700"
};

// chmod that never follows a symlink: the entry was just lstat'ed as a
// directory or regular file, and only the daemon's user can write the
// directories it lives in, but a symlink must never lead the daemon out.
Status ChmodNoFollow(Env* env, int dirfd, const std::string& name, mode_t mode) {
  Status s = env->FchmodAt(dirfd, name, mode, AT_SYMLINK_NOFOLLOW);
  if (s.ok() || (s.code() != EOPNOTSUPP && s.code() != ENOTSUP)) return s;
  // Without /proc, glibc cannot chmod with AT_SYMLINK_NOFOLLOW.
  return env->FchmodAt(dirfd, name, mode, 0);
}

Status TightenTree(Env* env, int dirfd, const std::string& name, const std::string& rel, int depth, Tightened* t) {
  ASSIGN_OR_RETURN(struct stat st, env->FstatAt(dirfd, name, AT_SYMLINK_NOFOLLOW));
  const bool dir = S_ISDIR(st.st_mode);
  // Symlinks have no permissions of their own; sockets and the like are not ours.
  if (!dir && !S_ISREG(st.st_mode)) return Status::Ok();
  if (st.st_mode & kGroupOtherBits) {
    const mode_t tight = st.st_mode & 07777 & ~kGroupOtherBits;
    RETURN_IF_ERROR(ChmodNoFollow(env, dirfd, name, tight).WithContext("making " + rel + " private"));
    ++(dir ? t->dirs : t->files);
    if (t->example.empty()) t->example = rel + " " + Octal(st.st_mode) + " -> " + Octal(tight);
  }
  if (!dir || depth >= kMaxDepth) return Status::Ok();
  ASSIGN_OR_RETURN(UniqueFd sub, env->OpenAt(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  ASSIGN_OR_RETURN(std::vector<DirEntry> entries, env->ListDir(sub.get()));
  for (const DirEntry& e : entries) {
    RETURN_IF_ERROR(TightenTree(env, sub.get(), e.name, rel + "/" + e.name, depth + 1, t));
  }
  return Status::Ok();
}

}  // namespace

Status CheckStoreRootIsTrusted(Env* env, int root_fd, const std::string& backing) {
  ASSIGN_OR_RETURN(struct stat st, env->Fstat(root_fd));
  const uid_t me = ::geteuid();
  if (st.st_uid != me) {
    return Status::Error(EPERM, "backing directory " + backing + " belongs to uid " + UserName(st.st_uid) +
                                    ", not to the daemon's user (uid " + UserName(me) +
                                    "); refusing to use it, since its owner could change the store behind the "
                                    "daemon's back. If it is meant to be a store, `chown " +
                                    std::to_string(me) + " " + backing + "` (or pass a directory of your own)");
  }
  if (st.st_mode & 022) {
    return Status::Error(EPERM, "backing directory " + backing + " is writable by " +
                                    ((st.st_mode & 020) && (st.st_mode & 002) ? "its group and other users"
                                     : (st.st_mode & 020)                     ? "its group"
                                                                              : "other users") +
                                    " (mode " + Octal(st.st_mode) +
                                    "); refusing to use it, since they could have planted files the daemon would "
                                    "trust (a forged stub serves another user's data). Check that it holds "
                                    "nothing you did not put there, then `chmod go-w " +
                                    backing + "` (ckptfs makes it 0700 itself when it mounts)");
  }
  return Status::Ok();
}

Result<std::vector<std::string>> MakeStorePrivate(Env* env, int root_fd, const std::string& backing) {
  std::vector<std::string> done;
  ASSIGN_OR_RETURN(struct stat root, env->Fstat(root_fd));
  if (root.st_mode & kGroupOtherBits) {
    const mode_t tight = root.st_mode & 07777 & ~kGroupOtherBits;
    RETURN_IF_ERROR(env->FchmodAt(root_fd, ".", tight, 0).WithContext("making " + backing + " private"));
    done.push_back("made " + backing + " private: " + Octal(root.st_mode) + " -> " + Octal(tight));
  }
  ASSIGN_OR_RETURN(std::vector<DirEntry> entries, env->ListDir(root_fd));
  for (const DirEntry& e : entries) {
    // ns/ holds the logical tree: its modes and owners are the files' own.
    if (e.name == "ns" || e.name == "lost+found") continue;
    Tightened t;
    RETURN_IF_ERROR(TightenTree(env, root_fd, e.name, e.name, 0, &t));
    if (t.dirs + t.files == 0) continue;
    done.push_back("made " + backing + "/" + e.name + " private: " + std::to_string(t.dirs) + " director" +
                   (t.dirs == 1 ? "y" : "ies") + " and " + std::to_string(t.files) + " file" +
                   (t.files == 1 ? "" : "s") + " were open to group or other users (e.g. " + t.example + ")");
  }
  return done;
}

std::vector<std::string> LooseParentsOf(Env* env, const std::string& backing) {
  std::vector<std::string> out;
  std::string dir = backing;
  while (dir.size() > 1) {
    const size_t slash = dir.find_last_of('/');
    if (slash == std::string::npos) break;
    dir = slash == 0 ? "/" : dir.substr(0, slash);
    Result<struct stat> st = env->FstatAt(AT_FDCWD, dir, 0);
    if (!st.ok()) break;
    const bool others_write = (st->st_mode & 022) != 0 && (st->st_mode & S_ISVTX) == 0;
    const bool foreign_owner = st->st_uid != 0 && st->st_uid != ::geteuid();
    if (others_write || foreign_owner) {
      out.push_back("parent " + dir + " of the store (mode " + Octal(st->st_mode) + ", owner uid " +
                    UserName(st->st_uid) + ") " +
                    (others_write ? "can be written by other users" : "belongs to another user") +
                    ", who could put a directory of their own in place of " + backing +
                    " before a mount; keep stores under paths only root can change");
    }
  }
  return out;
}

}  // namespace ckptfs
