// The pack meta's lossy section (store/pack_meta.cc): scope, rule and
// measure round-trip, version 1 still reads, an unknown rule is corruption.
#include <gtest/gtest.h>

#include <vector>

#include "base/hash.h"
#include "base/le.h"
#include "store/pack_meta.h"
#include "tests/unit/lossy_test_util.h"

namespace ckptfs {
namespace {

TEST(LossyMeta, ScopeAndRuleRoundTripAndVersionOneStillReads) {
  std::vector<uint8_t> b = EncodePackMeta(MetaWithLossy());
  auto m = DecodePackMeta(b, 2);
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_TRUE(m->lossy);
  EXPECT_EQ(m->lossy->scope, lossy::LossyScope::kAll);
  EXPECT_EQ(m->lossy->sensitivity, SensitivityRule::kSibling);
  EXPECT_EQ(m->lossy->measure, BudgetMeasure::kRelative);
  EXPECT_EQ(m->lossy->roles[2].max_error, 0.25f);
  LossyInfo one_step = *MetaWithLossy().lossy;
  one_step.measure = BudgetMeasure::kOneStep;
  PackMeta with_steps = MetaWithLossy();
  with_steps.lossy = one_step;
  auto back = DecodePackMeta(EncodePackMeta(with_steps), 2);
  ASSERT_TRUE(back.ok() && back->lossy);
  EXPECT_EQ(back->lossy->measure, BudgetMeasure::kOneStep);
  // A version 1 section (before scopes): 4 bytes shorter, read as scope
  // models with no rule recorded.
  std::vector<uint8_t> v1(b.begin(), b.end() - 12);
  const size_t section = v1.size() - (4 + 4 + 4 + 8 + 3 * 24);
  le::Put32(v1, section + 4, 1);
  v1.resize(v1.size() + 8);
  le::Put64(v1, v1.size() - 8, Checksum64(std::span(v1).first(v1.size() - 8), kSeedMeta));
  auto old = DecodePackMeta(v1, 2);
  ASSERT_TRUE(old.ok()) << old.status().message();
  ASSERT_TRUE(old->lossy);
  EXPECT_EQ(old->lossy->scope, lossy::LossyScope::kModels);
  EXPECT_EQ(old->lossy->sensitivity, SensitivityRule::kNone);
  EXPECT_EQ(old->lossy->roles[0].max_error, 0.04f);
  // An unknown rule is corruption, not a guess.
  std::vector<uint8_t> bad = b;
  bad[bad.size() - 8 - 3] = 9;
  le::Put64(bad, bad.size() - 8, Checksum64(std::span(bad).first(bad.size() - 8), kSeedMeta));
  EXPECT_FALSE(DecodePackMeta(bad, 2).ok());
}

}  // namespace
}  // namespace ckptfs
