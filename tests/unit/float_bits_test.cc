// The exact float conversions of codec/lossy/float_bits.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "codec/lossy/float_bits.h"

namespace ckptfs::lossy {
namespace {

TEST(FloatBits, HalfRoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfBitsToFloat(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalfBits(f), h) << std::hex << h;
  }
  EXPECT_EQ(FloatToHalfBits(1.0f + 1.0f / 2048), 0x3C00u);        // tie to even, down
  EXPECT_EQ(FloatToHalfBits(1.0f + 3.0f / 2048), 0x3C02u);        // tie to even, up
  EXPECT_EQ(FloatToHalfBits(70000.0f), 0x7C00u);                  // overflow
  EXPECT_EQ(FloatToBits(DType::kBF16, 1.0f + 1.0f / 256), 0x3F80u);  // tie to even
}

}  // namespace
}  // namespace ckptfs::lossy
