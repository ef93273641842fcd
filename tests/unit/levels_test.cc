// The level fitter (codec/lossy/levels.cc): uniform grids and k-means
// levels fitted on the residual histogram, their errors and counts, the
// nearest-level lookup, and energy kept where asked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "codec/lossy/levels.h"
#include "tests/unit/lossy_test_util.h"

namespace ckptfs::lossy {
namespace {

// Normal values clamped to ±bound, the range of the histograms they go in.
std::vector<double> ClampedNormal(size_t n, float sigma, uint32_t seed, double bound) {
  std::vector<double> x;
  for (float f : Normal(n, sigma, seed)) x.push_back(std::clamp<double>(f, -bound, bound));
  return x;
}

TEST(LossyLevels, UniformFitTakesTheOccupiedMultiples) {
  ResidualHistogram h(-3.0, 3.0, 0.1, 4096);
  const std::vector<double> v = ClampedNormal(1 << 14, 0.7f, 33, 3.0);
  double wrr = 0;
  for (double x : v) {
    h.Add(x, 1.0);
    const double q = std::round(x / 0.25) * 0.25;
    wrr += (x - q) * (x - q);
  }
  const LevelFit fit = LevelFitter(h).FitUniform(0.25);
  ASSERT_FALSE(fit.levels.empty());
  uint64_t total = 0;
  for (size_t i = 0; i < fit.levels.size(); ++i) {
    EXPECT_DOUBLE_EQ(fit.levels[i], std::round(fit.levels[i] / 0.25) * 0.25);
    if (i > 0) {
      EXPECT_LT(fit.levels[i - 1], fit.levels[i]);
    }
    EXPECT_GT(fit.counts[i], 0u);
    total += fit.counts[i];
  }
  EXPECT_EQ(total, v.size());
  // Estimated from bin means, the error is close to the elements' own.
  EXPECT_NEAR(fit.error, wrr, 0.05 * wrr);
  EXPECT_TRUE(LevelFitter(h).FitUniform(0.0).levels.empty());
}

// FitUniform's levels, counts and error by definition: every occupied bin
// at the multiple of the step nearest its weighted mean.
void ExpectUniformFitsByDefinition(const ResidualHistogram& h, const LevelFitter& fitter) {
  for (double step : {0.0007, 0.01, 0.05, 0.3, 2.0, 50.0}) {
    std::map<int64_t, std::pair<uint64_t, double>> by_multiple;  // count, error
    for (const Bin& b : h.bins()) {
      if (b.count == 0) continue;
      const int64_t j = std::llround((b.wr / b.w) / step);
      const double c = static_cast<double>(j) * step;
      by_multiple[j].first += b.count;
      by_multiple[j].second += b.wrr - 2 * c * b.wr + c * c * b.w;
    }
    const LevelFit fit = fitter.FitUniform(step);
    ASSERT_EQ(fit.levels.size(), by_multiple.size()) << "step " << step;
    double err = 0;
    size_t i = 0;
    for (const auto& [j, ce] : by_multiple) {
      EXPECT_EQ(fit.levels[i], static_cast<double>(j) * step) << "step " << step;
      EXPECT_EQ(fit.counts[i], ce.first) << "step " << step;
      err += ce.second;
      ++i;
    }
    EXPECT_NEAR(fit.error, std::max(0.0, err), 1e-9 * std::abs(err) + 1e-12) << "step " << step;
  }
}

// A fit's error and counts are those of its levels by definition: every
// occupied bin at the level nearest its weighted mean. Fit takes a level's
// bins as one run found by binary search, with their sums two prefix sums
// apart, where the means ascend; a histogram with zero-weight bins (whose
// means are 0, out of order) takes the pass over every bin instead.
// FitUniform, whose runs are found by galloping, likewise.
TEST(LossyLevels, FitErrorAndCountsAreThoseOfItsLevels) {
  for (bool zero_weights : {false, true}) {
    ResidualHistogram h(-6.0, 6.0, 0.05, 4096);
    const std::vector<double> v = ClampedNormal(1 << 15, 0.8f, 35, 6.0);
    for (size_t i = 0; i < v.size(); ++i) {
      h.Add(v[i], zero_weights && v[i] > 1.0 ? 0.0 : 1.0 + 0.5 * std::sin(static_cast<double>(i)));
    }
    const LevelFitter fitter(h);
    for (size_t k : {1u, 2u, 5u, 16u, 96u, 256u}) {
      const LevelFit fit = fitter.Fit(k);
      ASSERT_FALSE(fit.levels.empty());
      ASSERT_LE(fit.levels.size(), k);
      ASSERT_TRUE(std::is_sorted(fit.levels.begin(), fit.levels.end()));
      const std::vector<double> bounds = LevelBounds(fit.levels);
      std::vector<uint64_t> counts(fit.levels.size(), 0);
      double err = 0;
      for (const Bin& b : h.bins()) {
        if (b.count == 0) continue;
        const double mean = b.w > 0 ? b.wr / b.w : 0.0;
        const size_t j = NearestLevel(bounds, mean);
        const double c = fit.levels[j];
        err += b.wrr - 2 * c * b.wr + c * c * b.w;
        counts[j] += b.count;
      }
      EXPECT_EQ(fit.counts, counts) << "k " << k << (zero_weights ? ", zero weights" : "");
      EXPECT_NEAR(fit.error, std::max(0.0, err), 1e-9 * std::abs(err) + 1e-12)
          << "k " << k << (zero_weights ? ", zero weights" : "");
    }
    if (!zero_weights) ExpectUniformFitsByDefinition(h, fitter);
  }
}

// LevelLookup answers as NearestLevel does, for any number of bounds (few
// are counted, more go through the table), uneven or repeated ones, and
// values at, just beside and far from them, infinite or NaN.
TEST(LossyLevels, LevelLookupIsNearestLevel) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  for (size_t k = 0; k <= 40; ++k) {
    std::vector<double> levels;
    for (size_t i = 0; i < k; ++i) levels.push_back(i % 5 == 4 && i > 0 ? levels.back() : std::pow(u(rng), 3));
    std::sort(levels.begin(), levels.end());
    const std::vector<double> bounds = LevelBounds(levels);
    const LevelLookup lookup(bounds);
    std::vector<double> probes = {0.0,
                                  -1e300,
                                  1e300,
                                  std::numeric_limits<double>::infinity(),
                                  -std::numeric_limits<double>::infinity(),
                                  std::numeric_limits<double>::quiet_NaN()};
    for (double b : bounds) {
      probes.push_back(b);
      probes.push_back(std::nextafter(b, -1e300));
      probes.push_back(std::nextafter(b, 1e300));
    }
    for (int i = 0; i < 200; ++i) probes.push_back(u(rng));
    for (double v : probes) EXPECT_EQ(lookup(v), NearestLevel(bounds, v)) << "k " << k << " v " << v;
  }
}

// Why m's levels are scaled (docs/LOSSY.md, "Optimizer state"): levels at
// their values' means make the error orthogonal to the reconstruction, so
// the coded energy is the values' energy less the error (1 − e² of it at
// relative error e); PreserveEnergy scales them until it is the values'.
TEST(LossyLevels, MeanLevelsShrinkTheEnergyAndPreserveEnergyRestoresIt) {
  ResidualHistogram h(-5.0, 5.0, 0.1, 4096);
  double in = 0;
  for (double x : ClampedNormal(1 << 15, 1.0f, 34, 5.0)) {
    h.Add(x, 1.0);
    in += x * x;
  }
  auto coded_energy = [](const LevelFit& fit) {
    double e = 0;
    for (size_t i = 0; i < fit.levels.size(); ++i) e += static_cast<double>(fit.counts[i]) * fit.levels[i] * fit.levels[i];
    return e;
  };
  const LevelFitter fitter(h);
  LevelFit fit = fitter.Fit(4);
  ASSERT_EQ(fit.levels.size(), 4u);
  const double e2 = fit.error / in;  // about 0.12 for 4 Lloyd-Max levels of a Gaussian
  ASSERT_GT(e2, 0.05);
  EXPECT_NEAR(coded_energy(fit) / in, 1.0 - e2, 0.01);
  fitter.PreserveEnergy(&fit);
  EXPECT_NEAR(coded_energy(fit) / in, 1.0, 0.02);
  EXPECT_GT(fit.error / in, e2);  // kept energy costs error
}

}  // namespace
}  // namespace ckptfs::lossy
