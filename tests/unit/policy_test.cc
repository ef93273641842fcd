// The lossy policy (codec/lossy/policy.cc): the accepted forms of the
// policy text, and the one-step measure computed as docs/LOSSY.md writes it.
#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <vector>

#include "codec/lossy/policy.h"

namespace ckptfs::lossy {
namespace {

TEST(LossyPolicy, ParsesTheAcceptedFormsOnly) {
  const LossyScope kModels = LossyScope::kModels, kAll = LossyScope::kAll;
  EXPECT_EQ(*ParseLossyPolicy("lossless"), (LossyPolicy{0.0, kModels}));
  // "lossy" alone is the safe level: the one-step measure, 1% relative where it cannot judge.
  EXPECT_EQ(*ParseLossyPolicy("lossy"), (LossyPolicy{0.01, kModels, kSafeSteps}));
  EXPECT_EQ(*ParseLossyPolicy("lossy=safe"), (LossyPolicy{0.01, kModels, kSafeSteps}));
  EXPECT_EQ(*ParseLossyPolicy("lossy=aggressive"), (LossyPolicy{kAggressiveFidelity, kModels, kAggressiveSteps}));
  EXPECT_EQ(*ParseLossyPolicy("lossy=steps:2.5,scope=all"), (LossyPolicy{0.01, kAll, 2.5}));
  EXPECT_EQ(*ParseLossyPolicy("lossy=0.05"), (LossyPolicy{0.05, kModels}));
  EXPECT_EQ(*ParseLossyPolicy("lossy=0.05\n"), (LossyPolicy{0.05, kModels}));
  // The scope is explicit, and only "all" widens it.
  EXPECT_EQ(*ParseLossyPolicy("lossy=0.05,scope=all"), (LossyPolicy{0.05, kAll}));
  EXPECT_EQ(*ParseLossyPolicy("lossy,scope=all\n"), (LossyPolicy{0.01, kAll, kSafeSteps}));
  EXPECT_EQ(*ParseLossyPolicy("lossy=0.02,scope=models"), (LossyPolicy{0.02, kModels}));
  for (const char* bad : {"", "lossy=", "lossy=0", "lossy=-1", "lossy=0.6", "lossy=nan", "banana", "lossy=0.1x",
                          "lossy=0.05,scope=", "lossy=0.05,scope=npy", "lossy=0.05,all", "lossless,scope=all",
                          "lossy=0.05,scope=all,scope=all", ",scope=all", "lossy=steps:", "lossy=steps:0",
                          "lossy=steps:101", "lossy=Safe", "lossy=steps:-1"}) {
    EXPECT_EQ(ParseLossyPolicy(bad).status().code(), EINVAL) << bad;
  }
  EXPECT_EQ(*ParseLossyScope("all"), kAll);
  EXPECT_EQ(*ParseLossyScope("models"), kModels);
  EXPECT_EQ(ParseLossyScope("weights").status().code(), EINVAL);
  EXPECT_EQ(FormatLossyPolicy({}), "lossless");
  EXPECT_EQ(FormatLossyPolicy({0.02, kModels}), "lossy=0.02");
  EXPECT_EQ(FormatLossyPolicy({0.02, kAll}), "lossy=0.02,scope=all");
  for (const char* text : {"lossy=safe", "lossy=aggressive,scope=all", "lossy=steps:2.5"}) {
    EXPECT_EQ(FormatLossyPolicy(*ParseLossyPolicy(text)), text);
  }
}

// The one-step measure on hand-made numbers, computed as docs/LOSSY.md
// writes it: C * sqrt(sum s*(lr*m/(sqrt(v)+eps))^2 / sum s*w^2), s = v +
// 0.01*mean(v).
TEST(OneStepMeasure, ComputedAsDocumented) {
  const std::vector<double> w = {0.5, -1.0, 2.0, 0.0};
  const std::vector<double> m = {0.1, 0.2, -0.3, 0.0};
  const std::vector<double> v = {0.04, 0.16, 0.0, 1.0};
  const double lr = 1e-3, eps = 1e-8, c = 2.0;
  const double floor = 0.01 * (0.04 + 0.16 + 0.0 + 1.0) / 4;
  double step = 0, weight = 0;
  for (size_t i = 0; i < 4; ++i) {
    const double s = v[i] + floor, u = lr * m[i] / (std::sqrt(v[i]) + eps);
    step += s * u * u;
    weight += s * w[i] * w[i];
  }
  EXPECT_NEAR(OneStepWeightTarget(w, m, v, lr, eps, c), c * std::sqrt(step / weight), 1e-15);
  // By hand for the first two elements alone (floor 0.001): both steps are
  // 1e-3 * 0.1 / 0.2 = 1e-3 * 0.2 / 0.4 = 5e-4.
  const double by_hand = 2.0 * std::sqrt((0.041 + 0.161) * 2.5e-7 / (0.041 * 0.25 + 0.161 * 1.0));
  EXPECT_NEAR(OneStepWeightTarget(std::span(w).first(2), std::span(m).first(2), std::span(v).first(2), lr, eps, c),
              by_hand, 1e-6 * by_hand);
  // It scales with the learning rate and the budget; nothing to judge gives 0.
  EXPECT_NEAR(OneStepWeightTarget(w, m, v, 2 * lr, eps, c), 2 * OneStepWeightTarget(w, m, v, lr, eps, c), 1e-15);
  EXPECT_EQ(OneStepWeightTarget(w, m, std::vector<double>(4, 0.0), lr, eps, c), 0);
  EXPECT_EQ(OneStepWeightTarget(w, m, v, 0, eps, c), 0);
  EXPECT_EQ(OneStepWeightTarget(std::vector<double>(4, 0.0), m, v, lr, eps, c), 0);
}

}  // namespace
}  // namespace ckptfs::lossy
