// A progress line for long commands (export, import): bytes done of the
// total, rate and ETA, redrawn in place on stderr when stderr is a
// terminal, and nothing at all otherwise (logs and pipes stay clean).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ckptfs {

// "1.5 GiB"
std::string HumanBytes(uint64_t n);

class Progress {
 public:
  // `enabled`: normally ShouldShowProgress(). `unit`: what is counted
  // ("packs"); empty for bytes.
  Progress(std::string what, uint64_t total_bytes, bool enabled, std::string unit = "");
  ~Progress() { Finish(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Add(uint64_t bytes) { Update(done_ + bytes); }
  // Sets the bytes done so far.
  void Update(uint64_t done);
  // Ends the line (once); later Adds draw nothing.
  void Finish();
  uint64_t done() const { return done_; }
  double seconds() const;

  // The line as drawn, for tests: "export  1.0 MiB / 4.0 MiB  25%  2.0 MiB/s  ETA 0:02";
  // with a unit, "gc  3 / 12 packs  25%  1.5 packs/s  ETA 0:06".
  static std::string Line(const std::string& what, uint64_t done, uint64_t total, double seconds,
                          const std::string& unit = "");
  void SetTotal(uint64_t total) { total_ = total; }

 private:
  void Draw();

  std::string what_;
  uint64_t total_;
  uint64_t done_ = 0;
  bool enabled_;
  std::string unit_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_draw_{};
};

// Whether stderr is a terminal.
bool ShouldShowProgress();

}  // namespace ckptfs
