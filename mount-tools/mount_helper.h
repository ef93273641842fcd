// `ckptfs` as a mount(8) helper. mount(8) runs /sbin/mount.TYPE for
// `mount -t TYPE` and for fstab lines: installed as mount.ckptfs and
// mount.fuse.ckptfs (links to the ckptfs binary), it is called as
//   mount.ckptfs STORE MOUNTPOINT [-sfnv] [-o OPTIONS] [-t TYPE]
// and fuse3's generic mount.fuse, for `-t fuse.ckptfs` without our helper
// and for fstab's `ckptfs#STORE MOUNTPOINT fuse` form, runs
//   ckptfs STORE MOUNTPOINT -o OPTIONS
// Both become a `ckptfs mount`, with the options that belong to fstab,
// mount(8) or systemd rather than to the daemon left out.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "mount-tools/mount_options.h"

namespace ckptfs {

// What mount(8) asked the helper for.
struct HelperCall {
  MountOptions mount;
  bool fake = false;  // -f: check everything, mount nothing
  std::vector<std::string> dropped;  // options left out: fstab's own, or unknown with -s
};

// Whether argv[0] names the helper (mount.ckptfs, mount.fuse.ckptfs).
bool IsMountHelperName(std::string_view argv0);
// Whether `args` (argv without argv[0]) is mount.fuse's `STORE MOUNTPOINT
// [-o OPTIONS]`: two operands first, neither of them an option, the first
// none of `subcommands`.
bool IsMountFuseCall(const std::vector<std::string>& args, const std::vector<std::string>& subcommands);
// Options that fstab, mount(8) and systemd act on themselves (_netdev,
// nofail, defaults, auto, noauto, user, users, nouser, owner, group,
// x-*, comment=*): the daemon ignores them.
bool IsFstabOnlyOption(std::string_view option);
// Parses a helper's arguments (argv without argv[0]) into a mount. Unknown
// options are an error unless -s (sloppy) is given, which leaves them out.
// "ckptfs#STORE" is taken as STORE.
Result<HelperCall> ParseHelperCall(const std::vector<std::string>& args);

}  // namespace ckptfs
