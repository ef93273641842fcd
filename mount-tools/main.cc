// ckptfs: mount a checkpoint store, and the operator commands around it.
#include <CLI/CLI.hpp>
#include <iostream>
#include <optional>
#include <string>

#include "gpu/cuda_device.h"
#include "mount-tools/commands.h"
#include "mount-tools/freeze.h"
#include "mount-tools/mount_helper.h"
#include "mount-tools/transfer.h"
#include "store/cluster/rados_client.h"

namespace ckptfs {
namespace {

// What the command line asked for; each subcommand fills its own fields.
struct Args {
  MountOptions mount;
  std::vector<std::string> mount_option_lists;  // one per -o
  std::string umount_path;
  bool lazy = false;
  double timeout = 600;
  std::string stats_path;
  bool stats_json = false;
  std::string fsck_path;
  bool fsck_json = false;
  std::string gc_path;
  std::optional<uint32_t> gc_grace;
  bool gc_json = false;
  std::string top_path;
  bool top_once = false;
  bool top_json = false;
  std::string inspect_path;
  bool inspect_json = false;
  bool inspect_roles = false;
  std::string ceph_conf = ClusterOptions{}.ceph_conf;  // stats, fsck, gc
  std::vector<std::string> export_operands;  // STORE [PATH] DEST
  std::string import_src, import_store, import_path;
  std::vector<std::string> import_options;
  bool transfer_json = false;
  std::string freeze_path;
  double freeze_timeout = 60;
};

constexpr char kExitStatus[] =
    "Exit status: 0 success; 1 the command ran and found a problem (fsck: damage; gc: unreadable objects kept it "
    "from deleting); 2 a usage or operational error (bad arguments, a mount or unmount that failed, a store that "
    "cannot be opened).";

// For a store whose packs are in a RADOS pool.
void AddCephConf(CLI::App* cmd, Args& a) {
  cmd->add_option("--ceph-conf", a.ceph_conf, "Ceph configuration, for a store with packs in RADOS")
      ->capture_default_str();
}

struct Commands {
  CLI::App* mount;
  CLI::App* umount;
  CLI::App* stats;
  CLI::App* fsck;
  CLI::App* gc;
  CLI::App* inspect;
  CLI::App* exporter;
  CLI::App* importer;
  CLI::App* freeze;
  CLI::App* thaw;
  CLI::App* top;
};

CLI::App* AddMount(CLI::App& app, Args& a) {
  auto* mount = app.add_subcommand("mount", "Mount BACKING (a store directory) on MOUNTPOINT");
  mount->add_flag("-f,--foreground", a.mount.foreground, "Stay in the foreground (log to stderr too)");
  mount->add_option("-o", a.mount_option_lists, "Mount options, comma-separated (see below)")->allow_extra_args(false);
  mount->add_option("BACKING", a.mount.backing, "Backing directory: an existing empty dir or a ckptfs store")
      ->required();
  mount->add_option("MOUNTPOINT", a.mount.mountpoint, "Existing directory to mount on")->required();
  mount->footer(MountOptionsHelp() + "\n" + kExitStatus);
  return mount;
}

CLI::App* AddUmount(CLI::App& app, Args& a) {
  auto* umount = app.add_subcommand("umount", "Unmount a ckptfs mount (also a stale one) and wait for its daemon");
  umount->add_option("MOUNTPOINT", a.umount_path, "The mount point")->required();
  umount->add_flag("-z,--lazy", a.lazy, "Detach now even if busy; the daemon finishes when files close");
  umount->add_option("--timeout", a.timeout, "Seconds to wait for pending seals (default 600)");
  return umount;
}

CLI::App* AddStats(CLI::App& app, Args& a) {
  auto* stats = app.add_subcommand("stats", "Logical versus stored bytes, per file and in total");
  stats->add_option("PATH", a.stats_path, "A mount point, a directory inside one, or a backing store")->required();
  stats->add_flag("--json", a.stats_json, "Print JSON");
  AddCephConf(stats, a);
  return stats;
}

CLI::App* AddFsck(CLI::App& app, Args& a) {
  auto* fsck = app.add_subcommand("fsck", "Verify every checksum of a store; exit 0 clean, 1 corrupt, 2 error");
  fsck->add_option("BACKING", a.fsck_path, "The backing store directory")->required();
  fsck->add_flag("--json", a.fsck_json, "Print JSON");
  AddCephConf(fsck, a);
  return fsck;
}

CLI::App* AddGc(CLI::App& app, Args& a) {
  auto* gc = app.add_subcommand("gc",
                                "Delete packs nothing needs in an unmounted store (mounts do this themselves), or "
                                "in a shared store while its daemons stay mounted (cluster GC); exit 0 done, 1 "
                                "nothing deleted because objects are unreadable, 2 error");
  gc->add_option("BACKING", a.gc_path, "The backing store directory")->required();
  AddCephConf(gc, a);
  gc->add_option("--grace", a.gc_grace,
                 "Shared store: seconds a pack must have been unneeded before it is deleted (default: the "
                 "store's, 600)")
      ->check(CLI::Range(0u, 30u * 86400u));
  gc->add_flag("--json", a.gc_json, "Print a JSON summary");
  return gc;
}

CLI::App* AddTop(CLI::App& app, Args& a) {
  auto* top = app.add_subcommand("top",
                                 "Show a mount's live figures (bytes stored, seal queue, throughput, cache, errors, "
                                 "lossy error), refreshed every second; q or Ctrl-C quits");
  top->add_option("MOUNTPOINT", a.top_path, "The mount point, or a path inside it")->required();
  top->add_flag("--once", a.top_once, "Print one sample and exit");
  top->add_flag("--json", a.top_json, "Print one sample as JSON and exit");
  return top;
}

CLI::App* AddInspect(CLI::App& app, Args& a) {
  auto* inspect = app.add_subcommand(
      "inspect", "Show what the checkpoint format parsers find in FILE: format, note, tensor regions; and the budget "
      "a lossy file got (its user.ckptfs.lossy.* attributes)");
  inspect->add_option("FILE", a.inspect_path, "Any file (inside a mount or not)")->required();
  inspect->add_flag("--json", a.inspect_json, "Print JSON");
  // Hidden (no group): for tests of the lossy role assignment.
  inspect->add_flag("--roles", a.inspect_roles, "With --json: label, order and lossy role of each tensor")->group("");
  return inspect;
}

CLI::App* AddExport(CLI::App& app, Args& a) {
  auto* cmd = app.add_subcommand("export",
                                 "Write the files of an unmounted store (or those under PATH) to DEST as plain files: "
                                 "lossless ones bit-exact, lossy ones as reconstructed");
  cmd->add_option("STORE [PATH] DEST", a.export_operands, "The store, a path inside it (optional), a new directory")
      ->required()
      ->expected(2, 3);
  cmd->add_flag("--json", a.transfer_json, "Print a JSON summary");
  return cmd;
}

CLI::App* AddImport(CLI::App& app, Args& a) {
  auto* cmd = app.add_subcommand("import",
                                 "Copy a checkpoint directory into an unmounted store (an empty directory becomes "
                                 "one), oldest file first, so a series is stored as deltas; returns once all is sealed");
  cmd->add_option("SRC", a.import_src, "A directory (or a file) to import")->required();
  cmd->add_option("STORE", a.import_store, "The store")->required();
  cmd->add_option("PATH", a.import_path, "Where in the store (default: SRC's name)");
  cmd->add_option("-o", a.import_options, "Mount options for the import, e.g. lossy=0.05 (see mount --help)")
      ->allow_extra_args(false);
  cmd->add_flag("--json", a.transfer_json, "Print a JSON summary");
  return cmd;
}

CLI::App* AddFreeze(CLI::App& app, Args& a) {
  auto* cmd = app.add_subcommand("freeze",
                                 "Hold a mounted store still for a backup: its daemon stops until `ckptfs thaw`; a "
                                 "copy of the store meanwhile is consistent (fsck clean; mounting it recovers)");
  cmd->add_option("MOUNTPOINT", a.freeze_path, "The mount point")->required();
  cmd->add_option("--timeout", a.freeze_timeout, "Seconds to wait for the daemon's threads to stop (default 60)");
  return cmd;
}

CLI::App* AddThaw(CLI::App& app, Args& a) {
  auto* cmd = app.add_subcommand("thaw", "Resume a daemon that `ckptfs freeze` stopped");
  cmd->add_option("MOUNTPOINT", a.freeze_path, "The mount point")->required();
  return cmd;
}

std::string Joined(const std::vector<std::string>& lists) {
  std::string out;
  for (const std::string& l : lists) out += (out.empty() ? "" : ",") + l;
  return out;
}

int RunTransfer(const Commands& c, const Args& a) {
  if (*c.exporter) {
    const auto& ops = a.export_operands;
    return RunExport(ops[0], ops.size() == 3 ? ops[1] : "", ops.back(), a.transfer_json);
  }
  return RunImport(a.import_src, a.import_store, a.import_path, Joined(a.import_options), a.transfer_json);
}

int Mount(Args& a) {
  for (const std::string& list : a.mount_option_lists) {
    Status st = ParseMountOptions(list, &a.mount);
    if (!st.ok()) {
      std::cerr << "ckptfs mount: " << st.message() << "\n";
      return 2;
    }
  }
  return RunMount(a.mount);
}

// The operator commands report errors as Status; an exception that still
// escapes (std::filesystem on a path that vanished or went stale) is an
// error message and exit 2 like the others, not an abort.
int RunOperatorCommand(const CLI::App& app, const Commands& c, const Args& a) {
  try {
    if (*c.umount) return RunUmount(a.umount_path, a.lazy, a.timeout);
    if (*c.stats) return RunStats(a.stats_path, a.stats_json, a.ceph_conf);
    if (*c.fsck) return RunFsck(a.fsck_path, a.fsck_json, a.ceph_conf);
    if (*c.gc) return RunGc(a.gc_path, a.gc_grace, a.ceph_conf, a.gc_json);
    if (*c.top) return RunTop(a.top_path, a.top_once, a.top_json);
    if (*c.inspect) return RunInspect(a.inspect_path, a.inspect_json, a.inspect_roles);
    if (*c.exporter || *c.importer) return RunTransfer(c, a);
    if (*c.freeze) return RunFreeze(a.freeze_path, a.freeze_timeout);
    if (*c.thaw) return RunThaw(a.freeze_path);
  } catch (const std::exception& e) {
    std::cerr << "ckptfs " << app.get_subcommands().front()->get_name() << ": " << e.what() << "\n";
  }
  return 2;
}

std::vector<std::string> SubcommandNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  return names;
}

// Called by mount(8) as mount.ckptfs, or by fuse3's mount.fuse as
// `ckptfs STORE MOUNTPOINT -o OPTIONS` (mount_helper.h).
int RunMountHelper(const std::vector<std::string>& args) {
  auto call = ParseHelperCall(args);
  if (!call.ok()) {
    std::cerr << "mount.ckptfs: " << call.status().message() << "\n";
    return 2;
  }
  if (call->fake) return 0;
  return RunMount(call->mount);
}

// CLI11 exits 0 for --help and --version, and its own codes (104, 106...)
// for usage errors; every usage error is exit 2 here.
int ExitForParseError(const CLI::App& app, const CLI::ParseError& e) {
  const int rc = app.exit(e);
  return rc == 0 ? 0 : 2;
}

// The version, then what this build can do: optional backends say "+name"
// when built in, "-name" when not (tests skip what the binary lacks).
std::string VersionText() {
  return std::string("ckptfs ") + CKPTFS_VERSION + "\nfeatures: " + (BuiltWithRados() ? "+rados" : "-rados") +
         (gpu::BuiltWithCuda() ? " +cuda" : " -cuda");
}

}  // namespace
}  // namespace ckptfs

int main(int argc, char** argv) {
  CLI::App app{"ckptfs: a FUSE filesystem that stores deep-learning checkpoints compressed and crash-safe"};
  app.require_subcommand(1);
  app.set_version_flag("--version", ckptfs::VersionText());
  app.footer(ckptfs::kExitStatus);
  ckptfs::Args args;
  const ckptfs::Commands commands{ckptfs::AddMount(app, args), ckptfs::AddUmount(app, args),
                                  ckptfs::AddStats(app, args), ckptfs::AddFsck(app, args),
                                  ckptfs::AddGc(app, args),    ckptfs::AddInspect(app, args),
                                  ckptfs::AddExport(app, args), ckptfs::AddImport(app, args),
                                  ckptfs::AddFreeze(app, args), ckptfs::AddThaw(app, args),
                                  ckptfs::AddTop(app, args)};
  for (CLI::App* sub : {commands.umount, commands.stats, commands.fsck, commands.gc, commands.inspect,
                        commands.exporter, commands.importer, commands.freeze, commands.thaw, commands.top})
    sub->footer(ckptfs::kExitStatus);
  const std::vector<std::string> operands(argv + 1, argv + argc);
  if (ckptfs::IsMountHelperName(argv[0]) || ckptfs::IsMountFuseCall(operands, ckptfs::SubcommandNames(app)))
    return ckptfs::RunMountHelper(operands);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ckptfs::ExitForParseError(app, e);
  }
  if (*commands.mount) return ckptfs::Mount(args);
  return ckptfs::RunOperatorCommand(app, commands, args);
}
