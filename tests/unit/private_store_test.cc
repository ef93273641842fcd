// The backing store is private to the daemon's user (store/private_store.h).
#include "store/private_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "store/store.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

namespace fs = std::filesystem;
using test::MakeSealedFile;
using test::MakeStagedFile;
using test::SmallChunks;
using test::TempDir;

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// Mode of the store root and of everything in it but ns/.
std::map<std::string, mode_t> InternalModes(const std::string& root) {
  std::map<std::string, mode_t> out{{".", ModeOf(root)}};
  for (const auto& e : fs::directory_iterator(root)) {
    if (e.path().filename() == "ns" || e.is_symlink()) continue;
    out[e.path().filename()] = ModeOf(e.path());
    if (!e.is_directory()) continue;
    for (const auto& sub : fs::recursive_directory_iterator(e.path()))
      out[fs::relative(sub.path(), root)] = ModeOf(sub.path());
  }
  return out;
}

void ExpectPrivate(const std::string& root) {
  for (const auto& [rel, mode] : InternalModes(root)) {
    const bool dir = fs::is_directory(root + "/" + rel);
    EXPECT_EQ(mode, dir ? kPrivateDirMode : kPrivateFileMode) << rel << " is " << std::oct << mode;
  }
}

std::unique_ptr<Store> MustOpen(const std::string& path) {
  auto s = Store::Open(Env::Default(), path, SmallChunks());
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

// Whatever the process umask, what the store creates for itself is private
// and ns/ has a file system root's mode.
TEST(PrivateStoreTest, NewStoreIsPrivateUnderAnyUmask) {
  for (mode_t umask : {0, 022, 077}) {  // 077 is the daemon's
    const mode_t old = ::umask(umask);
    TempDir parent;
    const std::string root = parent.Sub("store");  // created by Store::Open
    {
      auto store = MustOpen(root);
      ASSERT_NE(store, nullptr);
      ASSERT_TRUE(MakeSealedFile(store.get(), "sealed", test::RandomBytes(20000, 1)).ok());
      ASSERT_TRUE(MakeStagedFile(store.get(), "staged", test::RandomBytes(5000, 2)).ok());
      EXPECT_TRUE(store->made_private().empty());
    }
    ::umask(old);
    EXPECT_GE(test::CountFiles(root + "/packs", true), 1u);
    EXPECT_GE(test::CountFiles(root + "/staging"), 1u);
    ExpectPrivate(root);
    EXPECT_EQ(ModeOf(root + "/ns"), kNamespaceRootMode) << "umask " << std::oct << umask;
  }
}

TEST(PrivateStoreTest, LooseStoreIsTightenedAndReported) {
  TempDir dir;
  {
    auto store = MustOpen(dir.path());
    ASSERT_TRUE(MakeSealedFile(store.get(), "f", test::RandomBytes(20000, 3)).ok());
  }
  // What earlier versions left behind; ns/ entries keep their logical modes.
  for (const auto& [rel, mode] : InternalModes(dir.path()))
    ::chmod((dir.path() + "/" + rel).c_str(), fs::is_directory(dir.Sub(rel)) ? 0755 : 0644);
  ASSERT_EQ(::chmod(dir.Sub("ns/f").c_str(), 0644), 0);
  ASSERT_EQ(::symlink("packs", dir.Sub("a-symlink").c_str()), 0);  // never followed

  auto store = MustOpen(dir.path());
  ASSERT_NE(store, nullptr);
  ExpectPrivate(dir.path());
  EXPECT_EQ(ModeOf(dir.Sub("ns/f")), 0644u);
  std::string all;
  for (const std::string& line : store->made_private()) all += line + "\n";
  EXPECT_NE(all.find("made " + dir.path() + " private: 0755 -> 0700"), std::string::npos) << all;
  EXPECT_NE(all.find(dir.path() + "/packs private"), std::string::npos) << all;
  EXPECT_NE(all.find(dir.path() + "/CKPTFS private"), std::string::npos) << all;
  EXPECT_EQ(all.find("/ns"), std::string::npos) << all;

  store.reset();
  EXPECT_TRUE(MustOpen(dir.path())->made_private().empty());
}

TEST(PrivateStoreTest, RootOthersCanWriteIsRefusedAndLeftAlone) {
  for (mode_t mode : {0777, 0770, 0703, 01777}) {
    TempDir dir;
    ASSERT_EQ(::chmod(dir.path().c_str(), mode), 0);
    auto r = Store::Open(Env::Default(), dir.path(), SmallChunks());
    ASSERT_FALSE(r.ok()) << std::oct << mode;
    EXPECT_EQ(r.status().code(), EPERM);
    EXPECT_NE(r.status().message().find("writable by"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("chmod go-w " + dir.path()), std::string::npos) << r.status().message();
    EXPECT_TRUE(fs::is_empty(dir.path()));
    EXPECT_EQ(ModeOf(dir.path()), mode);
  }
}

TEST(PrivateStoreTest, ReadOnlyToolsNeitherRefuseNorTighten) {
  TempDir dir;
  { ASSERT_NE(MustOpen(dir.path()), nullptr); }
  ASSERT_EQ(::chmod(dir.path().c_str(), 0777), 0);
  StoreOptions ro = SmallChunks();
  ro.create_if_missing = false;
  ro.take_lock = false;
  auto r = Store::Open(Env::Default(), dir.path(), ro);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(ModeOf(dir.path()), 0777u);
  ::chmod(dir.path().c_str(), 0700);
}

TEST(PrivateStoreTest, ParentsOthersCanChangeAreNamed) {
  TempDir dir;
  const std::string loose = dir.Sub("loose");
  ASSERT_EQ(::mkdir(loose.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(loose.c_str(), 0777), 0);
  const std::string backing = loose + "/store";
  auto has = [&](const std::vector<std::string>& lines, const std::string& what) {
    for (const std::string& l : lines)
      if (l.find(what) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has(LooseParentsOf(Env::Default(), backing), "parent " + loose + " of the store (mode 0777"));
  ASSERT_EQ(::chmod(loose.c_str(), 01777), 0);  // sticky, like /tmp: others cannot replace our entries
  EXPECT_FALSE(has(LooseParentsOf(Env::Default(), backing), "parent " + loose + " "));
  ASSERT_EQ(::chmod(loose.c_str(), 0755), 0);
  EXPECT_FALSE(has(LooseParentsOf(Env::Default(), backing), "parent " + loose + " "));
}

}  // namespace
}  // namespace ckptfs
