// The options of `ckptfs mount`: each layer's own options struct, composed
// here, and the table that parses -o lists into them and documents them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "base/log_file.h"
#include "base/status.h"
#include "codec/compute_device.h"
#include "fuse/mount.h"
#include "gpu/cuda_device.h"
#include "store/store.h"

namespace ckptfs {

// What a daemon wants from the store where it differs from a library
// user's defaults: background GC, and half the cores (1 to 4) coding the
// chunks of a file as it seals.
StoreOptions DaemonStoreOptions();

// Where -o metrics= serves (mount-tools/metrics_server.h); port 0: nowhere.
struct MetricsAddress {
  std::string host;  // an IPv4 or IPv6 literal
  uint16_t port = 0;
  bool allow_remote = false;  // -o metrics_remote: a host other than loopback is allowed
  bool enabled() const { return port != 0; }
  bool loopback() const;
  // "127.0.0.1:9464", "[::1]:9464"
  std::string ToString() const;
};
// "9464" (loopback), "HOST:9464", "[V6]:9464"; HOST is an address literal
// or localhost.
Result<MetricsAddress> ParseMetricsAddress(const std::string& text);

struct MountOptions {
  std::string backing;
  std::string mountpoint;
  StoreOptions store = DaemonStoreOptions();
  FuseOptions fuse;
  DeviceRequest device = DeviceRequest::kAuto;  // where the encoder's data-parallel steps run
  gpu::CudaOptions cuda;                        // -o gpu_mem: what a GPU device may hold
  // The daemon's own settings.
  bool foreground = false;
  std::string log_path;  // default: BACKING/ckptfs.log
  LogFileOptions log_file;  // log_max=: the size at which the log rotates
  std::string log_level = "info";
  bool nonempty = false;  // mount over a directory that has entries
  MetricsAddress metrics;
};

// One -o option as given: "key" or "key=value".
struct OptionArg {
  std::string text;
  std::string key;
  std::string value;  // "" when none was given
};

// A row of the mount option table.
struct MountOptionSpec {
  enum class Takes { kNoValue, kValue, kOptionalValue };
  std::string_view name;
  Takes takes;
  std::string_view value_name;  // in the help: "SIZE" for cache_size=SIZE
  Status (*apply)(const OptionArg& arg, MountOptions* out);
  // One paragraph; the help wraps it. Empty for the options passed to the
  // kernel mount, which the help lists together.
  std::string_view help;
  // The default, as the option would spell it, read from a default
  // MountOptions (so that the help cannot drift from the code); nullptr
  // where the help text says it.
  std::string (*show_default)(const MountOptions& defaults) = nullptr;
};

std::span<const MountOptionSpec> MountOptionTable();
// The -o options, one entry each, for --help.
std::string MountOptionsHelp();
// Parses a comma-separated -o list into `out`. Unknown options are an error.
Status ParseMountOptions(const std::string& list, MountOptions* out);
// Parses "64M", "1G", "4096". Suffixes K/M/G/T are powers of 1024.
Result<uint64_t> ParseSize(const std::string& text);

}  // namespace ckptfs
