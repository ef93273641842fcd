// What a log line may show of text it did not write itself: a file name, an
// xattr value, a parser's message quoting a file. Any user chooses such
// text, so unescaped it could start a log line of its own (a newline and a
// forged timestamp), move a terminal's cursor, or fill the disk.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ckptfs {

// The most bytes of one user-supplied text that a log line shows.
inline constexpr size_t kLogSafeMaxBytes = 200;
// The most bytes of a whole line of the daemon's own words that embeds
// such text (recovery's "removed ns/PATH ..."), logged once per mount.
inline constexpr size_t kLogSafeLineMaxBytes = 1000;

// `text` as a log line may show it: control characters (C0, DEL and C1),
// the Unicode line and paragraph separators and bidirectional overrides,
// bytes that are not valid UTF-8, and backslash become \xNN (\\ for a
// backslash), so nothing in it reads as a line break or as the daemon's
// own words. Cut to `max_bytes` at a character boundary, with a marker
// saying how long the text was.
std::string LogSafe(std::string_view text, size_t max_bytes = kLogSafeMaxBytes);

// The last line of defence, applied to every formatted log message: the
// same escapes but for backslash (so that LogSafe's output passes
// unchanged), and no cut. A message with nothing to escape is returned
// as is (`*escaped` false) without a copy.
std::string_view EscapeLogLine(std::string_view line, std::string* escaped);

}  // namespace ckptfs
