// The user.ckptfs.lossy.* attributes made from a pack's lossy record
// (store/lossy_xattrs.cc).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "store/lossy_xattrs.h"
#include "tests/unit/lossy_test_util.h"

namespace ckptfs {
namespace {

TEST(LossyXattrs, NamesAndValues) {
  EXPECT_TRUE(LossyXattrs(std::nullopt).empty());
  auto attrs = LossyXattrs(MetaWithLossy().lossy);
  std::vector<std::pair<std::string, std::string>> want = {
      {"user.ckptfs.lossy.fidelity", "0.05"},
      {"user.ckptfs.lossy.scope", "all"},
      {"user.ckptfs.lossy.sensitivity", "sibling-second-moments"},
      {"user.ckptfs.lossy.measure", "relative"},
      {"user.ckptfs.lossy.target.weights", "0.05"},
      {"user.ckptfs.lossy.error.weights", "0.04"},
      {"user.ckptfs.lossy.target.second_moments", "0.5"},
      {"user.ckptfs.lossy.error.second_moments", "0.25"}};
  EXPECT_EQ(attrs, want);
  EXPECT_TRUE(IsLossyXattr("user.ckptfs.lossy.fidelity"));
  EXPECT_TRUE(IsLossyXattr("user.ckptfs.lossy.anything"));
  EXPECT_FALSE(IsLossyXattr("user.ckptfs.policy"));
  EXPECT_FALSE(IsLossyXattr("user.ckptfs.lossy"));
}

}  // namespace
}  // namespace ckptfs
