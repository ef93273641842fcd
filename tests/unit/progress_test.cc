// The progress line of export and import (mount-tools/progress.cc).
#include <gtest/gtest.h>

#include "mount-tools/progress.h"

namespace ckptfs {
namespace {

TEST(Progress, LineShowsBytesPercentRateAndEta) {
  EXPECT_EQ(Progress::Line("export", 1 << 20, 4 << 20, 0.5), "export  1.0 MiB / 4.0 MiB  25%  2.0 MiB/s  ETA 0:01");
  EXPECT_EQ(Progress::Line("import", 3u << 30, 3u << 30, 2), "import  3.0 GiB / 3.0 GiB  100%  1.5 GiB/s");
  EXPECT_EQ(Progress::Line("import", 0, 0, 0), "import  0 B / 0 B  0 B/s");
  EXPECT_EQ(Progress::Line("export", 100 << 20, 700u << 20, 100), "export  100.0 MiB / 700.0 MiB  14%  1.0 MiB/s  ETA 10:00");
}

TEST(Progress, DisabledDrawsNothingButCounts) {
  testing::internal::CaptureStderr();
  {
    Progress p("export", 10, false);
    p.Add(4);
    p.Add(6);
    EXPECT_EQ(p.done(), 10u);
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace ckptfs
