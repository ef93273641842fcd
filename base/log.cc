#include "base/log.h"

#include <spdlog/details/null_mutex.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdio>
#include <mutex>
#include <optional>
#include <vector>

namespace ckptfs {
namespace {

constexpr const char* kPattern = "%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%t] %v";

// Formats as the pattern says, after escaping the message (EscapeLogLine):
// whatever a site forgot to pass through LogSafe, a line stays one line.
class EscapingFormatter final : public spdlog::formatter {
 public:
  EscapingFormatter() : inner_(kPattern) {}
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    std::string escaped;
    const std::string_view payload(msg.payload.data(), msg.payload.size());
    const std::string_view safe = EscapeLogLine(payload, &escaped);
    if (safe.data() == payload.data()) return inner_.format(msg, dest);
    spdlog::details::log_msg copy = msg;
    copy.payload = spdlog::string_view_t(safe.data(), safe.size());
    inner_.format(copy, dest);
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<EscapingFormatter>(); }

 private:
  spdlog::pattern_formatter inner_;
};

// Writes to a LogFile: opened by OpenOwnFileForAppend's rule, rotated at
// its cap, reopened by name on SIGHUP.
class OwnFileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit OwnFileSink(LogFile file) : file_(std::move(file)) {}
  Status Reopen() {
    std::lock_guard lk(mutex_);
    return file_.Reopen();
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    if (Status s = file_.Write(std::string_view(formatted.data(), formatted.size())); !s.ok()) {
      // Nowhere else to say it but stderr (the terminal with -f, the journal).
      std::fprintf(stderr, "ckptfs: log %s: %s\n", file_.path().c_str(), s.message().c_str());
    }
  }
  void flush_() override {}  // each line is one write(2)

 private:
  LogFile file_;
};

std::mutex file_sink_mu;
std::shared_ptr<OwnFileSink> file_sink;  // the current logger's, if any

LogLimiter& Limiter() {
  static LogLimiter limiter;
  return limiter;
}

void LogSuppressed(const LogLimiter::Suppressed& s) {
  const std::string who = s.uid == kLogAnyUid ? std::string("any uid") : "uid " + std::to_string(s.uid);
  spdlog::warn("log: suppressed {} similar line(s) ({}, {}) in {:.0f} s", s.count, s.kind, who, s.seconds);
}

}  // namespace

Status InitLogging(const std::string& path, const std::string& level, bool also_stderr,
                   const std::vector<spdlog::sink_ptr>& extra, LogFileOptions file_opts) {
  std::vector<spdlog::sink_ptr> sinks = extra;
  std::shared_ptr<OwnFileSink> file;
  if (!path.empty()) {
    ASSIGN_OR_RETURN(LogFile opened, LogFile::Open(path, file_opts));
    file = std::make_shared<OwnFileSink>(std::move(opened));
  }
  if ((path.empty() && extra.empty()) || also_stderr)
    sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  if (file) sinks.push_back(file);
  auto logger = std::make_shared<spdlog::logger>("ckptfs", sinks.begin(), sinks.end());
  logger->set_formatter(std::make_unique<EscapingFormatter>());
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  std::lock_guard lk(file_sink_mu);
  file_sink = std::move(file);
  return Status::Ok();
}

Status ReopenLogFile() {
  std::shared_ptr<OwnFileSink> sink;
  {
    std::lock_guard lk(file_sink_mu);
    sink = file_sink;
  }
  return sink ? sink->Reopen() : Status::Ok();
}

bool LogAllowed(std::string_view kind, uint32_t uid) {
  LogLimiter::Suppressed report;
  if (!Limiter().Admit(kind, uid, LogLimiter::Clock::now(), &report)) return false;
  if (report.count > 0) LogSuppressed(report);
  return true;
}

void ReportSuppressedLogLines(bool all) {
  for (const LogLimiter::Suppressed& s : Limiter().TakeEnded(LogLimiter::Clock::now(), all)) LogSuppressed(s);
}

}  // namespace ckptfs
