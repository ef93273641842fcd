// The operator commands behind the ckptfs CLI. Each returns an exit code: 0
// success, 1 the command ran and found a problem (fsck, gc), 2 a usage or
// operational error.
#pragma once

#include <optional>
#include <string>

#include "mount-tools/mount_options.h"

namespace ckptfs {

// Mounts opts.backing on opts.mountpoint and serves it: in the background
// (returning once the daemon serves) unless opts.foreground.
int RunMount(const MountOptions& opts);

// Unmounts MOUNTPOINT (also a stale one whose daemon died) and waits until
// the daemon has sealed pending files and released the store. 0 done, 2
// not a mount, busy, or still sealing after `timeout_s`.
int RunUmount(const std::string& mountpoint, bool lazy, double timeout_s);
// Logical versus stored bytes under PATH (a mount, a dir in it, or BACKING).
// `ceph_conf` (here and for fsck and gc): the Ceph configuration, for a
// store whose packs are in RADOS.
int RunStats(const std::string& path, bool json, const std::string& ceph_conf);
// Verifies every checksum in BACKING. 0 clean, 1 problems found, 2 could not run.
int RunFsck(const std::string& backing, bool json, const std::string& ceph_conf);
// Full garbage collection of an unmounted store (the mark-and-sweep that
// recovery runs at every mount). 0 done, 2 could not run (e.g. mounted).
// A shared store gets cluster GC (with `grace` seconds, else the store's
// default), run beside its mounted daemons; any other gets recovery's sweep,
// with a progress line on a terminal. `json`: a JSON summary on stdout.
int RunGc(const std::string& backing, std::optional<uint32_t> grace, const std::string& ceph_conf, bool json = false);
// The daemon's figures for the mount PATH is in, from its root's
// user.ckptfs.metrics: redrawn every second until q or Ctrl-C, or printed
// once (`once`, or as JSON with `json`). 0 ok, 2 not a ckptfs mount.
int RunTop(const std::string& path, bool once, bool json);
// Runs the content-based format parsers on FILE and prints format, note and
// tensor regions. 0 ok (an unrecognised file is format "unknown"), 2 error.
// `roles` adds each tensor's label, order and lossy role to the JSON (kept
// out of the default JSON, whose shape scripts rely on).
int RunInspect(const std::string& path, bool json, bool roles = false);

}  // namespace ckptfs
