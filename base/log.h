// Logging goes through spdlog; this header keeps the setup in one place.
//
// What users choose must not steer the log: every message is escaped as a
// whole (EscapeLogLine) before it is written, text from a user is shown
// through LogSafe (escaped and cut), lines a user can cause repeatedly go
// through LogAllowed (rate-limited per kind and uid), and the file is
// opened by OpenOwnFileForAppend's rule and rotated at a size cap.
#pragma once

#include <spdlog/spdlog.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/log_file.h"
#include "base/log_limit.h"
#include "base/log_text.h"
#include "base/status.h"

namespace ckptfs {

// Sends log lines to `path` (appending) or to stderr when path is empty;
// with also_stderr, to both; and to the `extra` sinks (the daemon's
// journald sink). With `extra` given, an empty path means no file and no
// stderr unless also_stderr. Fails, logging nothing, when the file may
// not be written (OpenOwnFileForAppend).
Status InitLogging(const std::string& path, const std::string& level, bool also_stderr = false,
                   const std::vector<spdlog::sink_ptr>& extra = {}, LogFileOptions file = {});

// Closes the log file and opens it again by its name, as logrotate wants
// after it has moved the file away (the daemon's SIGHUP), by the same
// rule; on failure the old file stays in use and the error is returned.
// Nothing to do when the log has no file.
Status ReopenLogFile();

// Kinds of lines that users can cause over and over (LogAllowed's keys).
namespace log_kind {
inline constexpr std::string_view kXattr = "xattr";           // a refused policy setxattr/removexattr
inline constexpr std::string_view kPolicy = "policy";         // a stored policy that cannot be used
inline constexpr std::string_view kLoad = "load";             // a file whose stub or pack cannot be read
inline constexpr std::string_view kReadError = "read-error";  // a read that failed on stored data
inline constexpr std::string_view kSeal = "seal";             // a seal that failed, or a parser's note
}  // namespace log_kind

// Whether a line of `kind` that `uid` caused may be logged now (a few a
// second per kind and uid, LogLimitOptions). When it may and lines of its
// key were dropped before, logs "suppressed N ..." first.
bool LogAllowed(std::string_view kind, uint32_t uid);
// Logs "suppressed N ..." for every key whose dropping has ended (or for
// every key with dropped lines, when `all`): the daemon calls it every
// second and at unmount, so a flood that stops is still counted.
void ReportSuppressedLogLines(bool all);

}  // namespace ckptfs
