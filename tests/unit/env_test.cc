#include "base/env.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/xattr.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>

#include "base/huge_pages.h"
#include "store/direct_read.h"
#include "store/object_id.h"
#include "store/pack_bytes.h"
#include "store/write_behind.h"
#include "tests/unit/fault_env.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using test::TempDir;

std::span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::vector<std::string> Names(const std::vector<DirEntry>& v) {
  std::vector<std::string> out;
  for (const auto& e : v) out.push_back(e.name);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(EnvTest, ErrorsNameOperationAndPath) {
  TempDir dir;
  Env* env = Env::Default();
  auto d = env->OpenAt(AT_FDCWD, dir.path(), O_RDONLY | O_DIRECTORY);
  ASSERT_TRUE(d.ok());
  auto r = env->OpenAt(d->get(), "ns/a/b", O_RDONLY);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ENOENT);
  EXPECT_EQ(r.status().message(), "open " + dir.path() + "/ns/a/b: No such file or directory");

  Status s = env->UnlinkAt(d->get(), "missing");
  EXPECT_EQ(s.code(), ENOENT);
  EXPECT_NE(s.message().find("unlink " + dir.path() + "/missing"), std::string::npos) << s.message();

  s = env->RenameAt(d->get(), "x", d->get(), "y");
  EXPECT_NE(s.message().find("rename "), std::string::npos);
  EXPECT_NE(s.message().find("/x -> "), std::string::npos);
}

TEST(EnvTest, FdsAreCloseOnExec) {
  TempDir dir;
  auto fd = Env::Default()->OpenAt(AT_FDCWD, dir.Sub("f"), O_CREAT | O_RDWR, 0600);
  ASSERT_TRUE(fd.ok());
  EXPECT_TRUE(::fcntl(fd->get(), F_GETFD) & FD_CLOEXEC);
}

TEST(EnvTest, ReadWriteAndShortRead) {
  TempDir dir;
  Env* env = Env::Default();
  auto fd = env->OpenAt(AT_FDCWD, dir.Sub("f"), O_CREAT | O_RDWR, 0600);
  ASSERT_TRUE(fd.ok());
  ASSERT_OK(env->PWriteAll(fd->get(), AsBytes("hello world"), 0));
  std::vector<uint8_t> buf(5);
  ASSERT_OK(env->PReadExact(fd->get(), buf, 6));
  EXPECT_EQ(std::string(buf.begin(), buf.end()), "world");
  std::vector<uint8_t> big(100);
  auto n = env->PRead(fd->get(), big, 0);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 11u);
  Status s = env->PReadExact(fd->get(), big, 0);
  EXPECT_EQ(s.code(), EIO);
  EXPECT_NE(s.message().find("short read"), std::string::npos);
}

TEST(EnvTest, ListDirLeavesCallersFdAlone) {
  TempDir dir;
  Env* env = Env::Default();
  for (const char* n : {"a", "b", "c"}) test::WriteFileBytes(dir.Sub(n), {1});
  ASSERT_OK(env->MkdirAt(AT_FDCWD, dir.Sub("d"), 0755));
  auto d = env->OpenAt(AT_FDCWD, dir.path(), O_RDONLY | O_DIRECTORY);
  ASSERT_TRUE(d.ok());
  const std::vector<std::string> want = {"a", "b", "c", "d"};
  for (int i = 0; i < 3; ++i) {  // repeated listings see everything
    auto l = env->ListDir(d->get());
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(Names(*l), want);
  }
  // The fd is still usable by its owner.
  EXPECT_TRUE(env->FstatAt(d->get(), "a", 0).ok());
  // O_PATH directory fds (what the FUSE layer may hold) can be listed too.
  auto p = env->OpenAt(AT_FDCWD, dir.path(), O_PATH | O_DIRECTORY);
  ASSERT_TRUE(p.ok());
  auto l = env->ListDir(p->get());
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(Names(*l), want);
}

TEST(EnvTest, ReadlinkLongTarget) {
  TempDir dir;
  Env* env = Env::Default();
  std::string target(1000, 'x');
  ASSERT_OK(env->SymlinkAt(target, AT_FDCWD, dir.Sub("l")));
  auto r = env->ReadlinkAt(AT_FDCWD, dir.Sub("l"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, target);
}

TEST(EnvTest, XattrsThroughProcFdPath) {
  TempDir dir;
  Env* env = Env::Default();
  auto fd = env->OpenAt(AT_FDCWD, dir.Sub("f"), O_CREAT | O_RDWR, 0600);
  ASSERT_TRUE(fd.ok());
  EXPECT_EQ(ProcFdPath(fd->get()), "/proc/self/fd/" + std::to_string(fd->get()));
  auto opath = env->OpenAt(AT_FDCWD, dir.Sub("f"), O_PATH);
  ASSERT_TRUE(opath.ok());
  const std::string path = ProcFdPath(opath->get());
  Status s = env->SetXattr(path, "user.ckpt", AsBytes("v1"), 0);
  if (s.code() == ENOTSUP || s.code() == EOPNOTSUPP) GTEST_SKIP() << "no user xattrs on /tmp";
  ASSERT_OK(s);
  auto len = env->GetXattr(path, "user.ckpt", {});
  ASSERT_TRUE(len.ok());
  EXPECT_EQ(*len, 2u);
  std::vector<uint8_t> v(*len);
  ASSERT_TRUE(env->GetXattr(path, "user.ckpt", v).ok());
  EXPECT_EQ(std::string(v.begin(), v.end()), "v1");
  std::vector<char> names(256);
  auto n = env->ListXattr(path, names);
  ASSERT_TRUE(n.ok());
  EXPECT_NE(std::string(names.data(), *n).find("user.ckpt"), std::string::npos);
  ASSERT_OK(env->RemoveXattr(path, "user.ckpt"));
  EXPECT_EQ(env->GetXattr(path, "user.ckpt", {}).status().code(), ENODATA);
}

// A device that accepts nothing: pwrite returns 0.
class ZeroWriteEnv : public FaultEnv {
 public:
  Result<size_t> PWrite(int, std::span<const uint8_t>, uint64_t) override { return size_t{0}; }
};

TEST(EnvTest, PWriteAllTreatsZeroWriteAsENOSPC) {
  TempDir dir;
  ZeroWriteEnv env;
  auto fd = env.OpenAt(AT_FDCWD, dir.Sub("f"), O_CREAT | O_RDWR, 0600);
  ASSERT_TRUE(fd.ok());
  Status s = env.PWriteAll(fd->get(), AsBytes("abc"), 0);
  EXPECT_EQ(s.code(), ENOSPC);
}

TEST(EnvTest, PWriteAllAbsorbsShortWrites) {
  TempDir dir;
  FaultEnv env;
  env.SetShortWrites(true);
  auto fd = env.OpenAt(AT_FDCWD, dir.Sub("f"), O_CREAT | O_RDWR, 0600);
  ASSERT_TRUE(fd.ok());
  std::vector<uint8_t> data = test::RandomBytes(1000, 1);
  ASSERT_OK(env.PWriteAll(fd->get(), data, 10));
  EXPECT_GT(env.calls(FaultEnv::kPWrite), 5u);  // 500, 250, 125, ...
  std::vector<uint8_t> back(1000);
  ASSERT_OK(env.PReadExact(fd->get(), back, 10));
  EXPECT_EQ(back, data);
}

std::string FileText(const std::string& path) {
  std::vector<uint8_t> b = test::ReadFileBytes(path);
  return std::string(b.begin(), b.end());
}

TEST(EnvFilesTest, ReadFileToStringIsBounded) {
  TempDir dir;
  Env* env = Env::Default();
  test::WriteFileBytes(dir.Sub("f"), {'1', '2', '3', '4'});
  UniqueFd root = std::move(env->OpenAt(AT_FDCWD, dir.path(), O_RDONLY | O_DIRECTORY)).value();
  Result<std::string> whole = ReadFileToString(env, root.get(), "f", 4);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(*whole, "1234");
  Result<std::string> over = ReadFileToString(env, root.get(), "f", 3);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), EFBIG);
  EXPECT_NE(over.status().ToString().find("larger than the 3 bytes"), std::string::npos) << over.status().ToString();
  EXPECT_EQ(ReadFileToString(env, root.get(), "missing", 4).status().code(), ENOENT);
}

// Under power loss, each durability keeps what it promises: kData the
// bytes (a rename may be lost), kDataAndName the new file under its name.
TEST(EnvFilesTest, WriteFileAtomicallyKeepsWhatItsDurabilitySays) {
  for (Durability durability : {Durability::kData, Durability::kDataAndName}) {
    TempDir dir;
    test::WriteFileBytes(dir.Sub("rec"), {'o', 'l', 'd'});
    FaultEnv env;
    ASSERT_OK(env.EnablePowerLoss(dir.path()));
    {
      UniqueFd root = std::move(env.OpenAt(AT_FDCWD, dir.path(), O_RDONLY | O_DIRECTORY)).value();
      ASSERT_OK(WriteFileAtomically(&env, root.get(), "rec", "new", 0600, durability));
      EXPECT_EQ(FileText(dir.Sub("rec")), "new");
    }
    ASSERT_OK(env.PowerOff());
    const bool named = durability == Durability::kDataAndName;
    EXPECT_EQ(FileText(dir.Sub("rec")), named ? "new" : "old");
    EXPECT_FALSE(std::filesystem::exists(dir.Sub("rec.tmp")));
  }
}

TEST(EnvFilesTest, WriteFileAtomicallyFailureLeavesTheOldFile) {
  TempDir dir;
  test::WriteFileBytes(dir.Sub("rec"), {'o', 'l', 'd'});
  FaultEnv env;
  UniqueFd root = std::move(env.OpenAt(AT_FDCWD, dir.path(), O_RDONLY | O_DIRECTORY)).value();
  env.FailNth(FaultEnv::kFdatasync, 1, EIO);
  EXPECT_EQ(WriteFileAtomically(&env, root.get(), "rec", "new", 0600, Durability::kData).code(), EIO);
  EXPECT_EQ(FileText(dir.Sub("rec")), "old");
}

TEST(EnvFilesTest, EnsureDirSyncsANewDirectoryIntoItsParentWhenAsked) {
  for (Durability durability : {Durability::kData, Durability::kDataAndName}) {
    TempDir dir;
    FaultEnv env;
    ASSERT_OK(env.EnablePowerLoss(dir.path()));
    {
      UniqueFd root = std::move(env.OpenAt(AT_FDCWD, dir.path(), O_RDONLY | O_DIRECTORY)).value();
      Result<UniqueFd> made = EnsureDir(&env, root.get(), "sub", 0700, durability);
      ASSERT_TRUE(made.ok()) << made.status().ToString();
      Result<UniqueFd> again = EnsureDir(&env, root.get(), "sub", 0700, durability);
      ASSERT_TRUE(again.ok()) << again.status().ToString();  // EEXIST is success
    }
    ASSERT_OK(env.PowerOff());
    EXPECT_EQ(std::filesystem::is_directory(dir.Sub("sub")), durability == Durability::kDataAndName);
  }
}

// Writes 4 windows in pieces that straddle them: each full window is
// started once, and every one but the last two is waited for and dropped.
TEST(WriteBehindTest, StartsEachWindowAndDropsAllButTheLastTwo) {
  TempDir dir;
  FaultEnv env;
  auto fd = env.OpenAt(AT_FDCWD, dir.Sub("f"), O_CREAT | O_RDWR, 0600);
  ASSERT_TRUE(fd.ok());
  constexpr uint64_t kWindow = 64 << 10;
  WriteBehind behind(&env, fd->get(), kWindow);
  std::vector<uint8_t> data = test::RandomBytes(4 * kWindow + 1000, 2);
  for (uint64_t pos = 0; pos < data.size(); pos += 40000) {
    const uint64_t n = std::min<uint64_t>(40000, data.size() - pos);
    ASSERT_OK(env.PWriteAll(fd->get(), std::span(data).subspan(pos, n), pos));
    behind.Wrote(pos + n);
  }
  EXPECT_EQ(env.calls(FaultEnv::kSyncFileRange), 4u + 3u);  // 4 starts, 3 waits
  EXPECT_EQ(env.calls(FaultEnv::kFadvise), 3u);
  std::vector<uint8_t> back(data.size());
  ASSERT_OK(env.PReadExact(fd->get(), back, 0));
  EXPECT_EQ(back, data);
}

// It is advice: calls that fail change nothing about what is written.
TEST(WriteBehindTest, FailedCallsLoseNothing) {
  TempDir dir;
  FaultEnv env;
  env.FailNth(FaultEnv::kSyncFileRange, 1, EIO, /*sticky=*/true);
  env.FailNth(FaultEnv::kFadvise, 1, EIO, /*sticky=*/true);
  auto fd = env.OpenAt(AT_FDCWD, dir.Sub("f"), O_CREAT | O_RDWR, 0600);
  ASSERT_TRUE(fd.ok());
  WriteBehind behind(&env, fd->get(), 4096);
  std::vector<uint8_t> data = test::RandomBytes(10 * 4096, 3);
  ASSERT_OK(env.PWriteAll(fd->get(), data, 0));
  behind.Wrote(data.size());
  EXPECT_GE(env.injected(), 1u);
  ASSERT_OK(env.Fdatasync(fd->get()));
  std::vector<uint8_t> back(data.size());
  ASSERT_OK(env.PReadExact(fd->get(), back, 0));
  EXPECT_EQ(back, data);
}

// A file of `n` random bytes in `dir`, opened read-only through `env`.
UniqueFd RandomFile(FaultEnv* env, const TempDir& dir, const std::vector<uint8_t>& data) {
  auto w = env->OpenAt(AT_FDCWD, dir.Sub("f"), O_CREAT | O_WRONLY, 0600);
  EXPECT_TRUE(w.ok());
  EXPECT_OK(env->PWriteAll(w->get(), data, 0));
  auto r = env->OpenAt(AT_FDCWD, dir.Sub("f"), O_RDONLY);
  EXPECT_TRUE(r.ok());
  return std::move(*r);
}

// Offsets and lengths off the 4 KiB grid, up to the file's unaligned end.
TEST(DirectReaderTest, UnalignedReadsMatchTheFile) {
  TempDir dir;
  FaultEnv env;
  const std::vector<uint8_t> data = test::RandomBytes((1 << 20) + 777, 4);
  UniqueFd fd = RandomFile(&env, dir, data);
  DirectReader direct(&env, fd.get());
  if (!direct.Covers(DirectReader::kMinDirectRead)) GTEST_SKIP() << "the file system under /tmp refuses O_DIRECT";
  const std::pair<uint64_t, size_t> cases[] = {
      {0, DirectReader::kMinDirectRead}, {1, 300000}, {4095, 500001}, {123456, data.size() - 123456}, {0, data.size()}};
  for (auto [off, len] : cases) {
    std::vector<uint8_t> out(len);
    ASSERT_OK(direct.ReadExact(out, off));
    EXPECT_TRUE(std::equal(out.begin(), out.end(), data.begin() + static_cast<ptrdiff_t>(off))) << off << "+" << len;
  }
}

// ReadIn leaves the bytes where the aligned read put them; a room that is
// unaligned or too small is refused before any read.
TEST(DirectReaderTest, ReadInLandsTheBytesInTheRoom) {
  TempDir dir;
  FaultEnv env;
  const std::vector<uint8_t> data = test::RandomBytes((1 << 20) + 333, 7);
  UniqueFd fd = RandomFile(&env, dir, data);
  FdPackBytes pack(&env, std::move(fd));
  const std::pair<uint64_t, size_t> cases[] = {{0, 300000}, {4097, 500001}, {777, data.size() - 777}, {5, 100}};
  for (auto [off, len] : cases) {
    AlignedBuffer buf;
    const std::span<uint8_t> room = buf.Get(pack.RoomFor(len));
    Result<std::span<const uint8_t>> got = pack.ReadIn(room, off, len);
    ASSERT_OK(got.status());
    ASSERT_EQ(got->size(), len);
    EXPECT_GE(got->data(), room.data());
    EXPECT_TRUE(std::equal(got->begin(), got->end(), data.begin() + static_cast<ptrdiff_t>(off))) << off << "+" << len;
  }
  UniqueFd again = RandomFile(&env, dir, data);
  DirectReader direct(&env, again.get());
  if (!direct.Covers(DirectReader::kMinDirectRead)) GTEST_SKIP() << "the file system under /tmp refuses O_DIRECT";
  AlignedBuffer buf;
  const std::span<uint8_t> room = buf.Get(DirectReader::RoomFor(300000));
  EXPECT_EQ(direct.ReadIn(room.subspan(1), 0, 300000).status().code(), EINVAL);     // unaligned
  EXPECT_EQ(direct.ReadIn(room.first(300000), 0, 300000).status().code(), EINVAL);  // under the 4 KiB grid
  ASSERT_OK(direct.ReadIn(room, 0, 300000).status());
}

// From 2 MiB an AlignedBuffer is on huge pages (base/huge_pages.h): still
// aligned for O_DIRECT (to 2 MiB), kept when a smaller room is asked for,
// and a pack read of several MiB lands in it intact.
TEST(DirectReaderTest, LargeRoomsAreHugePagesAndReadsLandInThem) {
  AlignedBuffer buf;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.Get(100).data()) % DirectReader::kAlign, 0u);
  const std::span<uint8_t> big = buf.Get((3 << 20) + 5);
  ASSERT_EQ(big.size(), (3u << 20) + 5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % kHugePage, 0u);
  std::fill(big.begin(), big.end(), uint8_t{0x5A});
  EXPECT_EQ(buf.Get(1 << 20).data(), big.data());
  TempDir dir;
  FaultEnv env;
  const std::vector<uint8_t> data = test::RandomBytes((5 << 20) + 77, 9);
  FdPackBytes pack(&env, RandomFile(&env, dir, data));
  const size_t len = (3 << 20) + 1000;
  Result<std::span<const uint8_t>> got = pack.ReadIn(buf.Get(pack.RoomFor(len)), 4096 + 17, len);
  ASSERT_OK(got.status());
  EXPECT_TRUE(std::equal(got->begin(), got->end(), data.begin() + 4096 + 17));
}

TEST(DirectReaderTest, ReadPastTheEndIsAnError) {
  TempDir dir;
  FaultEnv env;
  const std::vector<uint8_t> data = test::RandomBytes(600000, 5);
  UniqueFd fd = RandomFile(&env, dir, data);
  DirectReader direct(&env, fd.get());
  if (!direct.Covers(DirectReader::kMinDirectRead)) GTEST_SKIP() << "the file system under /tmp refuses O_DIRECT";
  std::vector<uint8_t> out(300000);
  Status s = direct.ReadExact(out, data.size() - 1000);
  EXPECT_EQ(s.code(), EIO) << s.ToString();
  EXPECT_NE(s.ToString().find("short read"), std::string::npos) << s.ToString();
}

// Where the file system refuses the O_DIRECT open, a pack file's reads
// stay buffered and return the same bytes.
TEST(DirectReaderTest, RefusedOpenLeavesReadsBuffered) {
  TempDir dir;
  FaultEnv env;
  const std::vector<uint8_t> data = test::RandomBytes(700000, 6);
  UniqueFd fd = RandomFile(&env, dir, data);
  env.FailNth(FaultEnv::kOpen, 1, EINVAL);
  FdPackBytes pack(&env, std::move(fd));
  EXPECT_EQ(env.injected(), 1u);
  std::vector<uint8_t> out(data.size() - 3);
  ASSERT_OK(pack.ReadExact(out, 3));
  EXPECT_TRUE(std::equal(out.begin(), out.end(), data.begin() + 3));
}

TEST(ObjectIdTest, HexRoundTrip) {
  for (int i = 0; i < 100; ++i) {
    ObjectId id = NewObjectId();
    EXPECT_NE(id, 0u);
    std::string hex = ObjectIdHex(id);
    EXPECT_EQ(hex.size(), 16u);
    EXPECT_EQ(ParseObjectIdHex(hex), id);
  }
  EXPECT_EQ(ObjectIdHex(0xabc), "0000000000000abc");
  EXPECT_EQ(ParseObjectIdHex("0000000000000abc"), 0xabcu);
  EXPECT_FALSE(ParseObjectIdHex("0000000000000ABC"));  // lowercase only
  EXPECT_FALSE(ParseObjectIdHex("abc"));
  EXPECT_FALSE(ParseObjectIdHex("0000000000000abcd"));
  EXPECT_FALSE(ParseObjectIdHex("000000000000zabc"));
  EXPECT_FALSE(ParseObjectIdHex("0000000000000000"));  // 0 names no object
  EXPECT_NE(NewObjectId(), NewObjectId());
}

}  // namespace
}  // namespace ckptfs
