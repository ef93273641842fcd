// Sibling moments (codec/lossy/siblings.cc): whether an optimizer file's
// second moments match a model file's parameters one for one.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "codec/lossy/policy.h"
#include "codec/lossy/siblings.h"

namespace ckptfs {
namespace {

TensorRegion Region(const std::string& label, std::vector<uint64_t> shape, uint64_t offset, uint32_t order) {
  TensorRegion r;
  r.label = label;
  r.dtype = DType::kF32;
  r.shape = std::move(shape);
  uint64_t n = 1;
  for (uint64_t d : r.shape) n *= d;
  r.length = 4 * n;
  r.offset = offset;
  r.order = order;
  return r;
}

// A model.safetensors of an MLP, and the optimizer.pt of its AdamW.
FileLayout ModelFile(const std::vector<std::vector<uint64_t>>& shapes) {
  FileLayout l;
  l.format = "safetensors";
  const char* names[] = {"0.weight", "0.bias", "2.weight", "2.bias"};
  uint64_t off = 64;
  for (size_t i = 0; i < shapes.size(); ++i) {
    l.tensors.push_back(Region(names[i % 4], shapes[i], off, static_cast<uint32_t>(i)));
    off += l.tensors.back().length;
  }
  return l;
}

FileLayout OptimizerFile(const std::vector<std::vector<uint64_t>>& shapes, const std::string& v_prefix = "") {
  FileLayout l;
  l.format = "torch-zip";
  l.optimizer_state = true;
  uint64_t off = 64;
  uint32_t order = 0;
  for (const auto& s : shapes) {
    l.tensors.push_back(Region("step", {1}, off, order++)), off += 4;
    l.tensors.push_back(Region("exp_avg", s, off, order++)), off += l.tensors.back().length;
    l.tensors.push_back(Region(v_prefix.empty() ? "exp_avg_sq" : v_prefix, s, off, order++));
    off += l.tensors.back().length;
  }
  for (TensorRegion& t : l.tensors) t.optimizer_entry = true;  // all in the state's per-parameter entries
  return l;
}

const std::vector<std::vector<uint64_t>> kMlp = {{512, 64}, {512}, {64, 512}, {64}};

TEST(SiblingMatch, SameSaveMatchesOneForOne) {
  auto pairs = MatchSiblingMoments(ModelFile(kMlp), OptimizerFile(kMlp), lossy::LossyScope::kModels);
  ASSERT_TRUE(pairs.ok()) << pairs.status().message();
  ASSERT_EQ(pairs->size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ((*pairs)[k].first, k);
    EXPECT_EQ((*pairs)[k].second, 3 * k + 2) << "exp_avg_sq of parameter " << k;
  }
}

TEST(SiblingMatch, OtherModelsOptimizerIsRejected) {
  // Another model: same count, other shapes.
  auto other = MatchSiblingMoments(ModelFile(kMlp), OptimizerFile({{512, 32}, {512}, {64, 512}, {64}}),
                                   lossy::LossyScope::kModels);
  EXPECT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("parameter 0 (0.weight)"), std::string::npos) << other.status().message();
  // Same element counts, transposed: shapes differ.
  EXPECT_FALSE(MatchSiblingMoments(ModelFile(kMlp), OptimizerFile({{64, 512}, {512}, {512, 64}, {64}}),
                                   lossy::LossyScope::kModels)
                   .ok());
  // A frozen parameter (no state), or a bigger model: counts differ.
  auto fewer = MatchSiblingMoments(ModelFile(kMlp), OptimizerFile({{512, 64}, {512}, {64, 512}}),
                                   lossy::LossyScope::kModels);
  EXPECT_FALSE(fewer.ok());
  EXPECT_NE(fewer.status().message().find("3 second moments for 4 parameters"), std::string::npos);
  // Moments in a torch file that holds no optimizer state_dict are not moments.
  FileLayout fake = OptimizerFile(kMlp);
  fake.optimizer_state = false;
  for (TensorRegion& t : fake.tensors) t.optimizer_entry = false;
  EXPECT_FALSE(MatchSiblingMoments(ModelFile(kMlp), fake, lossy::LossyScope::kModels).ok());
}

// The safetensors library stores tensors sorted by name (0.bias before
// 0.weight): without names in the optimizer file, no order can be trusted.
TEST(SiblingMatch, ModelInAnotherOrderIsRejected) {
  FileLayout model = ModelFile(kMlp);
  std::swap(model.tensors[0].order, model.tensors[1].order);
  std::swap(model.tensors[2].order, model.tensors[3].order);
  EXPECT_FALSE(MatchSiblingMoments(model, OptimizerFile(kMlp), lossy::LossyScope::kModels).ok());
}

// torch >= 2.6 keeps the parameters' names in param_groups: then the
// model file's order does not matter, the names do.
TEST(SiblingMatch, OptimizerParamNamesPairByName) {
  FileLayout model = ModelFile(kMlp);
  std::swap(model.tensors[0].order, model.tensors[1].order);
  std::swap(model.tensors[2].order, model.tensors[3].order);
  FileLayout opt = OptimizerFile(kMlp);
  opt.param_names = {"0.weight", "0.bias", "2.weight", "2.bias"};
  auto pairs = MatchSiblingMoments(model, opt, lossy::LossyScope::kModels);
  ASSERT_TRUE(pairs.ok()) << pairs.status().message();
  ASSERT_EQ(pairs->size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(model.tensors[(*pairs)[k].first].label, opt.param_names[k]);
    EXPECT_EQ((*pairs)[k].second, 3 * k + 2);
  }
  opt.param_names[3] = "3.bias";
  auto missing = MatchSiblingMoments(model, opt, lossy::LossyScope::kModels);
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("3.bias is not in the model file"), std::string::npos);
  opt.param_names = {"0.bias", "0.weight", "2.weight", "2.bias"};  // names that contradict the shapes
  EXPECT_FALSE(MatchSiblingMoments(model, opt, lossy::LossyScope::kModels).ok());
  opt.param_names.pop_back();
  EXPECT_FALSE(MatchSiblingMoments(model, opt, lossy::LossyScope::kModels).ok());
}

TEST(SiblingMatch, NamedMomentsMustNameTheParameter) {
  FileLayout model = ModelFile({{512, 64}});
  FileLayout named = OptimizerFile({{512, 64}}, "state.0.weight.exp_avg_sq");
  named.format = "safetensors";
  EXPECT_TRUE(MatchSiblingMoments(model, named, lossy::LossyScope::kModels).ok());
  FileLayout wrong = OptimizerFile({{512, 64}}, "state.2.weight.exp_avg_sq");
  wrong.format = "safetensors";
  auto r = MatchSiblingMoments(model, wrong, lossy::LossyScope::kModels);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("names 2.weight"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace ckptfs
