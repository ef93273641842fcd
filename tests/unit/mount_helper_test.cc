// ckptfs as a mount(8) helper (mount-tools/mount_helper.cc): the argument
// forms mount(8) and fuse3's mount.fuse use, and the fstab and systemd
// options the daemon leaves to them.
#include <gtest/gtest.h>

#include "mount-tools/mount_helper.h"

namespace ckptfs {
namespace {

HelperCall Parsed(const std::vector<std::string>& args) {
  auto call = ParseHelperCall(args);
  EXPECT_TRUE(call.ok()) << call.status().message();
  return call.ok() ? *call : HelperCall{};
}

TEST(MountHelper, NamesTheHelperOnlyByItsInstalledNames) {
  EXPECT_TRUE(IsMountHelperName("/sbin/mount.ckptfs"));
  EXPECT_TRUE(IsMountHelperName("/usr/sbin/mount.fuse.ckptfs"));
  EXPECT_TRUE(IsMountHelperName("mount.ckptfs"));
  EXPECT_FALSE(IsMountHelperName("/usr/bin/ckptfs"));
  EXPECT_FALSE(IsMountHelperName("/sbin/mount.fuse"));
}

TEST(MountHelper, TakesMountFusesFormButNoSubcommand) {
  const std::vector<std::string> subcommands = {"mount", "umount", "stats"};
  EXPECT_TRUE(IsMountFuseCall({"/srv/store", "/mnt/ckpt", "-o", "rw"}, subcommands));
  EXPECT_TRUE(IsMountFuseCall({"/srv/store", "/mnt/ckpt"}, subcommands));
  EXPECT_FALSE(IsMountFuseCall({"mount", "/srv/store", "/mnt/ckpt"}, subcommands));
  EXPECT_FALSE(IsMountFuseCall({"stats", "/mnt/ckpt"}, subcommands));
  EXPECT_FALSE(IsMountFuseCall({"--version"}, subcommands));
  EXPECT_FALSE(IsMountFuseCall({"/srv/store"}, subcommands));
  EXPECT_FALSE(IsMountFuseCall({"/srv/store", "-o", "rw"}, subcommands));
}

TEST(MountHelper, ParsesWhatMountPasses) {
  const HelperCall call =
      Parsed({"/srv/store", "/mnt/ckpt", "-n", "-o", "rw,allow_other,cache_size=64M,dev,suid", "-t", "fuse.ckptfs"});
  EXPECT_EQ(call.mount.backing, "/srv/store");
  EXPECT_EQ(call.mount.mountpoint, "/mnt/ckpt");
  EXPECT_EQ(call.mount.fuse.fs.cache_bytes, 64u << 20);
  EXPECT_EQ(call.mount.fuse.kernel_opts, (std::vector<std::string>{"rw", "allow_other", "dev", "suid"}));
  EXPECT_FALSE(call.fake);
  EXPECT_FALSE(call.mount.foreground);
}

TEST(MountHelper, LeavesFstabAndSystemdOptionsOut) {
  const HelperCall call = Parsed({"/srv/store", "/mnt/ckpt", "-o",
                                  "defaults,_netdev,nofail,noauto,x-systemd.automount,x-systemd.requires=a.mount,"
                                  "comment=x,lossy=0.05,users"});
  EXPECT_DOUBLE_EQ(call.mount.store.lossy, 0.05);
  EXPECT_TRUE(call.mount.fuse.kernel_opts.empty());
  EXPECT_EQ(call.dropped.size(), 8u);
  for (const char* o : {"_netdev", "nofail", "defaults", "x-systemd.idle-timeout=60", "comment=systemd.x"})
    EXPECT_TRUE(IsFstabOnlyOption(o)) << o;
  for (const char* o : {"allow_other", "rw", "lossy", "cache_size=1M"}) EXPECT_FALSE(IsFstabOnlyOption(o)) << o;
}

TEST(MountHelper, TakesFstabsCkptfsHashSource) {
  EXPECT_EQ(Parsed({"ckptfs#/srv/store", "/mnt/ckpt"}).mount.backing, "/srv/store");
}

TEST(MountHelper, OptionsMayComeAnywhereAndJoined) {
  const HelperCall call = Parsed({"-ozstd_level=5", "/srv/store", "-fv", "/mnt/ckpt", "-o", "delta=0"});
  EXPECT_EQ(call.mount.store.encoder.zstd_level, 5);
  EXPECT_FALSE(call.mount.store.delta);
  EXPECT_TRUE(call.fake);
}

TEST(MountHelper, UnknownOptionFailsUnlessSloppy) {
  auto strict = ParseHelperCall({"/srv/store", "/mnt/ckpt", "-o", "rw,frobnicate"});
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.status().message().find("frobnicate"), std::string::npos) << strict.status().message();
  const HelperCall sloppy = Parsed({"/srv/store", "/mnt/ckpt", "-s", "-o", "rw,frobnicate,cache_size=1M"});
  EXPECT_EQ(sloppy.dropped, (std::vector<std::string>{"frobnicate"}));
  EXPECT_EQ(sloppy.mount.fuse.fs.cache_bytes, 1u << 20);
  EXPECT_EQ(sloppy.mount.fuse.kernel_opts, (std::vector<std::string>{"rw"}));
}

TEST(MountHelper, RefusesWhatItCannotDo) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"/srv/store"},
                                             {"/srv/store", "/mnt/ckpt", "/extra"},
                                             {"/srv/store", "/mnt/ckpt", "-o"},
                                             {"/srv/store", "/mnt/ckpt", "-N", "/proc/1/ns/mnt"},
                                             {"/srv/store", "/mnt/ckpt", "-x"},
                                             {"/srv/store", "/mnt/ckpt", "-o", "cache_size=lots"}}) {
    auto call = ParseHelperCall(args);
    ASSERT_FALSE(call.ok()) << args.size();
    EXPECT_EQ(call.status().code(), EINVAL);
  }
}

}  // namespace
}  // namespace ckptfs
