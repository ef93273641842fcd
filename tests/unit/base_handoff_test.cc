// The base bytes the CRC pass hands to the pack's pass (store/base_handoff.cc).
#include <gtest/gtest.h>

#include <vector>

#include "store/base_handoff.h"

namespace ckptfs {
namespace {

TEST(BaseHandoff, HandsEachChunksBytesOverOnceWithinTheBudget) {
  BaseHandoff h(10);
  std::vector<uint8_t> a(6, 1), b(6, 2), out;
  h.Put(0, 7, 100, &a);
  EXPECT_TRUE(a.empty());
  h.Put(4096, 7, 200, &b);  // past the budget: kept by the caller
  EXPECT_EQ(b, std::vector<uint8_t>(6, 2));
  EXPECT_EQ(h.held(), 6u);
  EXPECT_FALSE(h.Take(0, 8, 100, &out));  // another base at that offset
  EXPECT_FALSE(h.Take(0, 7, 101, &out));
  ASSERT_TRUE(h.Take(0, 7, 100, &out));
  EXPECT_EQ(out, std::vector<uint8_t>(6, 1));
  EXPECT_FALSE(h.Take(0, 7, 100, &out));
  EXPECT_EQ(h.held(), 0u);
  h.Put(4096, 7, 200, &b);  // room again
  EXPECT_EQ(h.held(), 6u);
}

}  // namespace
}  // namespace ckptfs
