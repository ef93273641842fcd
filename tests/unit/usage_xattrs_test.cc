// The usage attributes' names and values (store/usage_xattrs.h); the mount
// serving them is tested in tests/integration/test_python_package.py.
#include "store/usage_xattrs.h"

#include <gtest/gtest.h>

#include "store/lossy_xattrs.h"

namespace ckptfs {
namespace {

TEST(UsageXattrs, NamesAreOursAndNoOthers) {
  for (const char* n : {"user.ckptfs.state", "user.ckptfs.logical", "user.ckptfs.stored", "user.ckptfs.depth",
                        "user.ckptfs.pack", "user.ckptfs.base", "user.ckptfs.codecs", "user.ckptfs.effective_policy"})
    EXPECT_TRUE(IsUsageXattr(n)) << n;
  // The policy stays settable, the lossy ones are lossy_xattrs.h's, and other names are the user's.
  for (const char* n : {"user.ckptfs.policy", "user.ckptfs.lossy.fidelity", "user.ckptfs.", "user.ckptfs.statex",
                        "user.state", "trusted.ckptfs.state"})
    EXPECT_FALSE(IsUsageXattr(n)) << n;
  EXPECT_FALSE(IsLossyXattr("user.ckptfs.state"));
}

TEST(UsageXattrs, SealedFileValues) {
  FileUsage u;
  u.logical = 1000;
  u.stored = 400;
  u.pack = 0x0123456789abcdefull;
  u.base = 0xfedcba9876543210ull;
  u.depth = 2;
  u.codecs = {{ChunkCodec::kZstd, 1, 100, 40}, {ChunkCodec::kDelta, 2, 900, 300}};
  EXPECT_EQ(UsageXattr(u, "user.ckptfs.state"), "sealed");
  EXPECT_EQ(UsageXattr(u, "user.ckptfs.logical"), "1000");
  EXPECT_EQ(UsageXattr(u, "user.ckptfs.stored"), "400");
  EXPECT_EQ(UsageXattr(u, "user.ckptfs.depth"), "2");
  EXPECT_EQ(UsageXattr(u, "user.ckptfs.pack"), "0123456789abcdef");
  EXPECT_EQ(UsageXattr(u, "user.ckptfs.base"), "fedcba9876543210");
  EXPECT_EQ(UsageXattr(u, "user.ckptfs.codecs"), "zstd:1:100:40 delta:2:900:300");
  EXPECT_EQ(UsageXattr(u, "user.ckptfs.effective_policy"), std::nullopt);  // the mount answers that one
}

TEST(UsageXattrs, StagedAndStandaloneFilesHaveNoPackBaseOrCodecs) {
  FileUsage staged;
  staged.staged = true;
  staged.logical = 5;
  EXPECT_EQ(UsageXattr(staged, "user.ckptfs.state"), "staged");
  EXPECT_EQ(UsageXattr(staged, "user.ckptfs.logical"), "5");
  for (const char* n : {"user.ckptfs.pack", "user.ckptfs.base", "user.ckptfs.codecs"})
    EXPECT_EQ(UsageXattr(staged, n), std::nullopt) << n;
  FileUsage alone;
  alone.pack = 7;
  EXPECT_EQ(UsageXattr(alone, "user.ckptfs.base"), std::nullopt);
  EXPECT_EQ(UsageXattr(alone, "user.ckptfs.codecs"), "");  // an empty pack: no chunks
}

}  // namespace
}  // namespace ckptfs
