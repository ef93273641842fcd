// The log's defences (base/log_text.h, log_limit.h, log_file.h): what a
// user supplies is escaped and cut, repeated lines are rate-limited per
// kind and uid, and the file is opened only when it is the daemon's own,
// and rotated at its cap.
#include "base/log.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using namespace std::chrono_literals;
using test::TempDir;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// --- LogSafe ---

TEST(LogSafeTest, ControlCharactersBecomeHexEscapes) {
  EXPECT_EQ(LogSafe("plain name_1.pt"), "plain name_1.pt");
  EXPECT_EQ(LogSafe("a\nb\rc\td"), "a\\x0ab\\x0dc\\x09d");
  EXPECT_EQ(LogSafe(std::string("nul\0x", 5)), "nul\\x00x");
  EXPECT_EQ(LogSafe("\x1b[2Jdel\x7f"), "\\x1b[2Jdel\\x7f");
  // A backslash is escaped too, so that "\x0a" typed by a user cannot pass
  // for an escaped newline.
  EXPECT_EQ(LogSafe("a\\x0a"), "a\\\\x0a");
}

TEST(LogSafeTest, ValidUtf8StaysAndInvalidBytesAreEscaped) {
  EXPECT_EQ(LogSafe("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80"),
            "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(LogSafe("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(LogSafe("\xc3"), "\\xc3");                    // cut short
  EXPECT_EQ(LogSafe("\xc0\xaf"), "\\xc0\\xaf");           // overlong '/'
  EXPECT_EQ(LogSafe("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  // C1 controls (NEL, CSI), line separators and bidi overrides act on
  // terminals and viewers: escaped although valid UTF-8.
  EXPECT_EQ(LogSafe("\xc2\x85|\xc2\x9b"), "\\xc2\\x85|\\xc2\\x9b");
  EXPECT_EQ(LogSafe("\xe2\x80\xa8"), "\\xe2\\x80\\xa8");
  EXPECT_EQ(LogSafe("\xe2\x80\xae"), "\\xe2\\x80\\xae");
}

TEST(LogSafeTest, LongTextIsCutWithAMarker) {
  const std::string big(65536, 'A');
  const std::string shown = LogSafe(big);
  EXPECT_EQ(shown.substr(0, kLogSafeMaxBytes), std::string(kLogSafeMaxBytes, 'A'));
  EXPECT_EQ(shown.substr(kLogSafeMaxBytes), "...[cut, 65536 bytes in all]");
  // Never in the middle of an escape or of a character.
  const std::string newlines(300, '\n');
  const std::string cut = LogSafe(newlines, 10);
  EXPECT_EQ(cut, "\\x0a\\x0a...[cut, 300 bytes in all]");
  EXPECT_EQ(LogSafe("\xc3\xa9\xc3\xa9", 3), "\xc3\xa9...[cut, 4 bytes in all]");
  EXPECT_EQ(LogSafe(std::string(200, 'x')), std::string(200, 'x'));  // exactly the limit: whole
}

TEST(LogSafeTest, EscapeLogLineLeavesCleanLinesAndLogSafeOutputAlone) {
  std::string buf;
  const std::string clean = "sealing inode 7 caf\xc3\xa9";
  EXPECT_EQ(EscapeLogLine(clean, &buf).data(), clean.data());  // no copy
  const std::string safe = LogSafe("x\ny\\z");
  EXPECT_EQ(EscapeLogLine(safe, &buf), safe);
  EXPECT_EQ(EscapeLogLine("a\n2026-01-01T00:00:00.000 info forged", &buf), "a\\x0a2026-01-01T00:00:00.000 info forged");
}

// --- LogLimiter ---

TEST(LogLimiterTest, BurstThenRateThenSuppressedCount) {
  LogLimiter limiter(LogLimitOptions{.burst = 3, .per_second = 1, .max_keys = 16});
  const auto t0 = LogLimiter::Clock::time_point{} + 1000s;
  LogLimiter::Suppressed report;
  int admitted = 0;
  for (int i = 0; i < 5000; ++i) admitted += limiter.Admit("xattr", 1000, t0, &report);
  EXPECT_EQ(admitted, 3);
  // Another uid, or another kind, has its own bucket.
  EXPECT_TRUE(limiter.Admit("xattr", 1001, t0, &report));
  EXPECT_TRUE(limiter.Admit("seal", 1000, t0, &report));
  EXPECT_EQ(report.count, 0u);
  // Nothing has ended yet: no token back.
  EXPECT_TRUE(limiter.TakeEnded(t0 + 500ms, false).empty());
  // A second later one line passes, and says how many were dropped.
  EXPECT_TRUE(limiter.Admit("xattr", 1000, t0 + 1s, &report));
  EXPECT_EQ(report.count, 4997u);
  EXPECT_EQ(report.kind, "xattr");
  EXPECT_EQ(report.uid, 1000u);
  EXPECT_FALSE(limiter.Admit("xattr", 1000, t0 + 1s, &report));
}

TEST(LogLimiterTest, TakeEndedReportsAFloodThatStopped) {
  LogLimiter limiter(LogLimitOptions{.burst = 2, .per_second = 1, .max_keys = 16});
  const auto t0 = LogLimiter::Clock::time_point{} + 1000s;
  LogLimiter::Suppressed report;
  for (int i = 0; i < 10; ++i) limiter.Admit("policy", 7, t0, &report);
  std::vector<LogLimiter::Suppressed> ended = limiter.TakeEnded(t0 + 2s, false);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].count, 8u);
  EXPECT_EQ(ended[0].uid, 7u);
  EXPECT_TRUE(limiter.TakeEnded(t0 + 3s, false).empty());  // reported once
  // At shutdown, even a flood still going is reported.
  for (int i = 0; i < 10; ++i) limiter.Admit("policy", 7, t0 + 3s, &report);
  EXPECT_TRUE(limiter.TakeEnded(t0 + 3s, false).empty());
  ended = limiter.TakeEnded(t0 + 3s, true);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].count, 8u);
}

TEST(LogLimiterTest, KeysAreBounded) {
  LogLimiter limiter(LogLimitOptions{.burst = 1, .per_second = 0.001, .max_keys = 8});
  const auto t0 = LogLimiter::Clock::time_point{} + 1000s;
  LogLimiter::Suppressed report;
  int admitted = 0;
  for (uint32_t uid = 0; uid < 10000; ++uid) admitted += limiter.Admit("seal", uid, t0, &report);
  EXPECT_LE(limiter.keys(), 8u);
  // 8 keys of their own, then all newcomers share one bucket of 1 line.
  EXPECT_EQ(admitted, 9);
  std::vector<LogLimiter::Suppressed> ended = limiter.TakeEnded(t0, true);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].count, 10000u - 9u);
}

// --- OpenOwnFileForAppend and LogFile ---

TEST(LogFileTest, CreatesPrivateFileAndAppends) {
  TempDir dir;
  const std::string path = dir.Sub("ckptfs.log");
  const mode_t old = ::umask(0);
  Result<UniqueFd> fd = OpenOwnFileForAppend(path);
  ::umask(old);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  struct stat st {};
  ASSERT_EQ(::fstat(fd->get(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_NE(::fcntl(fd->get(), F_GETFD) & FD_CLOEXEC, 0);
  EXPECT_NE(::fcntl(fd->get(), F_GETFL) & O_APPEND, 0);
}

TEST(LogFileTest, RefusesSymlinksAndFilesOthersControl) {
  TempDir dir;
  const std::string target = dir.Sub("authorized_keys");
  { std::ofstream(target) << "ssh-ed25519 AAAA admin\n"; }
  ::chmod(target.c_str(), 0600);
  const std::string link = dir.Sub("ckptfs.log");
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  Result<UniqueFd> fd = OpenOwnFileForAppend(link);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("symlink"), std::string::npos) << fd.status().message();
  // A dangling one is not created through either.
  const std::string dangling = dir.Sub("dangling.log");
  ASSERT_EQ(::symlink(dir.Sub("made-through-link").c_str(), dangling.c_str()), 0);
  EXPECT_FALSE(OpenOwnFileForAppend(dangling).ok());
  EXPECT_FALSE(Exists(dir.Sub("made-through-link")));
  // A hard link to someone's file has two links.
  const std::string hard = dir.Sub("hard.log");
  ASSERT_EQ(::link(target.c_str(), hard.c_str()), 0);
  fd = OpenOwnFileForAppend(hard);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("hard links"), std::string::npos) << fd.status().message();
  // One that the group may write.
  const std::string loose = dir.Sub("loose.log");
  { std::ofstream(loose) << ""; }
  ::chmod(loose.c_str(), 0620);
  fd = OpenOwnFileForAppend(loose);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("0620"), std::string::npos) << fd.status().message();
  // A directory.
  EXPECT_FALSE(OpenOwnFileForAppend(dir.path()).ok());
  EXPECT_EQ(ReadAll(target), "ssh-ed25519 AAAA admin\n");
}

TEST(LogFileTest, RefusesAFileOfAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file to another user";
  TempDir dir;
  const std::string path = dir.Sub("ckptfs.log");
  { std::ofstream(path) << "theirs\n"; }
  ::chmod(path.c_str(), 0600);
  ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
  Result<UniqueFd> fd = OpenOwnFileForAppend(path);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("owned by uid 65534"), std::string::npos) << fd.status().message();
  EXPECT_EQ(ReadAll(path), "theirs\n");
}

TEST(LogFileTest, RotatesAtTheCapKeepingTwoOldFiles) {
  TempDir dir;
  const std::string path = dir.Sub("ckptfs.log");
  Result<LogFile> log = LogFile::Open(path, LogFileOptions{.max_bytes = 100, .keep = 2});
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  const std::string line(30, 'x');
  for (int i = 0; i < 20; ++i) EXPECT_OK(log->Write(line + std::to_string(i % 10) + "\n"));  // 32 bytes each
  // 3 lines (96 bytes) a file: lines 18-19 in PATH, 15-17 in .1, 12-14 in .2.
  EXPECT_EQ(ReadAll(path), line + "8\n" + line + "9\n");
  EXPECT_EQ(ReadAll(path + ".1"), line + "5\n" + line + "6\n" + line + "7\n");
  EXPECT_EQ(ReadAll(path + ".2"), line + "2\n" + line + "3\n" + line + "4\n");
  EXPECT_FALSE(Exists(path + ".3"));
}

TEST(LogFileTest, RotationAndReopenRefuseAPlantedFile) {
  TempDir dir;
  const std::string path = dir.Sub("ckptfs.log");
  const std::string target = dir.Sub("victim");
  { std::ofstream(target) << "keep\n"; }
  Result<LogFile> log = LogFile::Open(path, LogFileOptions{.max_bytes = 64, .keep = 1});
  ASSERT_TRUE(log.ok());
  EXPECT_OK(log->Write(std::string(40, 'a') + "\n"));
  // Reopen by name (SIGHUP) after someone put a symlink in its place: the
  // old file stays in use.
  ASSERT_EQ(::rename(path.c_str(), (path + ".moved").c_str()), 0);
  ASSERT_EQ(::symlink(target.c_str(), path.c_str()), 0);
  EXPECT_FALSE(log->Reopen().ok());
  EXPECT_OK(log->Write("still here\n"));
  EXPECT_EQ(ReadAll(path + ".moved"), std::string(40, 'a') + "\nstill here\n");
  // Rotation moves the symlink away as a name, then creates PATH anew.
  ASSERT_EQ(::unlink((path + ".moved").c_str()), 0);
  EXPECT_FALSE(log->Reopen().ok());
  EXPECT_OK(log->Write(std::string(60, 'b') + "\n"));  // past the cap: rotates
  EXPECT_EQ(ReadAll(path), std::string(60, 'b') + "\n");
  EXPECT_EQ(ReadAll(target), "keep\n");
}

}  // namespace
}  // namespace ckptfs
