#include "mount-tools/mount_options.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>

#include "base/log.h"
#include "codec/lossy/policy.h"
#include "seal/seal_planner.h"

namespace ckptfs {
namespace {

// The most workers one seal may use (-o seal_workers).
constexpr unsigned kMaxSealWorkers = 64;

using Takes = MountOptionSpec::Takes;

// --- value parsers: each error names the option and what it accepts ---

Result<long> IntIn(const OptionArg& a, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(a.value.c_str(), &end, 10);
  if (a.value.empty() || *end != '\0' || errno != 0 || n < lo || n > hi)
    return Status::InvalidArgument("option " + a.key + "=" + a.value + ": expected an integer in [" +
                                   std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return n;
}

Result<double> Seconds(const OptionArg& a) {
  char* end = nullptr;
  const double d = std::strtod(a.value.c_str(), &end);
  if (a.value.empty() || *end != '\0' || d < 0)
    return Status::InvalidArgument("option " + a.key + "=" + a.value + ": expected seconds >= 0");
  return d;
}

Result<uint64_t> Size(const OptionArg& a) {
  auto n = ParseSize(a.value);
  if (!n.ok()) return n.status().WithContext("option " + a.key);
  return n;
}

// A size within [lo, hi]; a power of two too if `pow2`. `rule` says which.
Result<uint64_t> SizeIn(const OptionArg& a, uint64_t lo, uint64_t hi, bool pow2, const std::string& rule) {
  ASSIGN_OR_RETURN(uint64_t n, Size(a));
  if (n < lo || n > hi || (pow2 && (n & (n - 1)) != 0))
    return Status::InvalidArgument("option " + a.key + "=" + a.value + ": " + rule);
  return n;
}

// "0" or "1"; `choices` says what each means.
Result<bool> ZeroOrOne(const OptionArg& a, const std::string& choices) {
  if (a.value != "0" && a.value != "1")
    return Status::InvalidArgument("option " + a.key + "=" + a.value + ": use " + choices);
  return a.value == "1";
}

// Stores a parsed value in `field`, whose type may be narrower: the
// parsers have checked the range.
template <typename T, typename Field>
Status Into(Result<T> parsed, Field* field) {
  if (!parsed.ok()) return parsed.status();
  *field = static_cast<Field>(*parsed);
  return Status::Ok();
}

// --- how the help shows a default ---

std::string ShowSize(uint64_t n) {
  static const char kUnits[] = "KMGT";
  std::string unit;
  for (int i = 0; i < 4 && n >= 1024 && n % 1024 == 0; ++i) {
    n /= 1024;
    unit = kUnits[i];
  }
  return std::to_string(n) + unit;
}

std::string ShowNumber(double d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", d);
  return buf;
}

std::string ShowBool(bool b) { return b ? "1" : "0"; }

// --- the setters ---

Status PassToKernel(const OptionArg& a, MountOptions* o) {
  o->fuse.kernel_opts.push_back(a.key);
  return Status::Ok();
}

Status SetLossy(const OptionArg& a, MountOptions* o) {
  ASSIGN_OR_RETURN(LossyPolicy policy, ParseLossyPolicy(a.text));
  o->store.lossy = policy.fidelity;
  o->store.lossy_steps = policy.step_budget;
  return Status::Ok();
}

Status SetLogLevel(const OptionArg& a, MountOptions* o) {
  if (spdlog::level::from_str(a.value) == spdlog::level::off && a.value != "off")
    return Status::InvalidArgument("option log_level=" + a.value + ": use trace, debug, info, warn, error or off");
  o->log_level = a.value;
  return Status::Ok();
}

Status SetNodeName(const OptionArg& a, MountOptions* o) {
  const bool ok = !a.value.empty() && a.value.size() <= 64 &&
                  std::all_of(a.value.begin(), a.value.end(), [](char c) {
                    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
                  });
  if (!ok) return Status::InvalidArgument("option node=" + a.value + ": use 1 to 64 of A-Z a-z 0-9 . _ -");
  o->store.cluster.node = a.value;
  return Status::Ok();
}

Result<std::string> AbsolutePath(const OptionArg& a) {
  if (a.value.empty() || a.value[0] != '/') {
    return Status::InvalidArgument("option " + a.key + "=" + a.value + ": give an absolute path");
  }
  return a.value;
}

Result<std::string> PackLocation(const OptionArg& a) {
  if (a.value == "dir") return a.value;
  if (a.value.rfind("rados:", 0) == 0 && a.value.size() > 6) return a.value;
  return Status::InvalidArgument("option packs=" + a.value + ": use dir or rados:POOL");
}

Status SetMetrics(const OptionArg& a, MountOptions* o) {
  const bool allow_remote = o->metrics.allow_remote;
  Result<MetricsAddress> addr = ParseMetricsAddress(a.value);
  if (!addr.ok()) return addr.status().WithContext("option metrics=" + a.value);
  o->metrics = *addr;
  o->metrics.allow_remote = allow_remote;
  return Status::Ok();
}

// Kernel mount options: they take no value, and the help lists them together.
constexpr MountOptionSpec Kernel(std::string_view name) { return {name, Takes::kNoValue, "", PassToKernel, ""}; }

const MountOptionSpec kTable[] = {
    {"cache_size", Takes::kValue, "SIZE",
     [](const OptionArg& a, MountOptions* o) { return Into(Size(a), &o->fuse.fs.cache_bytes); },
     "decoded-chunk cache limit", [](const MountOptions& d) { return ShowSize(d.fuse.fs.cache_bytes); }},
    {"decode_threads", Takes::kValue, "N",
     [](const OptionArg& a, MountOptions* o) { return Into(IntIn(a, 0, 256), &o->fuse.fs.decode_threads); },
     "threads decoding chunks ahead of sequential readers, within half the cache, 0..256 (0: none; default: one "
     "per core)"},
    {"chunk_size", Takes::kValue, "SIZE",
     [](const OptionArg& a, MountOptions* o) {
       return Into(SizeIn(a, 4096, 256u << 20, true, "must be a power of two from 4K to 256M"), &o->store.chunk_size);
     },
     "chunk size for new packs, a power of two from 4K to 256M",
     [](const MountOptions& d) { return ShowSize(d.store.chunk_size); }},
    {"zstd_level", Takes::kValue, "N",
     [](const OptionArg& a, MountOptions* o) { return Into(IntIn(a, -7, 22), &o->store.encoder.zstd_level); },
     "zstd level for new packs, -7..22",
     [](const MountOptions& d) { return std::to_string(d.store.encoder.zstd_level); }},
    {"tensor_codec", Takes::kValue, "0|1",
     [](const OptionArg& a, MountOptions* o) {
       return Into(ZeroOrOne(a, "1 (tensor-aware coding of recognised checkpoint files) or 0 (zstd only)"),
                   &o->store.encoder.tensor_codec);
     },
     "1: code the tensors of recognised checkpoint formats by element type (lossless); 0: zstd only",
     [](const MountOptions& d) { return ShowBool(d.store.encoder.tensor_codec); }},
    {"delta", Takes::kValue, "0|1",
     [](const OptionArg& a, MountOptions* o) {
       return Into(ZeroOrOne(a,
                             "1 (store checkpoints against their predecessor and shared chunks once) or 0 (every file "
                             "on its own)"),
                   &o->store.delta);
     },
     "1: store each checkpoint as a delta against its predecessor and identical chunks once",
     [](const MountOptions& d) { return ShowBool(d.store.delta); }},
    {"direct_reads", Takes::kValue, "0|1",
     [](const OptionArg& a, MountOptions* o) {
       return Into(ZeroOrOne(a, "1 (read packs with O_DIRECT) or 0 (through the page cache)"),
                   &o->store.direct_pack_reads);
     },
     "1: read the chunks of packs with O_DIRECT where the backing file system allows it; 0: through the page cache",
     [](const MountOptions& d) { return ShowBool(d.store.direct_pack_reads); }},
    {"keyframe_every", Takes::kValue, "K",
     [](const OptionArg& a, MountOptions* o) { return Into(IntIn(a, 0, 64), &o->store.keyframe_every); },
     "longest delta chain, 0..64; 0: dedup only",
     [](const MountOptions& d) { return std::to_string(d.store.keyframe_every); }},
    {"lossy", Takes::kOptionalValue, "[=safe|aggressive|steps:C|FIDELITY]", SetLossy,
     "quantize the float parameters and optimizer moments of model and checkpoint files (opt-in, whole mount; "
     "safe, the default, keeps each restored checkpoint's weights within three optimizer steps' Fisher energy "
     "(Adam's state in the file; else 1% relative error), which stayed within +1% final validation loss on "
     "every run of docs/LOSSY.md's panel; aggressive: 6 steps, else 3%; steps:C: C steps; a number FIDELITY "
     "bounds only the weights' relative L2 error, not the loss): in torch.save files the tensors the pickle proves a module state_dict's or an "
     "optimizer state_dict's (never by their names), safetensors, GGUF and DCP. NumPy files (.npy, .npz), data "
     "tensors (inputs, targets, "
     "features...) and buffers (running_mean, running_var...) stay exact. A directory's user.ckptfs.policy xattr "
     "(lossless|lossy[=F][,scope=S]) overrides it for its subtree. Lossy files carry read-only "
     "user.ckptfs.lossy.* xattrs (fidelity, errors); see docs/SEMANTICS.md"},
    {"lossy_scope", Takes::kValue, "models|all",
     [](const OptionArg& a, MountOptions* o) { return Into(ParseLossyScope(a.value), &o->store.lossy_scope); },
     "what lossy may touch: models (the default, above) or all (every float tensor, NumPy arrays and data too)"},
    // Takes a value only to reject it in ParseLossyPolicy's words.
    {"lossless", Takes::kOptionalValue, "", SetLossy, "the default: every byte reads back as written"},
    {"lossy_keyframe_every", Takes::kValue, "K",
     // Reads decode a chain through nested base reads, which stop at 64 levels.
     [](const OptionArg& a, MountOptions* o) { return Into(IntIn(a, 0, 64), &o->store.lossy_keyframe_every); },
     "longest chain of lossy chunks, 0..64",
     [](const MountOptions& d) { return std::to_string(d.store.lossy_keyframe_every); }},
    {"cluster", Takes::kNoValue, "",
     [](const OptionArg&, MountOptions* o) {
       o->store.cluster.enabled = true;
       return Status::Ok();
     },
     "serve a store shared by several nodes' daemons (CephFS, Lustre, NFS, GPFS); the store is recorded as "
     "shared, and every later mount of it is in cluster mode. See docs/SEMANTICS.md, \"Cluster mode\""},
    {"node", Takes::kValue, "NAME", SetNodeName,
     "this node's name among the store's daemons, [A-Za-z0-9._-], up to 64 characters (default: the host name)"},
    {"staging", Takes::kValue, "DIR",
     [](const OptionArg& a, MountOptions* o) { return Into(AbsolutePath(a), &o->store.cluster.staging_dir); },
     "node-local directory for files being written (default: the store's staging/; for a shared store "
     "/var/tmp/ckptfs/<store hash>/<node>)"},
    {"lease", Takes::kValue, "SEC",
     [](const OptionArg& a, MountOptions* o) { return Into(IntIn(a, 1, 3600), &o->store.cluster.lease_seconds); },
     "cluster membership lease, 1..3600 s: a node silent for longer is dead and others collect what it left",
     [](const MountOptions& d) { return std::to_string(d.store.cluster.lease_seconds); }},
    {"gc_grace", Takes::kValue, "SEC",
     [](const OptionArg& a, MountOptions* o) {
       return Into(IntIn(a, 0, 30 * 86400), &o->store.cluster.gc_grace_seconds);
     },
     "cluster GC deletes a pack only after it has been unreferenced this long",
     [](const MountOptions& d) { return std::to_string(d.store.cluster.gc_grace_seconds); }},
    {"gc_interval", Takes::kValue, "SEC",
     [](const OptionArg& a, MountOptions* o) {
       return Into(IntIn(a, 0, 30 * 86400), &o->store.cluster.gc_interval_seconds);
     },
     "run cluster GC from this daemon this often (0: never; `ckptfs gc` does)",
     [](const MountOptions& d) { return std::to_string(d.store.cluster.gc_interval_seconds); }},
    {"seal_hold", Takes::kValue, "PATH",
     [](const OptionArg& a, MountOptions* o) { return Into(AbsolutePath(a), &o->store.seal_hold); },
     "a testing aid: each seal, once it has pinned its bases and coded its pack, waits while PATH exists before "
     "it publishes (to run cluster GC against a seal in flight)"},
    {"packs", Takes::kValue, "dir|rados:POOL",
     [](const OptionArg& a, MountOptions* o) { return Into(PackLocation(a), &o->store.cluster.packs); },
     "where packs live: dir (the store directory) or rados:POOL (a RADOS pool through librados; the namespace "
     "stays in the store directory)"},
    {"ceph_conf", Takes::kValue, "PATH",
     [](const OptionArg& a, MountOptions* o) { return Into(AbsolutePath(a), &o->store.cluster.ceph_conf); },
     "Ceph configuration for packs=rados:POOL",
     [](const MountOptions& d) { return d.store.cluster.ceph_conf; }},
    {"seal_threads", Takes::kValue, "N",
     [](const OptionArg& a, MountOptions* o) { return Into(IntIn(a, 1, 64), &o->fuse.fs.seal_threads); },
     "background sealing threads, 1..64, which take turns between the files' owners; one more thread seals "
     "small files only (at most 64 MiB of data), so they never wait for another owner's big seal", [](const MountOptions& d) { return std::to_string(d.fuse.fs.seal_threads); }},
    {"seal_workers", Takes::kValue, "N",
     [](const OptionArg& a, MountOptions* o) { return Into(IntIn(a, 1, kMaxSealWorkers), &o->store.seal_workers); },
     "threads coding one file's chunks as it seals, 1..64; each holds about 5 chunks, and under a lossy policy "
     "about 6 more chunks' worth of per-element state (default: every core, up to 64)"},
    {"max_fds", Takes::kValue, "N",
     [](const OptionArg& a, MountOptions* o) { return Into(IntIn(a, 64, 1L << 30), &o->fuse.fs.max_fds); },
     "file descriptors the daemon may hold, at least 64: those of idle files stay within N minus a reserve "
     "(N/2, at most 256) and are reopened on demand, however many files the kernel caches (default: the soft "
     "RLIMIT_NOFILE, raised to the hard limit at start, less an eighth)"},
    {"max_threads", Takes::kValue, "N",
     [](const OptionArg& a, MountOptions* o) { return Into(IntIn(a, 1, 256), &o->fuse.max_threads); },
     "FUSE worker threads, 1..256", [](const MountOptions& d) { return std::to_string(d.fuse.max_threads); }},
    {"device", Takes::kValue, "auto|cpu|gpu",
     [](const OptionArg& a, MountOptions* o) { return Into(ParseDeviceRequest(a.value), &o->device); },
     "where sealing runs the codec's data-parallel steps: auto takes a GPU when one is visible and faster than "
     "the CPU for a chunk, gpu always does and refuses to mount without one. Stored bytes are the same on every "
     "device",
     [](const MountOptions& d) { return std::string(DeviceRequestName(d.device)); }},
    {"gpu_mem", Takes::kValue, "SIZE",
     [](const OptionArg& a, MountOptions* o) {
       return Into(SizeIn(a, 4u << 20, UINT64_MAX, false, "at least 4M"), &o->cuda.memory_bytes);
     },
     "GPU memory, and as much pinned host memory, the encoder may hold; at least 4M",
     [](const MountOptions& d) { return ShowSize(d.cuda.memory_bytes); }},
    {"read_ahead", Takes::kValue, "SIZE",
     [](const OptionArg& a, MountOptions* o) { return Into(Size(a), &o->fuse.read_ahead); },
     "kernel readahead for the mount", [](const MountOptions& d) { return ShowSize(d.fuse.read_ahead); }},
    {"attr_timeout", Takes::kValue, "SEC",
     [](const OptionArg& a, MountOptions* o) { return Into(Seconds(a), &o->fuse.fs.attr_timeout); },
     "kernel attribute cache time", [](const MountOptions& d) { return ShowNumber(d.fuse.fs.attr_timeout); }},
    {"entry_timeout", Takes::kValue, "SEC",
     [](const OptionArg& a, MountOptions* o) { return Into(Seconds(a), &o->fuse.fs.entry_timeout); },
     "kernel name cache time", [](const MountOptions& d) { return ShowNumber(d.fuse.fs.entry_timeout); }},
    {"log", Takes::kValue, "PATH",
     [](const OptionArg& a, MountOptions* o) {
       o->log_path = a.value;
       return Status::Ok();
     },
     "daemon log (default BACKING/ckptfs.log). Opened without following a symlink; a file already there must "
     "be a regular file of the daemon's user that no one else may write, or the mount is refused"},
    {"log_max", Takes::kValue, "SIZE",
     [](const OptionArg& a, MountOptions* o) {
       const uint64_t max = std::numeric_limits<uint64_t>::max();
       if (a.value == "0") return Into(Result<uint64_t>(0), &o->log_file.max_bytes);
       return Into(SizeIn(a, 4096, max, false, "0 (never rotate) or at least 4K"), &o->log_file.max_bytes);
     },
     "size at which the log file rotates (PATH becomes PATH.1, PATH.1 PATH.2, the oldest goes); 0: never, as "
     "when logrotate does it",
     [](const MountOptions& d) { return ShowSize(d.log_file.max_bytes); }},
    {"log_level", Takes::kValue, "LEVEL", SetLogLevel, "trace|debug|info|warn|error|off",
     [](const MountOptions& d) { return d.log_level; }},
    {"metrics", Takes::kValue, "[HOST:]PORT", SetMetrics,
     "serve the daemon's figures (bytes, seal queue, throughput, cache, errors, lossy error) in the Prometheus "
     "text format at http://HOST:PORT/metrics; HOST defaults to 127.0.0.1, and one other than loopback needs "
     "metrics_remote too, since the endpoint has no authentication. `ckptfs top` shows the same without it"},
    {"metrics_remote", Takes::kNoValue, "",
     [](const OptionArg&, MountOptions* o) {
       o->metrics.allow_remote = true;
       return Status::Ok();
     },
     "let metrics= listen on an address other than loopback (0.0.0.0, a LAN address): anyone who reaches it "
     "reads the store's sizes and activity"},
    {"max_write", Takes::kValue, "SIZE",
     [](const OptionArg& a, MountOptions* o) {
       return Into(SizeIn(a, 4096, 1u << 20, false, "from 4K to 1M"), &o->fuse.fs.max_write);
     },
     "largest FUSE write request, 4K..1M", [](const MountOptions& d) { return ShowSize(d.fuse.fs.max_write); }},
    {"writeback", Takes::kNoValue, "",
     [](const OptionArg&, MountOptions* o) {
       o->fuse.fs.writeback_cache = true;
       return Status::Ok();
     },
     "kernel writeback cache (faster small writes)"},
    {"debug", Takes::kNoValue, "",
     [](const OptionArg&, MountOptions* o) {
       o->fuse.debug = true;
       o->foreground = true;  // libfuse traces to stderr
       return Status::Ok();
     },
     "libfuse request tracing (implies -f)"},
    {"nonempty", Takes::kNoValue, "",
     [](const OptionArg&, MountOptions* o) {
       o->nonempty = true;
       return Status::Ok();
     },
     "mount over a directory that is not empty (its files are hidden until the unmount); without it such a mount "
     "point is refused"},
    Kernel("allow_other"),
    Kernel("allow_root"),
    Kernel("default_permissions"),
    Kernel("ro"),
    Kernel("rw"),
    Kernel("nosuid"),
    Kernel("suid"),
    Kernel("nodev"),
    Kernel("dev"),
    Kernel("noexec"),
    Kernel("exec"),
    Kernel("noatime"),
};

const MountOptionSpec* FindOption(std::string_view name) {
  for (const MountOptionSpec& spec : kTable)
    if (spec.name == name) return &spec;
  return nullptr;
}

// Applies one "key" or "key=value" option.
Status ApplyOption(const std::string& text, MountOptions* out) {
  const size_t eq = text.find('=');
  const bool has_value = eq != std::string::npos;
  const OptionArg arg{text, text.substr(0, eq), has_value ? text.substr(eq + 1) : ""};
  const MountOptionSpec* spec = FindOption(arg.key);
  if (spec == nullptr || (has_value && spec->takes == Takes::kNoValue))
    return Status::InvalidArgument("unknown mount option '" + text + "' (see ckptfs mount --help)");
  if (!has_value && spec->takes == Takes::kValue)
    return Status::InvalidArgument("option " + arg.key + " needs a value (" + arg.key + "=...)");
  return spec->apply(arg, out);
}

constexpr size_t kHelpIndent = 22;  // where the descriptions start
constexpr size_t kHelpWidth = 80;
constexpr char kNoBreak = '\x1f';  // a space Paragraph does not break a line at

// `text` wrapped at word boundaries into lines that start at `indent`, the
// first after `lead` (or on a line of its own when `lead` reaches `indent`).
std::string Paragraph(const std::string& lead, const std::string& text, size_t indent = kHelpIndent) {
  std::string out = lead;
  size_t col = lead.size();
  if (col >= indent) {
    out += "\n";
    col = 0;
  }
  bool line_start = true;
  for (size_t i = 0; i < text.size();) {
    const size_t end = std::min(text.find(' ', i), text.size());
    std::string word = text.substr(i, end - i);
    std::replace(word.begin(), word.end(), kNoBreak, ' ');
    i = end + 1;
    if (!line_start && col + 1 + word.size() > kHelpWidth) {
      out += "\n";
      col = 0;
      line_start = true;
    }
    out += line_start ? std::string(indent - col, ' ') : " ";
    col += line_start ? indent - col : 1;
    out += word;
    col += word.size();
    line_start = false;
  }
  return out + "\n";
}

std::string HelpEntry(const MountOptionSpec& spec, const MountOptions& defaults) {
  std::string lead = "  " + std::string(spec.name);
  if (spec.takes == Takes::kValue) lead += "=";
  lead += spec.value_name;
  std::string text(spec.help);
  if (spec.show_default != nullptr) text += std::string(" (default") + kNoBreak + spec.show_default(defaults) + ")";
  return Paragraph(lead, text);
}

}  // namespace

StoreOptions DaemonStoreOptions() {
  StoreOptions so;
  so.planner = &FormatSealPlanner();
  so.background_gc = true;
  // Every core: a seal is CPU-bound and scales with its workers
  // (bench/bench_seal.py), and a reader may be waiting for it.
  so.seal_workers = std::clamp(std::thread::hardware_concurrency(), 1u, kMaxSealWorkers);
  return so;
}

std::span<const MountOptionSpec> MountOptionTable() { return kTable; }

std::string MountOptionsHelp() {
  const MountOptions defaults;
  std::string out = "Mount options (-o, comma-separated):\n";
  std::string kernel;
  for (const MountOptionSpec& spec : kTable) {
    if (spec.apply == PassToKernel)
      kernel += (kernel.empty() ? "" : ", ") + std::string(spec.name);
    else
      out += HelpEntry(spec, defaults);
  }
  return out + Paragraph("",
                         kernel +
                             ": passed to the kernel mount. allow_other turns on default_permissions, so "
                             "the kernel checks access.",
                         2);
}

Result<uint64_t> ParseSize(const std::string& text) {
  if (text.empty()) return Status::InvalidArgument("empty size");
  char* end = nullptr;
  errno = 0;
  unsigned long long n = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str() || errno != 0) return Status::InvalidArgument("bad size '" + text + "'");
  std::string suffix(end);
  uint64_t mult = 1;
  if (suffix == "" || suffix == "B")
    mult = 1;
  else if (suffix == "K" || suffix == "k" || suffix == "KiB")
    mult = 1ull << 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB")
    mult = 1ull << 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB")
    mult = 1ull << 30;
  else if (suffix == "T" || suffix == "t" || suffix == "TiB")
    mult = 1ull << 40;
  else
    return Status::InvalidArgument("bad size '" + text + "': use a number with K, M, G or T");
  return static_cast<uint64_t>(n) * mult;
}

bool MetricsAddress::loopback() const {
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return ::inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

std::string MetricsAddress::ToString() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<MetricsAddress> ParseMetricsAddress(const std::string& text) {
  MetricsAddress a;
  std::string port = text;
  a.host = "127.0.0.1";
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find("]:");
    if (close == std::string::npos) return Status::InvalidArgument("write an IPv6 address as [ADDR]:PORT");
    a.host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else if (const size_t colon = text.rfind(':'); colon != std::string::npos) {
    a.host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (a.host == "localhost") a.host = "127.0.0.1";
  in_addr v4{};
  in6_addr v6{};
  if (::inet_pton(AF_INET, a.host.c_str(), &v4) != 1 && ::inet_pton(AF_INET6, a.host.c_str(), &v6) != 1)
    return Status::InvalidArgument("'" + a.host + "' is not an IP address (use e.g. 127.0.0.1:9464 or [::1]:9464)");
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || errno != 0 || n < 1 || n > 65535)
    return Status::InvalidArgument("expected [HOST:]PORT with a port from 1 to 65535");
  a.port = static_cast<uint16_t>(n);
  return a;
}

Status ParseMountOptions(const std::string& list, MountOptions* out) {
  std::string cur;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i == list.size() || list[i] == ',') {
      if (!cur.empty()) RETURN_IF_ERROR(ApplyOption(cur, out));
      cur.clear();
    } else {
      cur.push_back(list[i]);
    }
  }
  return Status::Ok();
}

}  // namespace ckptfs
