// The CRC pass run ahead of the pack's pass (store/leading_pass.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "store/leading_pass.h"

namespace ckptfs {
namespace {

TEST(LeadingPass, RunsEachChunkOnceAndStopsAtTheFirstFailure) {
  LeadingPass pass(10 * 100 + 7, 100);
  std::vector<int> runs(11, 0);
  auto run = [&](uint64_t off, uint64_t len) -> Status {
    ++runs[off / 100];
    EXPECT_EQ(len, off == 1000 ? 7u : 100u);
    return Status::Ok();
  };
  EXPECT_TRUE(pass.RunThrough(250, run).ok());
  EXPECT_EQ(std::count(runs.begin(), runs.end(), 1), 3);  // chunks 0, 1, 2
  EXPECT_TRUE(pass.RunThrough(100, run).ok());
  EXPECT_TRUE(pass.RunThrough(5000, run).ok());
  EXPECT_EQ(runs, std::vector<int>(11, 1));
  LeadingPass failing(1000, 100);
  auto fail_at_3 = [](uint64_t off, uint64_t) {
    return off == 300 ? Status::Error(EIO, "chunk 3 unreadable") : Status::Ok();
  };
  EXPECT_TRUE(failing.RunThrough(300, fail_at_3).ok());
  EXPECT_EQ(failing.RunThrough(1000, fail_at_3).message(), "chunk 3 unreadable");
  EXPECT_FALSE(failing.RunThrough(100, fail_at_3).ok());
}

}  // namespace
}  // namespace ckptfs
