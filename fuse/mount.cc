#include "fuse/mount.h"

#include <dirent.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "base/log.h"
#include "gpu/device_select.h"
#include "store/lossy_policy.h"
#include "store/private_store.h"

namespace ckptfs {
namespace {

const char* const kKernelOpts[] = {
    "allow_other", "allow_root", "default_permissions", "ro", "rw", "nosuid", "suid", "nodev", "dev", "noexec",
    "exec",        "noatime"};

bool IsKernelOpt(const std::string& key) {
  for (const char* k : kKernelOpts)
    if (key == k) return true;
  return false;
}

Result<long> ParseInt(const std::string& key, const std::string& v, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || n < lo || n > hi)
    return Status::InvalidArgument("option " + key + "=" + v + ": expected an integer in [" + std::to_string(lo) +
                                   ", " + std::to_string(hi) + "]");
  return n;
}

Result<double> ParseSeconds(const std::string& key, const std::string& v) {
  char* end = nullptr;
  double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || d < 0)
    return Status::InvalidArgument("option " + key + "=" + v + ": expected seconds >= 0");
  return d;
}

Result<uint64_t> ParseSizeOption(const std::string& key, const std::string& v) {
  auto n = ParseSize(v);
  if (!n.ok()) return n.status().WithContext("option " + key);
  return n;
}

// Forks into the background. The parent waits until the child reports on
// the returned pipe (StartedDaemon), so `ckptfs mount` returns only once
// the daemon serves and LOCK names it; if the child dies first, it fails.
Result<UniqueFd> Daemonize() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno("pipe");
  const pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno("fork");
  if (pid > 0) {
    ::close(fds[1]);
    char ok = 1;
    const ssize_t n = ::read(fds[0], &ok, 1);
    ::_exit(n == 1 && ok == 0 ? 0 : 1);
  }
  ::close(fds[0]);
  ::setsid();
  if (::chdir("/") != 0) return Status::FromErrno("chdir /");
  const int null = ::open("/dev/null", O_RDWR);
  if (null >= 0) {
    ::dup2(null, 0);
    ::dup2(null, 1);
    ::dup2(null, 2);
    if (null > 2) ::close(null);
  }
  return UniqueFd(fds[1]);
}

// Chooses the compute device in a short-lived child; an error says why
// device=gpu cannot be had. The daemon forks later, and a CUDA context does
// not survive a fork: so the parent never initialises CUDA, yet an
// impossible device=gpu still fails here, on the user's terminal.
Status ProbeDevice(DeviceRequest request, const gpu::CudaOptions& cuda) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno("pipe");
  UniqueFd rd(fds[0]), wr(fds[1]);
  const pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno("fork");
  if (pid == 0) {
    Result<gpu::DeviceChoice> c = gpu::ChooseDevice(request, cuda);
    const std::string msg = c.ok() ? "+" : "-" + c.status().message();
    (void)!::write(wr.get(), msg.data(), msg.size());
    ::_exit(0);
  }
  wr.reset();
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = ::read(rd.get(), buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    msg.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (msg.empty()) return Status::Error(EIO, "the device probe exited without an answer");
  if (msg[0] == '-') return Status::Error(ENODEV, msg.substr(1));
  return Status::Ok();
}

// Opens the device for this process (after any fork) and hands it to the
// store. A device=gpu that the probe found but that fails now falls back to
// the CPU with an error in the log: the mount is already up.
void UseDevice(Store* store, DeviceRequest request, const gpu::CudaOptions& cuda) {
  Result<gpu::DeviceChoice> c = gpu::ChooseDevice(request, cuda);
  if (!c.ok()) {
    spdlog::error("{}; sealing runs on the CPU", c.status().message());
    c = gpu::ChooseDevice(DeviceRequest::kCpu, cuda);
  }
  spdlog::info("{}", c->why);
  store->SetComputeDevice(c->device);
}

void ReportStarted(const UniqueFd& pipe) {
  if (!pipe.valid()) return;
  const char ok = 0;
  (void)!::write(pipe.get(), &ok, 1);
}

// FUSE's INIT can only lower readahead; the mount's bdi sets the window.
void SetReadAhead(const std::string& mountpoint, uint64_t bytes) {
  for (const MountEntry& m : ReadMounts()) {
    if (m.mountpoint != mountpoint || m.fstype != "fuse.ckptfs") continue;
    std::ofstream out("/sys/class/bdi/" + m.dev + "/read_ahead_kb");
    out << bytes / 1024;
    if (!out) spdlog::warn("could not set readahead of {} ({}) to {} KiB", mountpoint, m.dev, bytes / 1024);
  }
}

// Applies one "key" or "key=value" option.
Status ApplyOption(const std::string& opt, MountOptions* out) {
  const size_t eq = opt.find('=');
  const std::string key = opt.substr(0, eq);
  const std::string val = eq == std::string::npos ? "" : opt.substr(eq + 1);
  const bool has_val = eq != std::string::npos;
  auto need_val = [&]() -> Status {
    return has_val ? Status::Ok() : Status::InvalidArgument("option " + key + " needs a value (" + key + "=...)");
  };
  if (IsKernelOpt(key) && !has_val) {
    out->kernel_opts.push_back(key);
    return Status::Ok();
  }
  if (key == "cache_size") {
    RETURN_IF_ERROR(need_val());
    ASSIGN_OR_RETURN(out->fs.cache_bytes, ParseSizeOption(key, val));
  } else if (key == "chunk_size") {
    RETURN_IF_ERROR(need_val());
    ASSIGN_OR_RETURN(uint64_t cs, ParseSizeOption(key, val));
    if (cs < 4096 || cs > (256u << 20) || (cs & (cs - 1)) != 0)
      return Status::InvalidArgument("option chunk_size=" + val + ": must be a power of two from 4K to 256M");
    out->chunk_size = static_cast<uint32_t>(cs);
  } else if (key == "zstd_level") {
    RETURN_IF_ERROR(need_val());
    ASSIGN_OR_RETURN(long n, ParseInt(key, val, -7, 22));
    out->zstd_level = static_cast<int>(n);
  } else if (key == "tensor_codec") {
    RETURN_IF_ERROR(need_val());
    if (val != "0" && val != "1")
      return Status::InvalidArgument("option tensor_codec=" + val +
                                     ": use 1 (tensor-aware coding of recognised checkpoint files) or 0 (zstd only)");
    out->tensor_codec = val == "1";
  } else if (key == "delta") {
    RETURN_IF_ERROR(need_val());
    if (val != "0" && val != "1")
      return Status::InvalidArgument("option delta=" + val +
                                     ": use 1 (store checkpoints against their predecessor and shared chunks "
                                     "once) or 0 (every file on its own)");
    out->delta = val == "1";
  } else if (key == "keyframe_every") {
    RETURN_IF_ERROR(need_val());
    ASSIGN_OR_RETURN(long n, ParseInt(key, val, 0, 64));
    out->keyframe_every = static_cast<uint32_t>(n);
  } else if (key == "lossy" || key == "lossless") {
    ASSIGN_OR_RETURN(LossyPolicy policy, ParseLossyPolicy(opt));
    out->lossy = policy.fidelity;
  } else if (key == "lossy_scope") {
    RETURN_IF_ERROR(need_val());
    ASSIGN_OR_RETURN(out->lossy_scope, ParseLossyScope(val));
  } else if (key == "lossy_keyframe_every") {
    RETURN_IF_ERROR(need_val());
    // Reads decode a chain through nested base reads, which stop at 64 levels.
    ASSIGN_OR_RETURN(long n, ParseInt(key, val, 0, 64));
    out->lossy_keyframe_every = static_cast<uint32_t>(n);
  } else if (key == "seal_threads") {
    RETURN_IF_ERROR(need_val());
    ASSIGN_OR_RETURN(long n, ParseInt(key, val, 1, 64));
    out->fs.seal_threads = static_cast<int>(n);
  } else if (key == "seal_workers") {
    RETURN_IF_ERROR(need_val());
    ASSIGN_OR_RETURN(long n, ParseInt(key, val, 1, 64));
    out->seal_workers = static_cast<unsigned>(n);
  } else if (key == "max_threads") {
    RETURN_IF_ERROR(need_val());
    ASSIGN_OR_RETURN(long n, ParseInt(key, val, 1, 256));
    out->max_threads = static_cast<int>(n);
  } else if (key == "device") {
    RETURN_IF_ERROR(need_val());
    ASSIGN_OR_RETURN(out->device, ParseDeviceRequest(val));
  } else if (key == "gpu_mem") {
    RETURN_IF_ERROR(need_val());
    ASSIGN_OR_RETURN(out->gpu_mem, ParseSizeOption(key, val));
    if (out->gpu_mem < (4u << 20)) return Status::InvalidArgument("option gpu_mem=" + val + ": at least 4M");
  } else if (key == "attr_timeout") {
    RETURN_IF_ERROR(need_val());
    ASSIGN_OR_RETURN(out->fs.attr_timeout, ParseSeconds(key, val));
  } else if (key == "entry_timeout") {
    RETURN_IF_ERROR(need_val());
    ASSIGN_OR_RETURN(out->fs.entry_timeout, ParseSeconds(key, val));
  } else if (key == "log") {
    RETURN_IF_ERROR(need_val());
    out->log_path = val;
  } else if (key == "log_level") {
    RETURN_IF_ERROR(need_val());
    if (spdlog::level::from_str(val) == spdlog::level::off && val != "off")
      return Status::InvalidArgument("option log_level=" + val + ": use trace, debug, info, warn, error or off");
    out->log_level = val;
  } else if (key == "read_ahead") {
    RETURN_IF_ERROR(need_val());
    ASSIGN_OR_RETURN(out->read_ahead, ParseSizeOption(key, val));
  } else if (key == "max_write") {
    RETURN_IF_ERROR(need_val());
    ASSIGN_OR_RETURN(uint64_t mw, ParseSizeOption(key, val));
    if (mw < 4096 || mw > (1u << 20)) return Status::InvalidArgument("option max_write=" + val + ": from 4K to 1M");
    out->fs.max_write = static_cast<uint32_t>(mw);
  } else if (key == "writeback" && !has_val) {
    out->fs.writeback_cache = true;
  } else if (key == "nonempty" && !has_val) {
    out->nonempty = true;
  } else if (key == "debug" && !has_val) {
    out->debug_fuse = true;
  } else {
    return Status::InvalidArgument("unknown mount option '" + opt + "' (see ckptfs mount --help)");
  }
  return Status::Ok();
}

std::string Unescape(const std::string& s) {  // mountinfo escapes space, tab, \n, \ as \ooo
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      out.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8)));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// Escapes a value for libfuse's -o parser (commas and backslashes).
std::string EscapeOpt(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ',' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

void RaiseFdLimit() {
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
}

void LogRecovery(const RecoveryReport& r, bool to_stderr) {
  spdlog::info(
      "recovery: scanned {} files, resealed {}, removed {} temporary, {} orphan packs, {} orphan staging; {} broken",
      r.stubs_scanned, r.staged_resealed, r.tmp_files_removed, r.orphan_packs_removed, r.orphan_staging_removed,
      r.broken_stubs);
  if (to_stderr)
    for (const auto& a : r.actions) std::cerr << "ckptfs: recovery: " << a << "\n";
  // Mounting goes on (every readable file is served), but the user must hear
  // of it: the mount's own terminal, even when the daemon goes to the
  // background.
  if (!r.swept()) {
    if (!to_stderr)
      for (const auto& u : r.unreadable) std::cerr << "ckptfs: recovery: cannot read " << u << "\n";
    std::cerr << "ckptfs: warning: " << r.unreadable.size()
              << " object(s) in the store could not be read; nothing was deleted, and no pack will be until "
                 "they are repaired (run `ckptfs fsck`)\n";
  }
}

int Fail(const std::string& msg) {
  std::cerr << "ckptfs mount: " << msg << "\n";
  return 1;
}

}  // namespace

std::string MountOptionsHelp() {
  return "Mount options (-o, comma-separated):\n"
         "  cache_size=SIZE     decoded-chunk cache limit (default 128M)\n"
         "  chunk_size=SIZE     chunk size for new packs, power of two (default 4M)\n"
         "  zstd_level=N        zstd level for new packs (default 3)\n"
         "  tensor_codec=0|1    1: code the tensors of recognised checkpoint formats\n"
         "                      by element type (lossless); 0: zstd only (default 1)\n"
         "  delta=0|1           1: store each checkpoint as a delta against its\n"
         "                      predecessor and identical chunks once (default 1)\n"
         "  keyframe_every=K    longest delta chain, 0..64; 0: dedup only (default 8)\n"
         "  lossy[=FIDELITY]    quantize the float parameters and optimizer moments\n"
         "                      of model and checkpoint files (opt-in, whole mount;\n"
         "                      FIDELITY: relative error of weights, default 0.01):\n"
         "                      torch.save files holding a module state_dict or an\n"
         "                      optimizer state_dict, safetensors, GGUF and DCP.\n"
         "                      NumPy files (.npy, .npz), data tensors (inputs,\n"
         "                      targets, features...) and buffers (running_mean,\n"
         "                      running_var...) stay exact. A directory's\n"
         "                      user.ckptfs.policy xattr (lossless|lossy[=F][,scope=S])\n"
         "                      overrides it for its subtree. Lossy files carry\n"
         "                      read-only user.ckptfs.lossy.* xattrs (fidelity,\n"
         "                      errors); see docs/SEMANTICS.md\n"
         "  lossy_scope=models|all  what lossy may touch: models (the default, above)\n"
         "                      or all (every float tensor, NumPy arrays and data too)\n"
         "  lossless            the default: every byte reads back as written\n"
         "  lossy_keyframe_every=K  longest chain of lossy chunks, 0..64 (default 32)\n"
         "  seal_threads=N      background sealing threads (default 1)\n"
         "  seal_workers=N      threads coding one file's chunks as it seals; each\n"
         "                      holds about 5 chunks (default: half the cores, 1..4)\n"
         "  max_threads=N       FUSE worker threads (default 8)\n"
         "  device=auto|cpu|gpu where sealing runs the codec's data-parallel steps:\n"
         "                      auto takes a GPU when one is visible and faster\n"
         "                      than the CPU for a chunk (default), gpu always\n"
         "                      does and refuses to mount without one. Stored\n"
         "                      bytes are the same on every device\n"
         "  gpu_mem=SIZE        GPU memory, and as much pinned host memory, the\n"
         "                      encoder may hold (default 256M)\n"
         "  read_ahead=SIZE     kernel readahead for the mount (default 4M)\n"
         "  attr_timeout=SEC    kernel attribute cache time (default 1)\n"
         "  entry_timeout=SEC   kernel name cache time (default 1)\n"
         "  log=PATH            daemon log (default BACKING/ckptfs.log)\n"
         "  log_level=LEVEL     trace|debug|info|warn|error (default info)\n"
         "  max_write=SIZE      largest FUSE write request, 4K..1M (default 512K)\n"
         "  writeback           kernel writeback cache (faster small writes)\n"
         "  debug               libfuse request tracing (implies -f)\n"
         "  nonempty            mount over a directory that is not empty (its\n"
         "                      files are hidden until the unmount); without it\n"
         "                      such a mount point is refused\n"
         "  allow_other, allow_root, default_permissions, ro, rw, nosuid, nodev,\n"
         "  noexec, suid, dev, exec, noatime: passed to the kernel mount.\n"
         "  allow_other turns on default_permissions, so the kernel checks access.\n";
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

std::vector<MountEntry> ReadMounts() {
  std::vector<MountEntry> out;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::vector<std::string> f;
    for (std::string w; ss >> w;) f.push_back(w);
    size_t dash = 0;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (f.size() < 5 || dash + 2 >= f.size()) continue;
    out.push_back({Unescape(f[4]), Unescape(f[dash + 2]), f[dash + 1], f[2]});
  }
  return out;
}

std::optional<MountEntry> FuseMountAt(const std::string& path) {
  std::optional<MountEntry> found;
  for (MountEntry& m : ReadMounts())
    if (m.mountpoint == path && m.fstype.rfind("fuse", 0) == 0) found = std::move(m);
  return found;
}

namespace {

// The first entry of a directory other than . and .., if any.
Result<std::optional<std::string>> FirstEntry(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return Status::FromErrno("cannot list mount point " + dir);
  std::optional<std::string> first;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    first = e->d_name;
    break;
  }
  const int err = errno;
  ::closedir(d);
  if (!first && err != 0) return Status::FromErrno(err, "cannot list mount point " + dir);
  return first;
}

}  // namespace

Result<std::string> CheckMountpoint(const std::string& path, bool allow_nonempty) {
  char* real = ::realpath(path.c_str(), nullptr);
  if (real == nullptr) {
    int err = errno;
    if (err == ENOTCONN)
      return Status::Error(
          ENOTCONN,
          "mount point " + path + " is a stale FUSE mount (its daemon died); run `ckptfs umount " + path + "` first");
    if (err == ENOENT) return Status::Error(ENOENT, "mount point " + path + " does not exist; create it with mkdir");
    return Status::FromErrno(err, "mount point " + path);
  }
  std::string abs(real);
  std::free(real);
  struct stat st {};
  if (::stat(abs.c_str(), &st) != 0) {
    if (errno == ENOTCONN)
      return Status::Error(ENOTCONN,
                           "mount point " + abs + " is a stale FUSE mount; run `ckptfs umount " + abs + "` first");
    return Status::FromErrno("mount point " + abs);
  }
  if (!S_ISDIR(st.st_mode)) return Status::Error(ENOTDIR, "mount point " + abs + " is not a directory");
  if (auto m = FuseMountAt(abs))
    return Status::Error(EBUSY, "mount point " + abs + " is busy: " + m->fstype + " from " + m->source +
                                    " is already mounted there; run `ckptfs umount " + abs + "` first");
  if (!allow_nonempty) {
    ASSIGN_OR_RETURN(std::optional<std::string> entry, FirstEntry(abs));
    if (entry)
      return Status::Error(ENOTEMPTY, "mount point " + abs + " is not empty (it holds '" + *entry +
                                          "', for one); mounting would hide its files until the unmount. Use an "
                                          "empty directory, or pass -o nonempty to mount over them anyway");
  }
  return abs;
}

Result<std::string> CheckBacking(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT)
      return Status::Error(ENOENT, "backing directory " + path + " does not exist; create it (mkdir -p " + path + ")");
    return Status::FromErrno("backing directory " + path);
  }
  if (!S_ISDIR(st.st_mode)) return Status::Error(ENOTDIR, "backing path " + path + " is not a directory");
  if (::access(path.c_str(), W_OK | X_OK) != 0)
    return Status::FromErrno("backing directory " + path + " is not writable by this user");
  char* real = ::realpath(path.c_str(), nullptr);
  std::string abs(real ? real : path.c_str());
  std::free(real);
  return abs;
}

int RunMount(MountOptions opts) {
  // Before anything is created, the log included: what the daemon creates
  // for itself is private. Entries of the logical tree get the modes the
  // kernel sends (FUSE request threads run with umask 0, see ops.cc).
  ::umask(077);
  // Chunk buffers are megabytes: a fixed mmap threshold hands them back to
  // the kernel when freed, instead of glibc raising the threshold and
  // keeping freed chunks in per-thread arenas (RSS would grow past the
  // cache limit with the number of FUSE threads).
  ::mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  InitLogging("", opts.log_level);
  auto mp = CheckMountpoint(opts.mountpoint, opts.nonempty);
  if (!mp.ok()) return Fail(mp.status().message());
  auto bk = CheckBacking(opts.backing);
  if (!bk.ok()) return Fail(bk.status().message());
  const std::string mountpoint = mp.value();
  const std::string backing = bk.value();
  if ((mountpoint + "/").rfind(backing + "/", 0) == 0 || (backing + "/").rfind(mountpoint + "/", 0) == 0)
    return Fail("backing directory " + backing + " and mount point " + mountpoint + " must not contain each other");

  StoreOptions so;
  so.chunk_size = opts.chunk_size;
  so.encoder.zstd_level = opts.zstd_level;
  so.encoder.tensor_codec = opts.tensor_codec;
  so.delta = opts.delta;
  so.keyframe_every = opts.keyframe_every;
  so.lossy = opts.lossy;
  so.lossy_scope = opts.lossy_scope;
  so.lossy_keyframe_every = opts.lossy_keyframe_every;
  so.background_gc = true;
  so.seal_workers =
      opts.seal_workers != 0 ? opts.seal_workers : std::clamp(std::thread::hardware_concurrency() / 2, 1u, 4u);
  const gpu::CudaOptions cuda{static_cast<size_t>(opts.gpu_mem), 0};
  if (opts.device == DeviceRequest::kGpu) {
    if (Status probe = ProbeDevice(opts.device, cuda); !probe.ok()) return Fail(probe.message());
  }
  auto store = Store::Open(Env::Default(), backing, so);
  if (!store.ok()) return Fail(store.status().message());

  const std::string log_path = opts.log_path.empty() ? backing + "/ckptfs.log" : opts.log_path;
  spdlog::drop_all();
  InitLogging(log_path, opts.log_level, opts.foreground);
  spdlog::info("ckptfs {} mounting {} on {}", CKPTFS_VERSION, backing, mountpoint);
  for (const std::string& line : store.value()->made_private()) spdlog::warn("store permissions: {}", line);
  for (const std::string& line : LooseParentsOf(Env::Default(), backing)) spdlog::warn("store permissions: {}", line);

  auto report = store.value()->Recover();
  if (!report.ok()) return Fail("recovery of " + backing + " failed: " + report.status().message());
  LogRecovery(report.value(), opts.foreground);

  auto ns_root = Env::Default()->OpenAt(store.value()->ns_fd(), ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (!ns_root.ok()) return Fail(ns_root.status().message());
  if (std::find(opts.kernel_opts.begin(), opts.kernel_opts.end(), "allow_other") != opts.kernel_opts.end() &&
      std::find(opts.kernel_opts.begin(), opts.kernel_opts.end(), "default_permissions") == opts.kernel_opts.end()) {
    opts.kernel_opts.push_back("default_permissions");
  }
  RaiseFdLimit();
  Filesystem fs(store.value().get(), opts.fs, std::move(ns_root).value());
  fs.SetAfterInit([&] { SetReadAhead(mountpoint, opts.read_ahead); });

  std::string fuse_opts = "fsname=" + EscapeOpt(backing) + ",subtype=ckptfs";
  for (const auto& k : opts.kernel_opts) fuse_opts += "," + k;
  std::vector<std::string> argv_s = {"ckptfs", "-o", fuse_opts};
  if (opts.debug_fuse) argv_s.push_back("-d");
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());

  fuse_session* se = fuse_session_new(&args, &Filesystem::Ops(), sizeof(fuse_lowlevel_ops), &fs);
  if (se == nullptr) return Fail("could not create the FUSE session (see messages above)");
  if (fuse_set_signal_handlers(se) != 0) return Fail("could not install signal handlers");
  if (fuse_session_mount(se, mountpoint.c_str()) != 0) {
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    return Fail("could not mount on " + mountpoint + " (is /dev/fuse available and are you root?)");
  }
  UniqueFd started;
  if (!opts.foreground) {
    auto pipe = Daemonize();
    if (!pipe.ok()) return Fail(pipe.status().message());
    started = std::move(pipe).value();
  }
  Status pid = store.value()->RecordOwnerPid();
  if (!pid.ok()) spdlog::warn("{}", pid.message());
  UseDevice(store.value().get(), opts.device, cuda);
  spdlog::info("sealing: {} file(s) at a time, {} worker(s) per file", opts.fs.seal_threads, so.seal_workers);
  fs.seals().Start();
  spdlog::info("mounted {} on {}", backing, mountpoint);
  ReportStarted(started);
  started.reset();

  fuse_loop_config* loop = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(loop, static_cast<unsigned>(opts.max_threads));
  fuse_loop_cfg_set_clone_fd(loop, 0);
  int rc = fuse_session_loop_mt(se, loop);
  fuse_loop_cfg_destroy(loop);

  fuse_session_unmount(se);
  fs.seals().Drain();
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  spdlog::info("unmounted {} (loop exit {})", mountpoint, rc);
  spdlog::shutdown();
  return rc == 0 ? 0 : 1;
}

}  // namespace ckptfs
