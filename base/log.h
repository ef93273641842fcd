// Logging goes through spdlog; this header keeps the setup in one place.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace ckptfs {

// Sends log lines to `path` (appending) or to stderr when path is empty;
// with also_stderr, to both.
void InitLogging(const std::string& path, const std::string& level, bool also_stderr = false);

}  // namespace ckptfs
