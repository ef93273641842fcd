// `ckptfs top MNT`: the daemon's figures, live. They come from the
// user.ckptfs.metrics attribute of the mount's root (fuse/ops.cc), which
// every mount answers, with or without -o metrics=; the text is the same
// Prometheus text the endpoint serves.
#include <poll.h>
#include <sys/xattr.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "base/metrics_text.h"
#include "fuse/mount.h"
#include "mount-tools/commands.h"
#include "mount-tools/progress.h"

namespace ckptfs {
namespace {

using Series = std::map<std::string, double>;

double Get(const Series& s, const std::string& name) {
  auto it = s.find(name);
  return it == s.end() ? 0.0 : it->second;
}

// The ckptfs mount `path` is in: its root holds the attribute.
Result<std::string> MountRootOf(const std::string& path) {
  std::error_code ec;
  const std::string abs = std::filesystem::absolute(path, ec).lexically_normal().string();
  std::string best;
  for (const MountEntry& m : ReadMounts()) {
    if (m.fstype != "fuse.ckptfs") continue;
    const bool inside = abs == m.mountpoint || abs.rfind(m.mountpoint == "/" ? "/" : m.mountpoint + "/", 0) == 0 ||
                        abs == m.mountpoint + "/";
    if (inside && m.mountpoint.size() > best.size()) best = m.mountpoint;
  }
  if (best.empty()) return Status::Error(ENOENT, path + " is not inside a ckptfs mount");
  return best;
}

Result<Series> ReadSample(const std::string& root) {
  std::string buf(256 * 1024, '\0');
  const ssize_t n = ::getxattr(root.c_str(), kMetricsXattr, buf.data(), buf.size());
  if (n < 0) {
    const int err = errno;
    if (err == ENODATA || err == ENOTSUP)
      return Status::Error(err, root + ": its daemon reports no metrics (a ckptfs older than `ckptfs top`?)");
    return Status::FromErrno(err, "reading the metrics of " + root);
  }
  buf.resize(static_cast<size_t>(n));
  return ParsePrometheusText(buf);
}

nlohmann::json SampleJson(const std::string& root, const Series& s) {
  nlohmann::json buckets = nlohmann::json::object();
  const std::string prefix = "ckptfs_lossy_relative_error_bucket{le=\"";
  for (const auto& [name, v] : s)
    if (name.rfind(prefix, 0) == 0) buckets[name.substr(prefix.size(), name.size() - prefix.size() - 2)] = v;
  const double hits = Get(s, "ckptfs_chunk_cache_hits_total"), misses = Get(s, "ckptfs_chunk_cache_misses_total");
  auto u = [&](const std::string& name) { return static_cast<uint64_t>(Get(s, name)); };
  return {{"mountpoint", root},
          {"logical_bytes", u("ckptfs_logical_bytes")},
          {"stored_bytes", u("ckptfs_stored_bytes")},
          {"ratio", Get(s, "ckptfs_compression_ratio")},
          {"seal_queue_depth", u("ckptfs_seal_queue_depth")},
          {"seal_queue_oldest_seconds", Get(s, "ckptfs_seal_queue_oldest_seconds")},
          {"sealed_files", u("ckptfs_sealed_files_total")},
          {"sealed_bytes", u("ckptfs_sealed_bytes_total")},
          {"sealed_pack_bytes", u("ckptfs_sealed_pack_bytes_total")},
          {"seal_seconds", Get(s, "ckptfs_seal_seconds_total")},
          {"read_bytes", u("ckptfs_read_bytes_total")},
          {"cache_hits", u("ckptfs_chunk_cache_hits_total")},
          {"cache_misses", u("ckptfs_chunk_cache_misses_total")},
          {"cache_hit_ratio", hits + misses > 0 ? hits / (hits + misses) : 0.0},
          {"cache_bytes", u("ckptfs_chunk_cache_bytes")},
          {"cache_capacity_bytes", u("ckptfs_chunk_cache_capacity_bytes")},
          {"errors",
           {{"eio", u("ckptfs_errors_total{kind=\"eio\"}")},
            {"enospc", u("ckptfs_errors_total{kind=\"enospc\"}")},
            {"seal_failures", u("ckptfs_seal_failures_total")}}},
          {"lossy_error",
           {{"count", u("ckptfs_lossy_relative_error_count")},
            {"sum", Get(s, "ckptfs_lossy_relative_error_sum")},
            {"buckets", buckets}}}};
}

std::string Rate(double bytes_per_s) { return HumanBytes(static_cast<uint64_t>(std::max(0.0, bytes_per_s))) + "/s"; }

// The smallest bucket bound at or under which `q` of the lossy pieces lie.
std::string ErrorQuantile(const Series& s, double q) {
  const double count = Get(s, "ckptfs_lossy_relative_error_count");
  if (count == 0) return "-";
  for (double bound : ErrorHistogram::kBounds) {
    char le[32];
    std::snprintf(le, sizeof le, "%g", bound);
    if (Get(s, std::string("ckptfs_lossy_relative_error_bucket{le=\"") + le + "\"}") >= q * count)
      return std::string("<= ") + le;
  }
  return "> 1";
}

// One screen. `prev` and `dt` give the rates; without them, the averages.
std::string Screen(const std::string& root, const Series& s, const Series* prev, double dt) {
  auto rate = [&](const std::string& name) {
    return prev != nullptr && dt > 0 ? Rate((Get(s, name) - Get(*prev, name)) / dt) : std::string("-");
  };
  const double seal_s = Get(s, "ckptfs_seal_seconds_total");
  const double hits = Get(s, "ckptfs_chunk_cache_hits_total"), misses = Get(s, "ckptfs_chunk_cache_misses_total");
  auto bytes = [&](const std::string& name) { return HumanBytes(static_cast<uint64_t>(Get(s, name))); };
  char buf[2048];
  std::snprintf(
      buf, sizeof buf,
      "ckptfs top %s\n\n"
      "store        %s logical in %s stored, %.2fx\n"
      "seal queue   %.0f file(s), oldest waiting %.1f s\n"
      "sealed       %.0f file(s), %s in %.1f s (%s on average); now %s\n"
      "read         %s; now %s\n"
      "chunk cache  %.0f hits, %.0f misses (%.1f%% hits), %s of %s\n"
      "errors       EIO %.0f, ENOSPC %.0f, failed seals %.0f\n"
      "lossy error  %.0f piece(s); median %s, 99%% %s\n",
      root.c_str(), bytes("ckptfs_logical_bytes").c_str(), bytes("ckptfs_stored_bytes").c_str(),
      Get(s, "ckptfs_compression_ratio"), Get(s, "ckptfs_seal_queue_depth"), Get(s, "ckptfs_seal_queue_oldest_seconds"),
      Get(s, "ckptfs_sealed_files_total"), bytes("ckptfs_sealed_bytes_total").c_str(), seal_s,
      seal_s > 0 ? Rate(Get(s, "ckptfs_sealed_bytes_total") / seal_s).c_str() : "-",
      rate("ckptfs_sealed_bytes_total").c_str(), bytes("ckptfs_read_bytes_total").c_str(),
      rate("ckptfs_read_bytes_total").c_str(), hits, misses, hits + misses > 0 ? 100 * hits / (hits + misses) : 0.0,
      bytes("ckptfs_chunk_cache_bytes").c_str(), bytes("ckptfs_chunk_cache_capacity_bytes").c_str(),
      Get(s, "ckptfs_errors_total{kind=\"eio\"}"), Get(s, "ckptfs_errors_total{kind=\"enospc\"}"),
      Get(s, "ckptfs_seal_failures_total"), Get(s, "ckptfs_lossy_relative_error_count"), ErrorQuantile(s, 0.5).c_str(),
      ErrorQuantile(s, 0.99).c_str());
  return buf;
}

std::atomic<bool> interrupted{false};

// The terminal in non-canonical mode without echo, so that `q` needs no
// Enter; put back as it was on every way out.
class RawKeys {
 public:
  RawKeys() {
    if (::isatty(STDIN_FILENO) != 1 || ::tcgetattr(STDIN_FILENO, &saved_) != 0) return;
    termios raw = saved_;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    active_ = ::tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
  }
  ~RawKeys() {
    if (active_) ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  RawKeys(const RawKeys&) = delete;
  RawKeys& operator=(const RawKeys&) = delete;

 private:
  termios saved_{};
  bool active_ = false;
};

// Waits up to a second for a key; true when it was q (or Ctrl-C came).
bool QuitWithin1s() {
  pollfd p{STDIN_FILENO, POLLIN, 0};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!interrupted.load()) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r > 0) {
      char c = 0;
      if (::read(STDIN_FILENO, &c, 1) == 1 && (c == 'q' || c == 'Q')) return true;
      if ((p.revents & (POLLHUP | POLLERR)) != 0) p.fd = -1;  // stdin gone: keep refreshing
    }
  }
  return true;
}

int Live(const std::string& root) {
  struct sigaction sa {};
  sa.sa_handler = [](int) { interrupted.store(true); };
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  const RawKeys keys;
  std::optional<Series> prev;
  auto prev_t = std::chrono::steady_clock::now();
  for (;;) {
    auto s = ReadSample(root);
    if (!s.ok()) {
      std::cerr << "\nckptfs top: " << s.status().message() << "\n";
      return 2;
    }
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - prev_t).count();
    // Home, clear: the screen is redrawn whole.
    std::cout << "\033[H\033[2J" << Screen(root, *s, prev ? &*prev : nullptr, dt) << "\n(q or Ctrl-C quits)"
              << std::flush;
    prev = std::move(s).value();
    prev_t = now;
    if (QuitWithin1s()) break;
  }
  std::cout << "\n";
  return 0;
}

}  // namespace

int RunTop(const std::string& path, bool once, bool json) {
  auto root = MountRootOf(path);
  if (!root.ok()) {
    std::cerr << "ckptfs top: " << root.status().message() << "\n";
    return 2;
  }
  if (!once && !json) return Live(*root);
  auto s = ReadSample(*root);
  if (!s.ok()) {
    std::cerr << "ckptfs top: " << s.status().message() << "\n";
    return 2;
  }
  if (json)
    std::cout << SampleJson(*root, *s).dump(2) << "\n";
  else
    std::cout << Screen(*root, *s, nullptr, 0);
  return 0;
}

}  // namespace ckptfs
