// The power-loss model of FaultEnv (store/fault_env.h): after PowerOff, the
// tree holds exactly what fsync and directory fsync made durable.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "tests/unit/fault_env.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using test::TempDir;

std::span<const uint8_t> Bytes(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

std::string Text(const std::string& path) {
  std::vector<uint8_t> b = test::ReadFileBytes(path);
  return std::string(b.begin(), b.end());
}

bool Exists(const std::string& path) { return std::filesystem::exists(std::filesystem::symlink_status(path)); }

// A FaultEnv recording power loss under a fresh directory `root`/, with
// `root`/old (content "old", present before recording began) and
// `root`/d/ (an empty directory).
struct Disk {
  TempDir dir;
  FaultEnv env;
  UniqueFd root;
  Disk() {
    test::WriteFileBytes(dir.Sub("old"), {'o', 'l', 'd'});
    std::filesystem::create_directory(dir.Sub("d"));
    EXPECT_OK(env.EnablePowerLoss(dir.path()));
    root = std::move(env.OpenAt(AT_FDCWD, dir.path(), O_RDONLY | O_DIRECTORY)).value();
  }
  UniqueFd Open(const std::string& name, int flags) {
    Result<UniqueFd> fd = env.OpenAt(root.get(), name, flags, 0644);
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    return fd.ok() ? std::move(fd).value() : UniqueFd();
  }
  void Write(int fd, const std::string& s, uint64_t off = 0) { EXPECT_OK(env.PWriteAll(fd, Bytes(s), off)); }
  void SyncDir(const std::string& name) {
    UniqueFd d = Open(name, O_RDONLY | O_DIRECTORY);
    EXPECT_OK(env.Fsync(d.get()));
  }
  // The machine comes back up: root is opened again.
  void PowerOff() {
    root.reset();
    ASSERT_OK(env.PowerOff());
    root = std::move(env.OpenAt(AT_FDCWD, dir.path(), O_RDONLY | O_DIRECTORY)).value();
  }
};

TEST(PowerLossTest, UnsyncedDataIsDropped) {
  Disk d;
  UniqueFd fd = d.Open("old", O_RDWR);
  d.Write(fd.get(), "OLD, rewritten");
  fd.reset();
  d.PowerOff();
  EXPECT_EQ(Text(d.dir.Sub("old")), "old");
}

TEST(PowerLossTest, FsyncedDataSurvivesAndLaterWritesAreDropped) {
  for (bool datasync : {false, true}) {
    Disk d;
    UniqueFd fd = d.Open("old", O_RDWR);
    d.Write(fd.get(), "OLD, rewritten");
    ASSERT_OK(datasync ? d.env.Fdatasync(fd.get()) : d.env.Fsync(fd.get()));
    d.Write(fd.get(), "X", 1);                // a random write in the middle
    ASSERT_OK(d.env.Ftruncate(fd.get(), 3));  // and a truncate
    fd.reset();
    d.PowerOff();
    EXPECT_EQ(Text(d.dir.Sub("old")), "OLD, rewritten") << datasync;
  }
}

TEST(PowerLossTest, TruncatingOpenIsUndone) {
  Disk d;
  d.Open("old", O_WRONLY | O_TRUNC);
  d.PowerOff();
  EXPECT_EQ(Text(d.dir.Sub("old")), "old");
}

TEST(PowerLossTest, NewFileNeedsItsDirectorySynced) {
  {  // the file fsync'd, its directory not: gone
    Disk d;
    UniqueFd fd = d.Open("new", O_CREAT | O_EXCL | O_RDWR);
    d.Write(fd.get(), "new");
    ASSERT_OK(d.env.Fsync(fd.get()));
    fd.reset();
    d.PowerOff();
    EXPECT_FALSE(Exists(d.dir.Sub("new")));
    EXPECT_EQ(Text(d.dir.Sub("old")), "old");
  }
  {  // the directory fsync'd, the file not: there, but empty
    Disk d;
    UniqueFd fd = d.Open("new", O_CREAT | O_EXCL | O_RDWR);
    d.Write(fd.get(), "new");
    d.SyncDir(".");
    fd.reset();
    d.PowerOff();
    ASSERT_TRUE(Exists(d.dir.Sub("new")));
    EXPECT_EQ(Text(d.dir.Sub("new")), "");
  }
  {  // both: there, whole
    Disk d;
    UniqueFd fd = d.Open("d/new", O_CREAT | O_EXCL | O_RDWR);
    d.Write(fd.get(), "new");
    ASSERT_OK(d.env.Fdatasync(fd.get()));
    d.SyncDir("d");
    fd.reset();
    d.PowerOff();
    EXPECT_EQ(Text(d.dir.Sub("d/new")), "new");
  }
}

TEST(PowerLossTest, NewDirectoryNeedsItsParentSynced) {
  Disk d;
  ASSERT_OK(d.env.MkdirAt(d.root.get(), "sub", 0755));
  UniqueFd fd = d.Open("sub/f", O_CREAT | O_EXCL | O_RDWR);
  d.Write(fd.get(), "f");
  ASSERT_OK(d.env.Fsync(fd.get()));
  d.SyncDir("sub");
  fd.reset();
  d.PowerOff();
  EXPECT_FALSE(Exists(d.dir.Sub("sub")));  // everything in it goes with it

  ASSERT_OK(d.env.MkdirAt(d.root.get(), "sub", 0755));
  d.SyncDir(".");
  d.PowerOff();
  EXPECT_TRUE(std::filesystem::is_directory(d.dir.Sub("sub")));
}

TEST(PowerLossTest, UnlinkNeedsItsDirectorySynced) {
  {
    Disk d;
    ASSERT_OK(d.env.UnlinkAt(d.root.get(), "old"));
    // The inode number may be reused at once: the old file must still come back.
    UniqueFd fd = d.Open("other", O_CREAT | O_EXCL | O_RDWR);
    d.Write(fd.get(), "other");
    ASSERT_OK(d.env.Fsync(fd.get()));
    fd.reset();
    d.PowerOff();
    EXPECT_EQ(Text(d.dir.Sub("old")), "old");
    EXPECT_FALSE(Exists(d.dir.Sub("other")));
  }
  {
    Disk d;
    ASSERT_OK(d.env.UnlinkAt(d.root.get(), "old"));
    d.SyncDir(".");
    d.PowerOff();
    EXPECT_FALSE(Exists(d.dir.Sub("old")));
  }
  {
    Disk d;
    ASSERT_OK(d.env.UnlinkAt(d.root.get(), "d", AT_REMOVEDIR));
    d.PowerOff();
    EXPECT_TRUE(std::filesystem::is_directory(d.dir.Sub("d")));
  }
}

TEST(PowerLossTest, RenameNeedsItsDirectoriesSynced) {
  // tmp + rename over a file: without a directory fsync the old version stays.
  auto replace = [](Disk& d) {
    UniqueFd fd = d.Open("tmp", O_CREAT | O_EXCL | O_RDWR);
    d.Write(fd.get(), "new");
    EXPECT_OK(d.env.Fsync(fd.get()));
    EXPECT_OK(d.env.RenameAt(d.root.get(), "tmp", d.root.get(), "old"));
  };
  {
    Disk d;
    replace(d);
    d.PowerOff();
    EXPECT_EQ(Text(d.dir.Sub("old")), "old");
    EXPECT_FALSE(Exists(d.dir.Sub("tmp")));
  }
  {
    Disk d;
    replace(d);
    d.SyncDir(".");
    d.PowerOff();
    EXPECT_EQ(Text(d.dir.Sub("old")), "new");
    EXPECT_FALSE(Exists(d.dir.Sub("tmp")));
  }
  {  // across directories, only the destination synced: both names remain
    Disk d;
    ASSERT_OK(d.env.RenameAt(d.root.get(), "old", d.root.get(), "d/moved"));
    d.SyncDir("d");
    d.PowerOff();
    EXPECT_EQ(Text(d.dir.Sub("old")), "old");
    EXPECT_EQ(Text(d.dir.Sub("d/moved")), "old");
  }
  {  // only the source synced: gone from both (a rename is not atomic across a cut)
    Disk d;
    ASSERT_OK(d.env.RenameAt(d.root.get(), "old", d.root.get(), "d/moved"));
    d.SyncDir(".");
    d.PowerOff();
    EXPECT_FALSE(Exists(d.dir.Sub("old")));
    EXPECT_FALSE(Exists(d.dir.Sub("d/moved")));
  }
}

TEST(PowerLossTest, HardLinksSymlinksAndModesComeBack) {
  Disk d;
  ASSERT_OK(d.env.LinkAt(d.root.get(), "old", d.root.get(), "d/link", 0));
  ASSERT_OK(d.env.SymlinkAt("../old", d.root.get(), "d/sym"));
  ASSERT_OK(d.env.FchmodAt(d.root.get(), "old", 0600, 0));
  d.SyncDir("d");
  d.PowerOff();
  struct stat a {
  }, b{};
  ASSERT_EQ(::stat(d.dir.Sub("old").c_str(), &a), 0);
  ASSERT_EQ(::stat(d.dir.Sub("d/link").c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  EXPECT_EQ(a.st_nlink, 2u);
  EXPECT_EQ(std::filesystem::read_symlink(d.dir.Sub("d/sym")), "../old");
  EXPECT_EQ(Text(d.dir.Sub("d/sym")), "old");
}

TEST(PowerLossTest, RecordingStartsAfreshAfterPowerOff) {
  Disk d;
  UniqueFd fd = d.Open("old", O_RDWR);
  d.Write(fd.get(), "one");
  ASSERT_OK(d.env.Fsync(fd.get()));
  fd.reset();
  d.PowerOff();
  fd = d.Open("old", O_RDWR);
  d.Write(fd.get(), "two");
  fd.reset();
  d.PowerOff();
  EXPECT_EQ(Text(d.dir.Sub("old")), "one");
}

TEST(PowerLossTest, CallsOutsideTheRootAreNotRecorded) {
  Disk d;
  TempDir other;
  auto fd = d.env.OpenAt(AT_FDCWD, other.Sub("f"), O_CREAT | O_RDWR, 0644);
  ASSERT_TRUE(fd.ok());
  ASSERT_OK(d.env.PWriteAll(fd->get(), Bytes("x"), 0));
  fd->reset();
  d.PowerOff();
  EXPECT_EQ(Text(other.Sub("f")), "x");
}

}  // namespace
}  // namespace ckptfs
