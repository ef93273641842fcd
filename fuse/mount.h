// Mounting: option parsing, pre-flight checks with actionable errors, and
// the daemon's life cycle (open store, recover, mount, serve, drain seals).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "codec/compute_device.h"
#include "codec/lossy/roles.h"
#include "fuse/fs.h"

namespace ckptfs {

struct MountOptions {
  std::string backing;
  std::string mountpoint;
  bool foreground = false;
  FsConfig fs;
  uint32_t chunk_size = 4u << 20;
  int zstd_level = 3;
  bool tensor_codec = true;  // kTensor chunks for files whose format names tensors
  bool delta = true;            // StoreOptions::delta
  uint32_t keyframe_every = 8;  // StoreOptions::keyframe_every
  double lossy = 0;             // StoreOptions::lossy (0: lossless)
  lossy::LossyScope lossy_scope = lossy::LossyScope::kModels;  // StoreOptions::lossy_scope
  uint32_t lossy_keyframe_every = 32;  // StoreOptions::lossy_keyframe_every
  int max_threads = 8;
  unsigned seal_workers = 0;  // StoreOptions::seal_workers; 0: half the cores, 1 to 4
  DeviceRequest device = DeviceRequest::kAuto;  // where the encoder's data-parallel steps run
  uint64_t gpu_mem = 256ull << 20;               // GPU memory (and pinned host memory) they may hold
  uint64_t read_ahead = 4u << 20;  // kernel readahead window for the mount
  std::string log_path;            // default: BACKING/ckptfs.log
  std::string log_level = "info";
  bool debug_fuse = false;
  bool nonempty = false;                 // -o nonempty: mount over a directory that has entries
  std::vector<std::string> kernel_opts;  // passed to the kernel mount (allow_other, ro, ...)
};

// The -o options, one line each, for --help.
std::string MountOptionsHelp();
// Parses a comma-separated -o list into `out`. Unknown options are an error.
Status ParseMountOptions(const std::string& list, MountOptions* out);
// Parses "64M", "1G", "4096". Suffixes K/M/G/T are powers of 1024.
Result<uint64_t> ParseSize(const std::string& text);

// Checks the mount point: exists, is a directory, is not stale, not busy,
// and (unless allow_nonempty) empty, since a mount would hide its files.
Result<std::string> CheckMountpoint(const std::string& path, bool allow_nonempty = false);
Result<std::string> CheckBacking(const std::string& path);

// Runs the daemon; returns the process exit code.
int RunMount(MountOptions opts);

// Where /proc/self/mountinfo says `mountpoint` is mounted from, if it is a
// ckptfs mount ("" otherwise). The source is the backing directory.
struct MountEntry {
  std::string mountpoint;
  std::string source;
  std::string fstype;
  std::string dev;  // "major:minor"
};
std::vector<MountEntry> ReadMounts();
// The FUSE mount whose mount point is exactly `path` (the last, i.e. top,
// one when several are stacked), or nullopt.
std::optional<MountEntry> FuseMountAt(const std::string& path);

}  // namespace ckptfs
