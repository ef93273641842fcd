// ckptfs: mount a checkpoint store, and the operator commands around it.
#include <CLI/CLI.hpp>
#include <iostream>

#include "fuse/mount.h"
#include "mount-tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"ckptfs: a FUSE filesystem that stores deep-learning checkpoints compressed and crash-safe"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("ckptfs ") + CKPTFS_VERSION);

  ckptfs::MountOptions mo;
  std::vector<std::string> opt_lists;
  auto* mount = app.add_subcommand("mount", "Mount BACKING (a store directory) on MOUNTPOINT");
  mount->add_flag("-f,--foreground", mo.foreground, "Stay in the foreground (log to stderr too)");
  mount->add_option("-o", opt_lists, "Mount options, comma-separated (see below)")->allow_extra_args(false);
  mount->add_option("BACKING", mo.backing, "Backing directory: an existing empty dir or a ckptfs store")->required();
  mount->add_option("MOUNTPOINT", mo.mountpoint, "Existing directory to mount on")->required();
  mount->footer(ckptfs::MountOptionsHelp());

  std::string um_path;
  bool lazy = false;
  double timeout = 600;
  auto* umount = app.add_subcommand("umount", "Unmount a ckptfs mount (also a stale one) and wait for its daemon");
  umount->add_option("MOUNTPOINT", um_path, "The mount point")->required();
  umount->add_flag("-z,--lazy", lazy, "Detach now even if busy; the daemon finishes when files close");
  umount->add_option("--timeout", timeout, "Seconds to wait for pending seals (default 600)");

  std::string stats_path;
  bool stats_json = false;
  auto* stats = app.add_subcommand("stats", "Logical versus stored bytes, per file and in total");
  stats->add_option("PATH", stats_path, "A mount point, a directory inside one, or a backing store")->required();
  stats->add_flag("--json", stats_json, "Print JSON");

  std::string fsck_path;
  bool fsck_json = false;
  auto* fsck = app.add_subcommand("fsck", "Verify every checksum of a store; exit 0 clean, 1 corrupt, 2 error");
  fsck->add_option("BACKING", fsck_path, "The backing store directory")->required();
  fsck->add_flag("--json", fsck_json, "Print JSON");

  std::string gc_path;
  auto* gc = app.add_subcommand("gc",
                                "Delete packs nothing needs in an unmounted store (mounts do this themselves); "
                                "exit 0 done, 1 nothing deleted because objects are unreadable, 2 error");
  gc->add_option("BACKING", gc_path, "The backing store directory")->required();

  std::string inspect_path;
  bool inspect_json = false;
  auto* inspect = app.add_subcommand(
      "inspect", "Show what the checkpoint format parsers find in FILE: format, note, tensor regions");
  inspect->add_option("FILE", inspect_path, "Any file (inside a mount or not)")->required();
  inspect->add_flag("--json", inspect_json, "Print JSON");
  bool inspect_roles = false;  // hidden: for tests of the lossy role assignment
  inspect->add_flag("--roles", inspect_roles, "With --json: label, order and lossy role of each tensor")->group("");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    // inspect: 0 ok (also for unknown formats), 2 usage or I/O error
    return (rc != 0 && inspect->parsed()) ? 2 : rc;
  }

  if (*mount) {
    for (const auto& list : opt_lists) {
      ckptfs::Status st = ckptfs::ParseMountOptions(list, &mo);
      if (!st.ok()) {
        std::cerr << "ckptfs mount: " << st.message() << "\n";
        return 2;
      }
    }
    if (mo.debug_fuse) mo.foreground = true;
    return ckptfs::RunMount(mo);
  }
  // The commands report errors as Status; an exception that still escapes
  // (std::filesystem on a path that vanished or went stale) is an error
  // message and exit 2 like the others, not an abort.
  try {
    if (*umount) return ckptfs::RunUmount(um_path, lazy, timeout);
    if (*stats) return ckptfs::RunStats(stats_path, stats_json);
    if (*fsck) return ckptfs::RunFsck(fsck_path, fsck_json);
    if (*gc) return ckptfs::RunGc(gc_path);
    if (*inspect) return ckptfs::RunInspect(inspect_path, inspect_json, inspect_roles);
  } catch (const std::exception& e) {
    std::cerr << "ckptfs " << app.get_subcommands().front()->get_name() << ": " << e.what() << "\n";
    return 2;
  }
  return 2;
}
