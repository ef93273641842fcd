// Logging goes through spdlog; this header keeps the setup in one place.
#pragma once

#include <spdlog/spdlog.h>

#include <string>
#include <vector>

namespace ckptfs {

// Sends log lines to `path` (appending) or to stderr when path is empty;
// with also_stderr, to both; and to the `extra` sinks (the daemon's
// journald sink). With `extra` given, an empty path means no file and no
// stderr unless also_stderr.
void InitLogging(const std::string& path, const std::string& level, bool also_stderr = false,
                 const std::vector<spdlog::sink_ptr>& extra = {});

// Closes the log file and opens it again by its name, as logrotate wants
// after it has moved the file away (the daemon's SIGHUP). Nothing to do
// when the log has no file.
void ReopenLogFile();

}  // namespace ckptfs
