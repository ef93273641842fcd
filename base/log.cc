#include "base/log.h"

#include <spdlog/details/file_helper.h>
#include <spdlog/details/null_mutex.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>
#include <vector>

namespace ckptfs {
namespace {

// spdlog's basic_file_sink, with a way to reopen the file by name.
class ReopenableFileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit ReopenableFileSink(const std::string& path) { file_.open(path, /*truncate=*/false); }
  void Reopen() {
    std::lock_guard lk(mutex_);
    file_.reopen(/*truncate=*/false);
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    file_.write(formatted);
  }
  void flush_() override { file_.flush(); }

 private:
  spdlog::details::file_helper file_;
};

std::mutex file_sink_mu;
std::shared_ptr<ReopenableFileSink> file_sink;  // the current logger's, if any

}  // namespace

void InitLogging(const std::string& path, const std::string& level, bool also_stderr,
                 const std::vector<spdlog::sink_ptr>& extra) {
  std::vector<spdlog::sink_ptr> sinks = extra;
  if ((path.empty() && extra.empty()) || also_stderr)
    sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  std::shared_ptr<ReopenableFileSink> file;
  if (!path.empty()) {
    file = std::make_shared<ReopenableFileSink>(path);
    sinks.push_back(file);
  }
  auto logger = std::make_shared<spdlog::logger>("ckptfs", sinks.begin(), sinks.end());
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%t] %v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  std::lock_guard lk(file_sink_mu);
  file_sink = std::move(file);
}

void ReopenLogFile() {
  std::shared_ptr<ReopenableFileSink> sink;
  {
    std::lock_guard lk(file_sink_mu);
    sink = file_sink;
  }
  if (sink) sink->Reopen();
}

}  // namespace ckptfs
