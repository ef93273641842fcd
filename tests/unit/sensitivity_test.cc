// The Fisher weights of codec/lossy/sensitivity.cc, on every code path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "codec/cpu_features.h"
#include "codec/lossy/sensitivity.h"
#include "tests/unit/lossy_test_util.h"

namespace ckptfs {
namespace {

// Fisher weights as docs/LOSSY.md defines them, computed here in the plainest way.
std::vector<float> FisherWeightsByDefinition(const std::vector<float>& v, bool weight) {
  std::vector<double> counted;
  double sum = 0;
  for (float x : v) counted.push_back(std::isfinite(x) && x > 0 ? x : 0.0), sum += counted.back();
  if (sum == 0) return {};
  std::vector<float> out;
  for (double x : counted) {
    const double d = std::sqrt(x) + 1e-8;
    out.push_back(static_cast<float>(weight ? x + 0.01 * sum / static_cast<double>(v.size()) : 1.0 / (d * d)));
  }
  return out;
}

// The first moments' weights come from an AVX2 loop where the CPU has one:
// both it and the portable loop give the definition's floats for every kind
// of v (zero, negative, NaN, infinite, subnormal, the largest float, and
// counts that are no multiple of four), and no weights where no v counts.
TEST(LossySensitivity, FisherWeightsAreTheDefinitionsOnEveryPath) {
  std::vector<float> v = lossy::Normal(4099, 1e-3f, 8);
  for (float& x : v) x *= x;
  const float odd[] = {0.0f,
                       -1e-6f,
                       std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       1e-42f,
                       std::numeric_limits<float>::max()};
  for (size_t i = 0; i < v.size(); i += 97) v[i] = odd[(i / 97) % std::size(odd)];
  const std::vector<float> none = {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), 0.0f, 0.0f};
  for (const bool portable : {false, true}) {
    std::optional<ScopedPortableLoops> scoped;
    if (portable) scoped.emplace();
    for (const size_t n : {v.size(), v.size() - 1, size_t{3}}) {
      const std::vector<float> part(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n));
      for (const bool weight : {false, true}) {
        std::vector<float> got = {1.0f};  // replaced
        lossy::FisherWeights(DType::kF32, lossy::Floats(part), weight, &got);
        const std::vector<float> want = FisherWeightsByDefinition(part, weight);
        ASSERT_EQ(got.size(), want.size()) << n;
        EXPECT_EQ(std::memcmp(got.data(), want.data(), 4 * n), 0)
            << "n " << n << " weight " << weight << " portable " << portable;
      }
    }
    for (const bool weight : {false, true}) {
      std::vector<float> got = {1.0f};
      lossy::FisherWeights(DType::kF32, lossy::Floats(none), weight, &got);
      EXPECT_TRUE(got.empty()) << "weight " << weight << " portable " << portable;
    }
  }
}

}  // namespace
}  // namespace ckptfs
