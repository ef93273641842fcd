#include "base/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <vector>

namespace ckptfs {

void InitLogging(const std::string& path, const std::string& level, bool also_stderr) {
  std::vector<spdlog::sink_ptr> sinks;
  if (path.empty() || also_stderr) sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  if (!path.empty()) sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(path));
  auto logger = std::make_shared<spdlog::logger>("ckptfs", sinks.begin(), sinks.end());
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%t] %v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace ckptfs
