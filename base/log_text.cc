#include "base/log_text.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

namespace ckptfs {
namespace {

// The length of the valid UTF-8 sequence at `s` (1 to 4), or 0 when the
// bytes there are not one (a stray continuation, an overlong form, a
// surrogate, past U+10FFFF, or cut short).
size_t Utf8Length(std::string_view s, char32_t* cp) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t c = b(0);
  size_t n = 0;
  char32_t v = 0;
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  if (c >= 0xc2 && c <= 0xdf)
    n = 2, v = c & 0x1f;
  else if (c >= 0xe0 && c <= 0xef)
    n = 3, v = c & 0x0f;
  else if (c >= 0xf0 && c <= 0xf4)
    n = 4, v = c & 0x07;
  else
    return 0;
  if (s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    if ((b(i) & 0xc0) != 0x80) return 0;
    v = (v << 6) | (b(i) & 0x3f);
  }
  const bool overlong = (n == 3 && v < 0x800) || (n == 4 && v < 0x10000);
  if (overlong || (v >= 0xd800 && v <= 0xdfff) || v > 0x10ffff) return 0;
  *cp = v;
  return n;
}

// Code points that a terminal or a log viewer may act on: C0 and C1
// controls, DEL, line and paragraph separators, and the bidirectional
// embeddings, overrides and isolates (they reorder what is shown).
bool NeedsEscape(char32_t cp) {
  return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 || (cp >= 0x202a && cp <= 0x202e) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

void AppendHex(std::string_view bytes, std::string* out) {
  for (const char c : bytes) {
    char buf[5];
    std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(static_cast<uint8_t>(c)));
    out->append(buf, 4);
  }
}

// What `s`'s next character (or invalid byte) becomes, and how many bytes
// of `s` it takes.
size_t EscapeNext(std::string_view s, bool escape_backslash, std::string* piece) {
  char32_t cp = 0;
  size_t n = Utf8Length(s, &cp);
  piece->clear();
  if (n == 0) {
    AppendHex(s.substr(0, 1), piece);
    return 1;
  }
  if (NeedsEscape(cp)) {
    AppendHex(s.substr(0, n), piece);
  } else if (cp == '\\' && escape_backslash) {
    piece->assign("\\\\");
  } else {
    piece->assign(s.substr(0, n));
  }
  return n;
}

}  // namespace

std::string LogSafe(std::string_view text, size_t max_bytes) {
  std::string out, piece;
  out.reserve(std::min(text.size(), max_bytes) + 8);
  for (size_t i = 0; i < text.size();) {
    const size_t n = EscapeNext(text.substr(i), /*escape_backslash=*/true, &piece);
    if (out.size() + piece.size() > max_bytes) {
      out += "...[cut, " + std::to_string(text.size()) + " bytes in all]";
      return out;
    }
    out += piece;
    i += n;
  }
  return out;
}

std::string_view EscapeLogLine(std::string_view line, std::string* escaped) {
  size_t clean = 0;
  char32_t cp = 0;
  for (size_t n; clean < line.size(); clean += n) {
    n = Utf8Length(line.substr(clean), &cp);
    if (n == 0 || NeedsEscape(cp)) break;
  }
  if (clean == line.size()) return line;
  escaped->assign(line.substr(0, clean));
  std::string piece;
  for (size_t i = clean; i < line.size();) {
    i += EscapeNext(line.substr(i), /*escape_backslash=*/false, &piece);
    *escaped += piece;
  }
  return *escaped;
}

}  // namespace ckptfs
