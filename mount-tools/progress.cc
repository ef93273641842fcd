#include "mount-tools/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace ckptfs {

std::string HumanBytes(uint64_t n) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, kUnits[u]);
  return buf;
}

bool ShouldShowProgress() { return ::isatty(STDERR_FILENO) == 1; }

Progress::Progress(std::string what, uint64_t total_bytes, bool enabled, std::string unit)
    : what_(std::move(what)), total_(total_bytes), enabled_(enabled), unit_(std::move(unit)) {}

double Progress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::string Progress::Line(const std::string& what, uint64_t done, uint64_t total, double seconds,
                           const std::string& unit) {
  total = std::max(total, done);  // an estimate of the total may fall short
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
  std::string line = what + "  ";
  if (unit.empty()) {
    line += HumanBytes(done) + " / " + HumanBytes(total);
  } else {
    line += std::to_string(done) + " / " + std::to_string(total) + " " + unit;
  }
  if (total > 0) line += "  " + std::to_string(done * 100 / total) + "%";
  if (unit.empty()) {
    line += "  " + HumanBytes(static_cast<uint64_t>(rate)) + "/s";
  } else {
    char buf[48];
    std::snprintf(buf, sizeof buf, "  %.1f %s/s", rate, unit.c_str());
    line += buf;
  }
  if (rate > 0 && done < total) {
    const auto eta = static_cast<uint64_t>(static_cast<double>(total - done) / rate);
    char buf[32];
    std::snprintf(buf, sizeof buf, "  ETA %llu:%02llu", static_cast<unsigned long long>(eta / 60),
                  static_cast<unsigned long long>(eta % 60));
    line += buf;
  }
  return line;
}

void Progress::Draw() {
  // \033[K clears what a longer line left behind.
  std::fprintf(stderr, "\r%s\033[K", Line(what_, done_, total_, seconds(), unit_).c_str());
  std::fflush(stderr);
  last_draw_ = std::chrono::steady_clock::now();
}

void Progress::Update(uint64_t done) {
  done_ = done;
  if (enabled_ && std::chrono::steady_clock::now() - last_draw_ > std::chrono::milliseconds(100)) Draw();
}

void Progress::Finish() {
  if (!enabled_) return;
  Draw();
  std::fputc('\n', stderr);
  enabled_ = false;
}

}  // namespace ckptfs
