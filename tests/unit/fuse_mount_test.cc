// FuseMount (fuse/mount.h) owns its FUSE session: a mount that is never
// served, as when the daemon cannot fork after mounting, is unmounted and
// its session destroyed when the FuseMount goes.
#include <sys/stat.h>
#include <unistd.h>

#include "fuse/mount.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

TEST(FuseMountTest, AMountNeverServedIsUnmountedWhenDestroyed) {
  if (::geteuid() != 0 || ::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "needs root and /dev/fuse";
  test::TempDir dir;
  const std::string backing = dir.Sub("backing"), mnt = dir.Sub("mnt");
  ASSERT_EQ(::mkdir(backing.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir(mnt.c_str(), 0700), 0);
  auto store = Store::Open(Env::Default(), backing, StoreOptions{});
  ASSERT_TRUE(store.ok()) << store.status().message();
  {
    auto mount = FuseMount::Mount(store->get(), backing, mnt, FuseOptions{});
    if (!mount.ok()) GTEST_SKIP() << "cannot mount here: " << mount.status().message();
    const std::optional<MountEntry> entry = FuseMountAt(mnt);
    ASSERT_TRUE(entry.has_value()) << mnt << " is not mounted";
    EXPECT_EQ(entry->source, backing);
    EXPECT_EQ(entry->fstype, "fuse.ckptfs");
  }
  EXPECT_FALSE(FuseMountAt(mnt).has_value()) << "destroying the FuseMount left " << mnt << " mounted";
}

}  // namespace
}  // namespace ckptfs
