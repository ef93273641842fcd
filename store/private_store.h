// The backing store is private to the daemon's user (docs/SEMANTICS.md,
// "Security model"). Packs and staging files hold every file's bytes
// whatever its mode in the mount, and the daemon trusts what the store
// says: a stub written by anyone else could name another user's pack, and
// the daemon would serve (and later delete) it. So nobody but the daemon's
// user may read or write anything in BACKING.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "base/status.h"
#include "base/env.h"

namespace ckptfs {

// Modes of what ckptfs creates for itself in BACKING: the store root and
// every internal directory, and every internal file (superblock, LOCK, log,
// packs, staging and tmp files).
inline constexpr mode_t kPrivateDirMode = 0700;
inline constexpr mode_t kPrivateFileMode = 0600;
// ns/ is the mount's root directory, so its mode is the mount root's (what
// `ls -ld MOUNTPOINT` shows and the kernel checks), like a fresh file
// system's root. Entries under ns/ carry their logical modes and owners.
// The 0700 store root is what keeps other users out of all of them.
inline constexpr mode_t kNamespaceRootMode = 0755;

// Opens the private directory `name` under `parent`, making it first when
// missing and syncing a new one into `parent`: something made durable
// inside a directory that was not would be lost with it.
inline Result<UniqueFd> EnsurePrivateDir(Env* env, int parent, const std::string& name) {
  return EnsureDir(env, parent, name, kPrivateDirMode, Durability::kDataAndName);
}

// Refuses a store root that someone other than the daemon's user could
// have written into (group/other write permission, or another owner): its
// contents could already be forged. The message says how to fix it.
Status CheckStoreRootIsTrusted(Env* env, int root_fd, const std::string& backing);

// Takes group and other permissions off the store root and everything in
// it except ns/ (whose entries are the logical tree) and lost+found: stores
// written by earlier versions have 0755 directories and 0644 packs.
// Never follows symlinks. Returns one human line per part tightened
// (empty when everything was already private).
Result<std::vector<std::string>> MakeStorePrivate(Env* env, int root_fd, const std::string& backing);

// Warnings for the parents of `backing` (an absolute path) that another
// user could write without the sticky bit, or that another user owns (root
// and the daemon's user are trusted): such a parent lets them put a
// directory of their own in the store's place before a mount. Not refused:
// ckptfs cannot fix a parent, and many setups trust a shared group.
std::vector<std::string> LooseParentsOf(Env* env, const std::string& backing);

}  // namespace ckptfs
