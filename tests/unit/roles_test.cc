// Tensor roles for lossy mode: which tensors are weights and which are
// optimizer moments, and which second moment goes with each. Layouts are
// built by hand here; pickles from real torch versions are checked by
// tests/integration/test_roles.py.
#include "codec/lossy/roles.h"

#include <gtest/gtest.h>

#include <bit>
#include <string>
#include <vector>

#include "codec/formats/pickle_scan.h"

namespace ckptfs::lossy {
namespace {

using Bytes = std::vector<uint8_t>;

// Tensors in logical order; file offsets follow that order unless a test
// shuffles them.
struct LayoutBuilder {
  FileLayout l;
  int Add(const std::string& label, uint64_t numel, DType dt = DType::kF32) {
    TensorRegion r;
    r.name = "t" + std::to_string(l.tensors.size());
    r.label = label;
    r.dtype = dt;
    r.length = numel * DTypeSize(dt);
    r.shape = {numel};
    r.offset = l.tensors.empty() ? 64 : l.tensors.back().offset + l.tensors.back().length;
    r.order = static_cast<uint32_t>(l.tensors.size());
    l.tensors.push_back(r);
    return static_cast<int>(l.tensors.size()) - 1;
  }
  // torch's per-parameter Adam state: step, exp_avg, exp_avg_sq. Returns the
  // index of exp_avg_sq; *m gets exp_avg's.
  int Adam(uint64_t numel, int* m = nullptr, DType dt = DType::kF32) {
    Add("step", 1);
    int mi = Add("exp_avg", numel, dt);
    if (m) *m = mi;
    return Add("exp_avg_sq", numel, dt);
  }
};

TensorRole RoleOfOne(const std::string& label, uint64_t numel, DType dt) {
  LayoutBuilder b;
  b.Add(label, numel, dt);
  return AssignRoles(b.l)[0].role;
}

TEST(RolesTest, RoleFromLabelAndDtype) {
  EXPECT_EQ(RoleOfOne("layer.0.weight", 16, DType::kF32), TensorRole::kWeight);
  EXPECT_EQ(RoleOfOne("layer.0.weight", 16, DType::kBF16), TensorRole::kWeight);
  EXPECT_EQ(RoleOfOne("layer.0.weight", 16, DType::kF16), TensorRole::kWeight);
  EXPECT_EQ(RoleOfOne("layer.0.weight", 16, DType::kF64), TensorRole::kWeight);
  EXPECT_EQ(RoleOfOne("", 16, DType::kF32), TensorRole::kWeight);
  EXPECT_EQ(RoleOfOne("layer.0.weight", 16, DType::kF8E4M3), TensorRole::kOther);
  EXPECT_EQ(RoleOfOne("layer.0.weight", 16, DType::kC64), TensorRole::kOther);
  EXPECT_EQ(RoleOfOne("layer.0.weight", 16, DType::kI64), TensorRole::kOther);
  EXPECT_EQ(RoleOfOne("layer.0.weight", 16, DType::kU8), TensorRole::kOther);
  EXPECT_EQ(RoleOfOne("exp_avg", 16, DType::kI32), TensorRole::kOther);
  EXPECT_EQ(RoleOfOne("exp_avg", 16, DType::kF32), TensorRole::kAdamM);
  EXPECT_EQ(RoleOfOne("momentum_buffer", 16, DType::kF32), TensorRole::kAdamM);
  EXPECT_EQ(RoleOfOne("exp_avg_sq", 16, DType::kF32), TensorRole::kAdamV);
  EXPECT_EQ(RoleOfOne("max_exp_avg_sq", 16, DType::kF32), TensorRole::kAdamV);
  EXPECT_EQ(RoleOfOne("optimizer.state.3.exp_avg_sq", 16, DType::kBF16), TensorRole::kAdamV);
  EXPECT_EQ(RoleOfOne("optimizer.state.3.exp_avg", 16, DType::kBF16), TensorRole::kAdamM);
  EXPECT_EQ(RoleOfOne("step", 16, DType::kF32), TensorRole::kOther);
  EXPECT_EQ(RoleOfOne("optimizer.state.3.step", 4, DType::kF32), TensorRole::kOther);
  EXPECT_EQ(RoleOfOne("scale", 1, DType::kF32), TensorRole::kOther);
  EXPECT_EQ(RoleOfOne("exp_avg_sq", 1, DType::kF32), TensorRole::kOther);
  EXPECT_STREQ(TensorRoleName(TensorRole::kOther), "other");
  EXPECT_STREQ(TensorRoleName(TensorRole::kWeight), "weight");
  EXPECT_STREQ(TensorRoleName(TensorRole::kAdamM), "adam_m");
  EXPECT_STREQ(TensorRoleName(TensorRole::kAdamV), "adam_v");
}

TEST(RolesTest, EmptyLayout) { EXPECT_TRUE(AssignRoles(FileLayout{}).empty()); }

TEST(RolesTest, PlainStateDictHasNoPartners) {
  LayoutBuilder b;
  b.Add("l0.weight", 64), b.Add("l0.bias", 8), b.Add("bn.num_batches_tracked", 1, DType::kI64);
  for (const RoleAssignment& r : AssignRoles(b.l)) EXPECT_EQ(r.partner_v, -1);
}

TEST(RolesTest, ModelAndAdamW) {
  LayoutBuilder b;
  int w0 = b.Add("l0.weight", 64), b0 = b.Add("l0.bias", 8);
  int w1 = b.Add("l1.weight", 64), b1 = b.Add("l1.bias", 8);
  int m[4], v[4];
  v[0] = b.Adam(64, &m[0]), v[1] = b.Adam(8, &m[1]), v[2] = b.Adam(64, &m[2]), v[3] = b.Adam(8, &m[3]);
  auto r = AssignRoles(b.l);
  int weights[] = {w0, b0, w1, b1};
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(r[weights[k]].role, TensorRole::kWeight);
    EXPECT_EQ(r[weights[k]].partner_v, v[k]) << k;
    EXPECT_EQ(r[m[k]].role, TensorRole::kAdamM);
    EXPECT_EQ(r[m[k]].partner_v, v[k]) << k;
    EXPECT_EQ(r[v[k]].role, TensorRole::kAdamV);
    EXPECT_EQ(r[v[k]].partner_v, -1);
    EXPECT_EQ(r[v[k] - 2].role, TensorRole::kOther) << "step";
  }
}

// torch's zip writes records in its own order; pairing follows the pickle.
TEST(RolesTest, PairingFollowsOrderNotOffsets) {
  LayoutBuilder b;
  int w0 = b.Add("a.weight", 32), w1 = b.Add("b.weight", 32);
  int m0, m1;
  int v0 = b.Adam(32, &m0), v1 = b.Adam(32, &m1);
  // Reverse the file offsets: the layout is sorted by offset, so the
  // tensors vector is reversed too while the orders stay.
  std::vector<TensorRegion> rev(b.l.tensors.rbegin(), b.l.tensors.rend());
  uint64_t off = 64;
  for (auto& t : rev) t.offset = off, off += t.length;
  b.l.tensors = rev;
  auto at = [&](int i) { return static_cast<int>(rev.size()) - 1 - i; };
  auto r = AssignRoles(b.l);
  EXPECT_EQ(r[at(w0)].partner_v, at(v0));
  EXPECT_EQ(r[at(w1)].partner_v, at(v1));
  EXPECT_EQ(r[at(m0)].partner_v, at(v0));
  EXPECT_EQ(r[at(m1)].partner_v, at(v1));
}

TEST(RolesTest, FrozenParameterGetsNoState) {
  LayoutBuilder b;
  int w0 = b.Add("l0.weight", 64), b0 = b.Add("l0.bias", 8);
  int fw = b.Add("frozen.weight", 64), fb = b.Add("frozen.bias", 8);
  int w2 = b.Add("l2.weight", 64);
  // frozen.weight has requires_grad=False: no optimizer entry.
  int v0 = b.Adam(64), v1 = b.Adam(8), v2 = b.Adam(8), v3 = b.Adam(64);
  auto r = AssignRoles(b.l);
  EXPECT_EQ(r[w0].partner_v, v0);
  EXPECT_EQ(r[b0].partner_v, v1);
  EXPECT_EQ(r[fw].partner_v, -1);
  EXPECT_EQ(r[fw].role, TensorRole::kWeight);
  EXPECT_EQ(r[fb].partner_v, v2);
  EXPECT_EQ(r[w2].partner_v, v3);
}

// BatchNorm's running statistics sit between parameters with the same
// size as the next norm's parameters; they never take optimizer state.
TEST(RolesTest, BuffersOfEqualSizeInterleaved) {
  LayoutBuilder b;
  int cw = b.Add("conv.weight", 288);
  int n1w = b.Add("bn1.weight", 32), n1b = b.Add("bn1.bias", 32);
  int rm1 = b.Add("bn1.running_mean", 32), rv1 = b.Add("bn1.running_var", 32);
  b.Add("bn1.num_batches_tracked", 1, DType::kI64);
  int n2w = b.Add("bn2.weight", 32), n2b = b.Add("bn2.bias", 32);
  int rm2 = b.Add("bn2.running_mean", 32), rv2 = b.Add("bn2.running_var", 32);
  int v0 = b.Adam(288), v1 = b.Adam(32), v2 = b.Adam(32), v3 = b.Adam(32), v4 = b.Adam(32);
  auto r = AssignRoles(b.l);
  EXPECT_EQ(r[cw].partner_v, v0);
  EXPECT_EQ(r[n1w].partner_v, v1);
  EXPECT_EQ(r[n1b].partner_v, v2);
  EXPECT_EQ(r[n2w].partner_v, v3);
  EXPECT_EQ(r[n2b].partner_v, v4);
  for (int i : {rm1, rv1, rm2, rv2}) {
    EXPECT_EQ(r[i].role, TensorRole::kOther) << "buffers stay exact";
    EXPECT_EQ(r[i].partner_v, -1);
  }
  // Under scope=all they are coded, still without optimizer state.
  auto all = AssignRoles(b.l, LossyScope::kAll);
  EXPECT_EQ(all[n2w].partner_v, v3);
  for (int i : {rm1, rv1, rm2, rv2}) {
    EXPECT_EQ(all[i].role, TensorRole::kWeight);
    EXPECT_EQ(all[i].partner_v, -1);
  }
}

// A registered buffer of another size before the parameters is skipped
// because the first entry's size does not match it.
TEST(RolesTest, BufferOfOtherSizeBeforeParameters) {
  LayoutBuilder b;
  int buf = b.Add("buf", 8);
  int w = b.Add("emb.weight", 80), bias = b.Add("l.bias", 8);
  int v0 = b.Adam(80), v1 = b.Adam(8);
  auto r = AssignRoles(b.l);
  EXPECT_EQ(r[buf].partner_v, -1);
  EXPECT_EQ(r[w].partner_v, v0);
  EXPECT_EQ(r[bias].partner_v, v1);
}

TEST(RolesTest, SgdMomentumHasNoSecondMoment) {
  LayoutBuilder b;
  int w = b.Add("l.weight", 64), bias = b.Add("l.bias", 8);
  int m0 = b.Add("momentum_buffer", 64), m1 = b.Add("momentum_buffer", 8);
  auto r = AssignRoles(b.l);
  EXPECT_EQ(r[m0].role, TensorRole::kAdamM);
  EXPECT_EQ(r[m1].role, TensorRole::kAdamM);
  for (int i : {w, bias, m0, m1}) EXPECT_EQ(r[i].partner_v, -1);
}

// An m never takes the v of a later parameter.
TEST(RolesTest, FirstMomentTakesOnlyItsOwnEntrysV) {
  LayoutBuilder b;
  int w0 = b.Add("a", 16), w1 = b.Add("b", 16);
  int m0 = b.Add("momentum_buffer", 16);
  int m1 = b.Add("exp_avg", 16), v1 = b.Add("exp_avg_sq", 16);
  auto r = AssignRoles(b.l);
  EXPECT_EQ(r[m0].partner_v, -1);
  EXPECT_EQ(r[m1].partner_v, v1);
  EXPECT_EQ(r[w0].partner_v, -1);
  EXPECT_EQ(r[w1].partner_v, v1);
}

TEST(RolesTest, AmsgradMaxJoinsItsEntry) {
  LayoutBuilder b;
  int w0 = b.Add("a", 16), w1 = b.Add("b", 16);
  int m0, m1;
  int v0 = b.Adam(16, &m0);
  int x0 = b.Add("max_exp_avg_sq", 16);
  int v1 = b.Adam(16, &m1);
  int x1 = b.Add("max_exp_avg_sq", 16);
  auto r = AssignRoles(b.l);
  EXPECT_EQ(r[x0].role, TensorRole::kAdamV);
  EXPECT_EQ(r[x1].role, TensorRole::kAdamV);
  EXPECT_EQ(r[w0].partner_v, v0);
  EXPECT_EQ(r[w1].partner_v, v1);
  EXPECT_EQ(r[m0].partner_v, v0);
  EXPECT_EQ(r[m1].partner_v, v1);
}

// A writer may put max_exp_avg_sq between exp_avg and exp_avg_sq; it
// must not become the m's partner.
TEST(RolesTest, AmsgradMaxBeforeSecondMoment) {
  LayoutBuilder b;
  int w0 = b.Add("a", 16), w1 = b.Add("b", 16);
  int m0 = b.Add("state.0.exp_avg", 16);
  b.Add("state.0.max_exp_avg_sq", 16);
  int v0 = b.Add("state.0.exp_avg_sq", 16);
  int m1 = b.Add("state.1.exp_avg", 16);
  b.Add("state.1.max_exp_avg_sq", 16);
  int v1 = b.Add("state.1.exp_avg_sq", 16);
  auto r = AssignRoles(b.l);
  EXPECT_EQ(r[m0].partner_v, v0);
  EXPECT_EQ(r[m1].partner_v, v1);
  EXPECT_EQ(r[w0].partner_v, v0);
  EXPECT_EQ(r[w1].partner_v, v1);
}

TEST(RolesTest, LoneSecondMoments) {
  LayoutBuilder b;
  int w0 = b.Add("a", 16), w1 = b.Add("b", 24);
  int v0 = b.Add("exp_avg_sq", 16), v1 = b.Add("exp_avg_sq", 24);
  auto r = AssignRoles(b.l);
  EXPECT_EQ(r[w0].partner_v, v0);
  EXPECT_EQ(r[w1].partner_v, v1);
}

TEST(RolesTest, DtypeMustMatch) {
  LayoutBuilder b;
  int w = b.Add("a", 16, DType::kBF16);
  int m;
  int v = b.Adam(16, &m, DType::kF32);
  auto r = AssignRoles(b.l);
  EXPECT_EQ(r[w].partner_v, -1);
  EXPECT_EQ(r[m].partner_v, v);
}

TEST(RolesTest, UnmatchedEntryStaysUnpaired) {
  LayoutBuilder b;
  int w = b.Add("a", 16);
  int m;
  int v0 = b.Adam(16);
  int v1 = b.Adam(48, &m);
  auto r = AssignRoles(b.l);
  EXPECT_EQ(r[w].partner_v, v0);
  EXPECT_EQ(r[m].partner_v, v1);
}

// Optimizers built with decay / no-decay groups list the state of all
// decayed weights first; the biases' entries restart from the beginning
// once nothing of their size is left after the last match.
TEST(RolesTest, ParamGroupsRestartTheSearch) {
  LayoutBuilder b;
  int w0 = b.Add("l0.weight", 64), b0 = b.Add("l0.bias", 8);
  int w1 = b.Add("l1.weight", 64), b1 = b.Add("l1.bias", 16);
  int vw0 = b.Adam(64), vw1 = b.Adam(64), vb0 = b.Adam(8), vb1 = b.Adam(16);
  auto r = AssignRoles(b.l);
  EXPECT_EQ(r[w0].partner_v, vw0);
  EXPECT_EQ(r[w1].partner_v, vw1);
  EXPECT_EQ(r[b0].partner_v, vb0);
  EXPECT_EQ(r[b1].partner_v, vb1);
}

// Two models and their optimizers in one file (a GAN): each optimizer's
// entries continue after the previous one's matches.
TEST(RolesTest, TwoModelsTwoOptimizers) {
  LayoutBuilder b;
  int g0 = b.Add("G.l.weight", 64), g1 = b.Add("G.l.bias", 8);
  int d0 = b.Add("D.l.weight", 64), d1 = b.Add("D.l.bias", 8);
  int vg0 = b.Adam(64), vg1 = b.Adam(8), vd0 = b.Adam(64), vd1 = b.Adam(8);
  auto r = AssignRoles(b.l);
  EXPECT_EQ(r[g0].partner_v, vg0);
  EXPECT_EQ(r[g1].partner_v, vg1);
  EXPECT_EQ(r[d0].partner_v, vd0);
  EXPECT_EQ(r[d1].partner_v, vd1);
}

// --------------------------------------------- lossy scope

// optimizer_entry: the tensor is in an optimizer state_dict's entry (and so
// the file holds one).
TensorRole RoleIn(const std::string& format, const std::string& label, bool module_entry = false,
                  bool optimizer_entry = false, LossyScope scope = LossyScope::kModels) {
  LayoutBuilder b;
  b.l.format = format;
  b.l.optimizer_state = optimizer_entry;
  b.Add(label, 256);
  b.l.tensors[0].module_entry = module_entry;
  b.l.tensors[0].optimizer_entry = optimizer_entry;
  return AssignRoles(b.l, scope)[0].role;
}

TEST(LossyScopeTest, NumpyFilesStayExactUnlessScopeAll) {
  for (const char* f : {"npy", "npz"}) {
    for (const char* label : {"", "arr_0", "fc.weight", "exp_avg_sq"}) {
      EXPECT_EQ(RoleIn(f, label), TensorRole::kOther) << f << " " << label;
    }
    EXPECT_EQ(RoleIn(f, "features", false, false, LossyScope::kAll), TensorRole::kWeight) << f;
  }
}

TEST(LossyScopeTest, TorchParametersNeedProofNotNames) {
  for (const char* f : {"torch-zip", "torch-legacy"}) {
    // A Module.state_dict()'s entries (its _metadata), whatever their names.
    EXPECT_EQ(RoleIn(f, "pos_embed", /*module_entry=*/true), TensorRole::kWeight) << f;
    EXPECT_EQ(RoleIn(f, "cls_token", true), TensorRole::kWeight) << f;
    // Names alone prove nothing (issue 40: sample_weight, train_x, mnist.train).
    for (const char* label : {"encoder.layers.0.self_attn.q_proj.weight", "model.A_log", "weight", "bias",
                              "in_proj_weight", "sample_weight", "train_x", "mnist.train", "param"}) {
      EXPECT_EQ(RoleIn(f, label), TensorRole::kOther) << f << " " << label;
      EXPECT_EQ(RoleIn(f, label, false, false, LossyScope::kAll), TensorRole::kWeight) << f << " " << label;
    }
  }
}

TEST(LossyScopeTest, TorchDataAndBuffersStayExact) {
  for (const char* f : {"torch-zip", "torch-legacy"}) {
    for (const char* label : {"data", "inputs", "targets", "labels", "activations", "features", "embeddings", "x",
                              "", "train_data", "my tensor"}) {
      EXPECT_EQ(RoleIn(f, label), TensorRole::kOther) << f << " " << label;
    }
    // Data names stay exact even in an OrderedDict or under a module path.
    EXPECT_EQ(RoleIn(f, "inputs", /*module_entry=*/true), TensorRole::kOther) << f;
    EXPECT_EQ(RoleIn(f, "batch.inputs"), TensorRole::kOther) << f;
    for (const char* label : {"bn1.running_mean", "bn1.running_var", "rotary.inv_freq", "running_mean"}) {
      EXPECT_EQ(RoleIn(f, label, true), TensorRole::kOther) << f << " " << label;
    }
    EXPECT_EQ(RoleIn(f, "bn1.running_mean", true, false, LossyScope::kAll), TensorRole::kWeight) << f;
    EXPECT_EQ(RoleIn(f, "inputs", false, false, LossyScope::kAll), TensorRole::kWeight) << f;
  }
}

TEST(LossyScopeTest, TorchMomentsNeedAnOptimizerStateDict) {
  EXPECT_EQ(RoleIn("torch-zip", "exp_avg", false, /*optimizer_entry=*/true), TensorRole::kAdamM);
  EXPECT_EQ(RoleIn("torch-zip", "exp_avg_sq", false, true), TensorRole::kAdamV);
  EXPECT_EQ(RoleIn("torch-zip", "momentum_buffer", false, true), TensorRole::kAdamM);
  EXPECT_EQ(RoleIn("torch-legacy", "max_exp_avg_sq", false, true), TensorRole::kAdamV);
  // Other per-parameter state (Adagrad's sum, RMSprop's square_avg) stays exact.
  EXPECT_EQ(RoleIn("torch-zip", "square_avg", false, true), TensorRole::kOther);
  // Outside an optimizer's entries a tensor named exp_avg is just data.
  EXPECT_EQ(RoleIn("torch-zip", "exp_avg"), TensorRole::kOther);
  EXPECT_EQ(RoleIn("torch-zip", "exp_avg_sq"), TensorRole::kOther);
  EXPECT_EQ(RoleIn("torch-zip", "exp_avg_sq", /*module_entry=*/true), TensorRole::kWeight)
      << "a state_dict's value is a weight, whatever its name";
  EXPECT_EQ(RoleIn("torch-zip", "exp_avg_sq", false, false, LossyScope::kAll), TensorRole::kAdamV);
}

// A plain dict of tensors beside an optimizer state_dict: an entry proves
// the tensor it matches by order, element type and shape, and only that one.
TEST(LossyScopeTest, TorchOptimizerEntriesProveTheirParameters) {
  LayoutBuilder b;
  b.l.format = "torch-zip";
  b.l.optimizer_state = true;
  int w = b.Add("fc.weight", 64), bias = b.Add("fc.bias", 8), other = b.Add("val_batch", 64);
  int wrong_shape = b.Add("head.weight", 32);
  int m0, m1, m2;
  int v0 = b.Adam(64, &m0), v1 = b.Adam(8, &m1), v2 = b.Adam(32, &m2);
  for (TensorRegion& t : b.l.tensors) t.optimizer_entry = t.order > static_cast<uint32_t>(wrong_shape);
  b.l.tensors[wrong_shape].shape = {4, 8};
  b.l.tensors[m2].shape = b.l.tensors[v2].shape = {8, 4};
  auto r = AssignRoles(b.l);
  EXPECT_EQ(r[w].role, TensorRole::kWeight);
  EXPECT_EQ(r[w].partner_v, v0);
  EXPECT_EQ(r[bias].role, TensorRole::kWeight);
  EXPECT_EQ(r[bias].partner_v, v1);
  EXPECT_EQ(r[other].role, TensorRole::kOther) << "no entry left for it";
  EXPECT_EQ(r[other].partner_v, -1);
  EXPECT_EQ(r[wrong_shape].role, TensorRole::kOther) << "same size, other shape";
  EXPECT_EQ(r[m0].role, TensorRole::kAdamM);
  EXPECT_EQ(r[m2].partner_v, v2);
  // Without the optimizer nothing in the plain dict is proven.
  for (TensorRegion& t : b.l.tensors) t.optimizer_entry = false;
  b.l.optimizer_state = false;
  for (const RoleAssignment& a : AssignRoles(b.l)) EXPECT_EQ(a.role, TensorRole::kOther);
}

// FSDP keys an optimizer's state by parameter name; torch >= 2.6 lists the
// names in param_groups. Either names the parameter it is state for.
TEST(LossyScopeTest, TorchOptimizerEntriesProveByName) {
  LayoutBuilder b;
  b.l.format = "torch-zip";
  b.l.optimizer_state = true;
  int w = b.Add("enc.w", 64), keyed = b.Add("enc.keyed", 16), listed = b.Add("enc.listed", 16);
  int data = b.Add("train_x", 16);
  int m;
  b.Adam(64, &m);
  b.l.tensors[m].optimizer_entry = b.l.tensors[m + 1].optimizer_entry = true;
  b.l.state_names = {"enc.keyed"};
  b.l.param_names = {"enc.listed"};
  auto r = AssignRoles(b.l);
  EXPECT_EQ(r[w].role, TensorRole::kWeight) << "by order and shape";
  EXPECT_EQ(r[keyed].role, TensorRole::kWeight) << "by the state's key";
  EXPECT_EQ(r[listed].role, TensorRole::kWeight) << "by param_names";
  EXPECT_EQ(r[data].role, TensorRole::kOther);
  b.l.optimizer_state = false;  // names without an optimizer state_dict prove nothing
  EXPECT_EQ(AssignRoles(b.l)[keyed].role, TensorRole::kOther);
}

TEST(LossyScopeTest, ModelFormatsAreInScope) {
  for (const char* f : {"safetensors", "gguf", "dcp"}) {
    EXPECT_EQ(RoleIn(f, "model.embed_tokens.weight"), TensorRole::kWeight) << f;
    EXPECT_EQ(RoleIn(f, "blk.0.attn_q.weight"), TensorRole::kWeight) << f;
    EXPECT_EQ(RoleIn(f, ""), TensorRole::kWeight) << f << ": DCP items carry no names";
    EXPECT_EQ(RoleIn(f, "exp_avg_sq"), TensorRole::kAdamV) << f;
    EXPECT_EQ(RoleIn(f, "bn.running_var"), TensorRole::kOther) << f;
    EXPECT_EQ(RoleIn(f, "inputs"), TensorRole::kOther) << f;
  }
}

TEST(LossyScopeTest, Names) {
  EXPECT_TRUE(IsDataName("inputs"));
  EXPECT_FALSE(IsDataName("weight"));
  EXPECT_TRUE(IsBufferName("running_var"));
  EXPECT_TRUE(IsBufferName("num_batches_tracked"));
  EXPECT_FALSE(IsBufferName("bias"));
  EXPECT_STREQ(LossyScopeName(LossyScope::kModels), "models");
  EXPECT_STREQ(LossyScopeName(LossyScope::kAll), "all");
}

// --------------------------------------------- pickle labels (synthetic)

// Writes the opcodes torch's pickler (protocol 2) emits.
struct Pkl {
  Bytes b;
  uint8_t memo = 0;
  void Op(char c) { b.push_back(static_cast<uint8_t>(c)); }
  void Str(const std::string& s) {
    Op('X');
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(s.size() >> (8 * i)));
    b.insert(b.end(), s.begin(), s.end());
  }
  uint8_t Put() {
    Op('q');
    b.push_back(memo);
    return memo++;
  }
  void Get(uint8_t i) { Op('h'), b.push_back(i); }
  void Int(uint8_t v) { Op('K'), b.push_back(v); }
  void Global(const std::string& mod, const std::string& name) {
    Op('c');
    for (char c : mod + "\n" + name + "\n") Op(c);
  }
  // What Module.state_dict() leaves on the OrderedDict below: BUILD with
  // {'_metadata': OrderedDict({'': {'version': 1}})}.
  void Metadata(const std::string& key = "_metadata") {
    Op('}'), Str(key), Global("collections", "OrderedDict"), Op(')'), Op('R');
    Str(""), Op('}'), Str("version"), Int(1), Op('s'), Op('s');
    Op('s'), Op('b');
  }
  // _rebuild_tensor_v2((storage pid), 0, (n,), (1,), False, OrderedDict())
  void Tensor(const std::string& key, uint8_t numel, bool parameter = false) {
    if (parameter) Global("torch._utils", "_rebuild_parameter");
    Global("torch._utils", "_rebuild_tensor_v2");
    Op('('), Op('(');
    Str("storage"), Global("torch", "FloatStorage"), Str(key), Str("cpu"), Int(numel);
    Op('t'), Op('Q');
    Int(0), Int(numel), Op('\x85'), Int(1), Op('\x85'), Op('\x89');
    Global("collections", "OrderedDict"), Op(')'), Op('R');
    Op('t'), Op('R');
    if (parameter) Op('\x88'), Global("collections", "OrderedDict"), Op(')'), Op('R'), Op('\x87'), Op('R');
  }
};

// Which storages are entries of a Module.state_dict(), by index.
std::vector<bool> ModuleEntries(const Bytes& pkl, bool* optimizer_state) {
  auto scan = formats::ScanPickle(pkl);
  EXPECT_TRUE(scan.ok()) << scan.status().message();
  std::vector<bool> out;
  if (!scan.ok()) return out;
  *optimizer_state = scan->optimizer_state;
  for (const auto& s : scan->storages) out.push_back(s.module_entry);
  return out;
}

// Which storages are in an optimizer state_dict's per-parameter entries.
std::vector<bool> OptimizerEntries(const Bytes& pkl) {
  auto scan = formats::ScanPickle(pkl);
  EXPECT_TRUE(scan.ok()) << scan.status().message();
  std::vector<bool> out;
  if (!scan.ok()) return out;
  for (const auto& s : scan->storages) out.push_back(s.optimizer_entry);
  return out;
}

std::vector<std::string> Labels(const Bytes& pkl) {
  auto scan = formats::ScanPickle(pkl);
  EXPECT_TRUE(scan.ok()) << scan.status().message();
  std::vector<std::string> out;
  if (!scan.ok()) return out;
  for (size_t i = 0; i < scan->storages.size(); ++i) {
    EXPECT_EQ(scan->storages[i].index, i);
    out.push_back(scan->storages[i].label);
  }
  return out;
}

TEST(PickleLabelTest, TorchCheckpointShape) {
  Pkl p;
  p.Op('\x80'), p.b.push_back(2);
  p.Op('}'), p.Op('(');
  p.Str("model"), p.Global("collections", "OrderedDict"), p.Op(')'), p.Op('R'), p.Op('(');
  p.Str("l.weight"), p.Tensor("0", 4);
  p.Str("l.bias"), p.Tensor("1", 2);
  p.Str("tied.weight"), p.Tensor("0", 4);  // same storage: keeps its first label
  p.Op('u');
  p.Metadata();
  p.Str("optimizer"), p.Op('}'), p.Op('(');
  p.Str("state"), p.Op('}'), p.Op('(');
  p.Int(0), p.Op('}'), p.Op('(');
  p.Str("step"), p.Tensor("2", 1);
  p.Str("exp_avg");
  uint8_t m = p.Put();
  p.Tensor("3", 4);
  p.Str("exp_avg_sq");
  uint8_t v = p.Put();
  p.Tensor("4", 4);
  p.Op('u');
  p.Int(1), p.Op('}'), p.Op('(');
  p.Str("step"), p.Tensor("5", 1);
  p.Get(m), p.Tensor("6", 2);  // memoized key
  p.Get(v), p.Tensor("7", 2);
  p.Op('u'), p.Op('u');
  p.Str("param_groups"), p.Op(']'), p.Op('(');
  p.Op('}'), p.Op('('), p.Str("param_names"), p.Op(']'), p.Op('('), p.Str("l.weight"), p.Str("l.bias"), p.Op('e');
  p.Str("params"), p.Op(']'), p.Int(0), p.Op('a'), p.Op('u');
  p.Op('}'), p.Str("param_names"), p.Op(']'), p.Str("param"), p.Op('a'), p.Op('s');
  p.Op('e'), p.Op('u');
  p.Str("step"), p.Int(5);
  p.Str("param"), p.Tensor("8", 3, /*parameter=*/true);
  p.Str("list"), p.Op(']'), p.Op('('), p.Tensor("9", 2), p.Tensor("10", 2), p.Op('e');
  p.Int(7), p.Tensor("11", 2);  // int key
  p.Op('u'), p.Op('.');
  std::vector<std::string> want = {"l.weight", "l.bias",     "step",  "exp_avg", "exp_avg_sq", "step",
                                   "exp_avg",  "exp_avg_sq", "param", "",        "",           ""};
  EXPECT_EQ(Labels(p.b), want);
  // Only the state_dict's values are module entries; "param_groups" and a
  // "state" dict make the pickle an optimizer's, the tensors of its
  // entries optimizer entries.
  bool optimizer_state = false;
  std::vector<bool> entries = ModuleEntries(p.b, &optimizer_state);
  std::vector<bool> want_entries = {true, true, false, false, false, false, false, false, false, false, false, false};
  EXPECT_EQ(entries, want_entries);
  EXPECT_TRUE(optimizer_state);
  std::vector<bool> want_opt = {false, false, true, true, true, true, true, true, false, false, false, false};
  EXPECT_EQ(OptimizerEntries(p.b), want_opt);
  EXPECT_EQ(formats::ScanPickle(p.b)->param_names, (std::vector<std::string>{"l.weight", "l.bias", "param"}));
}

// An optimizer's param_groups: "lr" and "eps" as BINFLOAT (protocol 2+),
// FLOAT (protocol 0 text) or an int; anything else (a tensor lr) is not read.
TEST(PickleLabelTest, ParamGroupsGiveLearningRatesAndEpsilons) {
  Pkl p;
  p.Op('\x80'), p.b.push_back(2);
  p.Op('}'), p.Op('(');
  p.Str("state"), p.Op('}');
  p.Str("param_groups"), p.Op(']'), p.Op('(');
  p.Op('}'), p.Op('('), p.Str("lr"), p.Op('G');
  const uint64_t bits = std::bit_cast<uint64_t>(3e-4);
  for (int i = 7; i >= 0; --i) p.b.push_back(static_cast<uint8_t>(bits >> (8 * i)));
  p.Str("eps");
  for (char c : std::string("F1e-08\n")) p.Op(c);
  p.Str("initial_lr"), p.Int(9), p.Op('u');
  p.Op('}'), p.Op('('), p.Str("lr"), p.Int(2), p.Str("eps"), p.Str("not a number"), p.Op('u');
  p.Op('}'), p.Op('('), p.Str("lr"), p.Tensor("0", 1), p.Op('u');
  p.Op('e'), p.Op('u'), p.Op('.');
  auto scan = formats::ScanPickle(p.b);
  ASSERT_TRUE(scan.ok()) << scan.status().message();
  EXPECT_TRUE(scan->optimizer_state);
  EXPECT_EQ(scan->group_lrs, (std::vector<double>{3e-4, 2.0}));
  EXPECT_EQ(scan->group_eps, (std::vector<double>{1e-8}));
}

// {'data': t, 'inputs': t}, a single-item OrderedDict (SETITEM, not
// SETITEMS) and a tensor in a DICT built from a mark: an OrderedDict
// without _metadata is no state_dict, and nothing is optimizer state.
TEST(PickleLabelTest, DataDictIsNotAModule) {
  Pkl p;
  p.Op('\x80'), p.b.push_back(2);
  p.Op('}'), p.Op('(');
  p.Str("data"), p.Tensor("0", 4);
  p.Str("inputs"), p.Tensor("1", 4, /*parameter=*/true);
  p.Str("one"), p.Global("collections", "OrderedDict"), p.Op(')'), p.Op('R');
  p.Str("w"), p.Tensor("2", 4), p.Op('s');
  p.Str("state"), p.Op('('), p.Str("x"), p.Tensor("3", 4), p.Op('d');
  p.Op('u'), p.Op('.');
  bool optimizer_state = true;
  EXPECT_EQ(ModuleEntries(p.b, &optimizer_state), (std::vector<bool>{false, false, false, false}));
  EXPECT_FALSE(optimizer_state) << "\"state\" alone is not an optimizer";
  EXPECT_EQ(OptimizerEntries(p.b), (std::vector<bool>{false, false, false, false}));
  EXPECT_EQ(Labels(p.b), (std::vector<std::string>{"data", "inputs", "w", "x"}));
}

TEST(PickleLabelTest, BareTensorHasNoLabel) {
  Pkl p;
  p.Op('\x80'), p.b.push_back(2);
  p.Tensor("0", 4);
  p.Op('.');
  EXPECT_EQ(Labels(p.b), std::vector<std::string>{""});
}

// A string value just below a non-string key must not become the label.
TEST(PickleLabelTest, SiblingStringValueIsNotALabel) {
  Pkl p;
  p.Op('\x80'), p.b.push_back(2);
  p.Op('}'), p.Op('(');
  p.Str("name"), p.Str("value");
  p.Int(3), p.Tensor("0", 4);
  p.Op('u'), p.Op('.');
  EXPECT_EQ(Labels(p.b), std::vector<std::string>{""});
}

}  // namespace
}  // namespace ckptfs::lossy

namespace ckptfs::lossy {
namespace {

// optax Adam state as Orbax and Flax msgpack label it: mu and nu trees
// beside the parameters, in key order (every mu before every nu).
TEST(RolesTest, OptaxMuAndNuTreesAreAdamMomentsOfTheirParameters) {
  FileLayout l;
  l.format = "orbax-ocdbt";
  auto add = [&](const std::string& label, uint64_t numel, DType dt = DType::kF32) {
    TensorRegion r;
    r.name = r.label = label;
    r.dtype = dt;
    r.length = numel * DTypeSize(dt);
    r.offset = l.tensors.empty() ? 0 : l.tensors.back().offset + l.tensors.back().length;
    l.tensors.push_back(r);
    return static_cast<int>(l.tensors.size()) - 1;
  };
  const int count = add("opt_state.0.count/0", 1, DType::kI32);
  const int mb = add("opt_state.0.mu.params.mu.bias/0", 8);
  const int mk = add("opt_state.0.mu.params.mu.kernel/0.0", 64);
  const int vb = add("opt_state.0.nu.params.mu.bias/0", 8);
  const int vk = add("opt_state.0.nu.params.mu.kernel/0.0", 64);
  const int wb = add("params.params.mu.bias/0", 8);
  const int wk = add("params.params.mu.kernel/0.0", 64);
  const int lone = add("params.params.head.mu.kernel/0.0", 64);  // a layer named mu, no nu twin
  std::vector<RoleAssignment> r = AssignRoles(l);
  EXPECT_EQ(r[count].role, TensorRole::kOther);
  EXPECT_EQ(r[mb].role, TensorRole::kAdamM);
  EXPECT_EQ(r[mk].role, TensorRole::kAdamM);
  EXPECT_EQ(r[vb].role, TensorRole::kAdamV);
  EXPECT_EQ(r[vk].role, TensorRole::kAdamV);
  EXPECT_EQ(r[mk].partner_v, vk);
  EXPECT_EQ(r[mb].partner_v, vb);
  EXPECT_EQ(r[wk].role, TensorRole::kWeight);
  EXPECT_EQ(r[wk].partner_v, vk);
  EXPECT_EQ(r[wb].partner_v, vb);
  EXPECT_EQ(r[lone].role, TensorRole::kWeight);
  EXPECT_EQ(r[lone].partner_v, -1);
}

// TensorStore may put mu and nu of one save in different Orbax data files:
// a nu whose mu the save's tree holds is Adam's v; one without a mu
// anywhere stays exact (as a weight it could turn negative, and Adam's
// sqrt(v) NaN); a mu whose nu the save's tree holds is Adam's m (without
// a v in this file), one without a nu anywhere a weight.
TEST(RolesTest, ANuWithoutItsMuTwinStaysExact) {
  FileLayout l;
  l.format = "orbax-ocdbt";
  for (const char* label : {"opt_state.0.mu.params.a.kernel/0.0", "opt_state.0.nu.params.b.kernel/0.0",
                            "params.params.b.kernel/0.0"}) {
    TensorRegion r;
    r.name = r.label = label;
    r.dtype = DType::kF32;
    r.length = 256;
    r.offset = 256 * l.tensors.size();
    l.tensors.push_back(r);
  }
  std::vector<RoleAssignment> r = AssignRoles(l);
  EXPECT_EQ(r[0].role, TensorRole::kWeight);
  EXPECT_EQ(r[1].role, TensorRole::kOther);
  EXPECT_EQ(r[2].role, TensorRole::kWeight);
  l.save_arrays = {"opt_state.0.mu.params.a.kernel", "opt_state.0.mu.params.b.kernel",
                   "opt_state.0.nu.params.a.kernel", "opt_state.0.nu.params.b.kernel", "params.params.b.kernel"};
  r = AssignRoles(l);
  EXPECT_EQ(r[0].role, TensorRole::kAdamM);
  EXPECT_EQ(r[0].partner_v, -1);
  EXPECT_EQ(r[1].role, TensorRole::kAdamV);
  EXPECT_EQ(r[2].role, TensorRole::kWeight);
  // A file of mu alone (the rest of the save in another data file), as in
  // the Orbax series: every mu is Adam's m.
  FileLayout m;
  m.format = "orbax-ocdbt";
  m.tensors = {l.tensors[0]};
  m.save_arrays = l.save_arrays;
  r = AssignRoles(m);
  EXPECT_EQ(r[0].role, TensorRole::kAdamM);
  m.save_arrays = {"opt_state.0.mu.params.a.kernel", "params.params.b.kernel"};
  EXPECT_EQ(AssignRoles(m)[0].role, TensorRole::kWeight);
}

}  // namespace
}  // namespace ckptfs::lossy

namespace ckptfs::lossy {
namespace {

// --------------------------------------------- proof from the pickle

// An OrderedDict is a Module.state_dict() only with the _metadata that
// state_dict() attaches (BUILD of {'_metadata': OrderedDict}); a tensor
// named exp_avg is a moment only in an optimizer state_dict's entries.
TEST(PickleProofTest, StateDictNeedsMetadataAndMomentsNeedAnEntry) {
  auto ordered = [](Pkl& p, const std::string& key, const std::string& storage, void (Pkl::*then)(const std::string&),
                    const std::string& attr) {
    p.Str(key), p.Global("collections", "OrderedDict"), p.Op(')'), p.Op('R');
    p.Str("w"), p.Tensor(storage, 4), p.Op('s');
    if (then) (p.*then)(attr);
  };
  Pkl p;
  p.Op('\x80'), p.b.push_back(2);
  p.Op('}'), p.Op('(');
  ordered(p, "plain", "0", nullptr, "");
  ordered(p, "module", "1", &Pkl::Metadata, "_metadata");
  ordered(p, "other_attr", "2", &Pkl::Metadata, "_meta");
  p.Str("dict_with_meta"), p.Op('}'), p.Str("w"), p.Tensor("3", 4), p.Op('s'), p.Metadata();
  // An optimizer: a moment outside "state", one in an entry, one in a
  // "state" entry of a dict without param_groups.
  p.Str("optimizer"), p.Op('}'), p.Op('(');
  p.Str("exp_avg"), p.Tensor("4", 4);
  p.Str("state"), p.Op('}'), p.Int(0), p.Op('}'), p.Str("exp_avg"), p.Tensor("5", 4), p.Op('s'), p.Op('s');
  p.Str("param_groups"), p.Op(']');
  p.Op('u');
  p.Str("not_optimizer"), p.Op('}'), p.Str("state"), p.Op('}'), p.Int(0), p.Op('}');
  p.Str("exp_avg"), p.Tensor("6", 4), p.Op('s'), p.Op('s'), p.Op('s');
  p.Op('u'), p.Op('.');
  bool optimizer_state = false;
  EXPECT_EQ(ModuleEntries(p.b, &optimizer_state),
            (std::vector<bool>{false, true, false, false, false, false, false}));
  EXPECT_TRUE(optimizer_state);
  EXPECT_EQ(OptimizerEntries(p.b), (std::vector<bool>{false, false, false, false, false, true, false}));
}

// FSDP's optim_state_dict keys "state" by parameter name.
TEST(PickleProofTest, StateKeyedByNameGivesTheNames) {
  Pkl p;
  p.Op('\x80'), p.b.push_back(2);
  p.Op('}'), p.Op('(');
  p.Str("state"), p.Op('}'), p.Op('(');
  p.Str("enc.weight"), p.Op('}'), p.Str("exp_avg"), p.Tensor("0", 4), p.Op('s');
  p.Str("enc.bias"), p.Op('}'), p.Str("exp_avg"), p.Tensor("1", 2), p.Op('s');
  p.Op('u');
  p.Str("param_groups"), p.Op(']');
  p.Op('u'), p.Op('.');
  auto scan = formats::ScanPickle(p.b);
  ASSERT_TRUE(scan.ok()) << scan.status().message();
  EXPECT_EQ(scan->state_names, (std::vector<std::string>{"enc.weight", "enc.bias"}));
  EXPECT_EQ(OptimizerEntries(p.b), (std::vector<bool>{true, true}));
}

// data.pkl of torch 1.13's torch.save (Debian python3-torch), for
//   m = nn.Linear(3, 2); opt = Adam(m.parameters()); one step;
//   kRealCheckpoint: {'model': m.state_dict(), 'optimizer': opt.state_dict()}
//   kRealTrainXY: OrderedDict(train_x=randn(4, 3), train_y=randn(4))
//   kRealSampleWeight: {'inputs': randn(4, 3), 'labels': randn(4), 'sample_weight': randn(4)}
//   kRealMnist: {'mnist.train': randn(4, 3), 'mnist.test': randn(2, 3)}
using namespace std::literals;
// kRealCheckpoint: 933 bytes
constexpr std::string_view kRealCheckpoint =
    "\x80\x02\x7d\x71\x00\x28\x58\x05\x00\x00\x00\x6d\x6f\x64\x65\x6c\x71\x01\x63\x63\x6f\x6c\x6c\x65\x63\x74\x69\x6f\x6e\x73\x0a\x4f\x72\x64\x65\x72\x65\x64\x44\x69\x63\x74\x0a\x71\x02\x29\x52\x71\x03\x28\x58\x06\x00\x00\x00\x77"
    "\x65\x69\x67\x68\x74\x71\x04\x63\x74\x6f\x72\x63\x68\x2e\x5f\x75\x74\x69\x6c\x73\x0a\x5f\x72\x65\x62\x75\x69\x6c\x64\x5f\x74\x65\x6e\x73\x6f\x72\x5f\x76\x32\x0a\x71\x05\x28\x28\x58\x07\x00\x00\x00\x73\x74\x6f\x72\x61\x67\x65"
    "\x71\x06\x63\x74\x6f\x72\x63\x68\x0a\x46\x6c\x6f\x61\x74\x53\x74\x6f\x72\x61\x67\x65\x0a\x71\x07\x58\x01\x00\x00\x00\x30\x71\x08\x58\x03\x00\x00\x00\x63\x70\x75\x71\x09\x4b\x06\x74\x71\x0a\x51\x4b\x00\x4b\x02\x4b\x03\x86\x71"
    "\x0b\x4b\x03\x4b\x01\x86\x71\x0c\x89\x68\x02\x29\x52\x71\x0d\x74\x71\x0e\x52\x71\x0f\x58\x04\x00\x00\x00\x62\x69\x61\x73\x71\x10\x68\x05\x28\x28\x68\x06\x68\x07\x58\x01\x00\x00\x00\x31\x71\x11\x68\x09\x4b\x02\x74\x71\x12\x51"
    "\x4b\x00\x4b\x02\x85\x71\x13\x4b\x01\x85\x71\x14\x89\x68\x02\x29\x52\x71\x15\x74\x71\x16\x52\x71\x17\x75\x7d\x71\x18\x58\x09\x00\x00\x00\x5f\x6d\x65\x74\x61\x64\x61\x74\x61\x71\x19\x68\x02\x29\x52\x71\x1a\x58\x00\x00\x00\x00"
    "\x71\x1b\x7d\x71\x1c\x58\x07\x00\x00\x00\x76\x65\x72\x73\x69\x6f\x6e\x71\x1d\x4b\x01\x73\x73\x73\x62\x58\x09\x00\x00\x00\x6f\x70\x74\x69\x6d\x69\x7a\x65\x72\x71\x1e\x7d\x71\x1f\x28\x58\x05\x00\x00\x00\x73\x74\x61\x74\x65\x71"
    "\x20\x7d\x71\x21\x28\x4b\x00\x7d\x71\x22\x28\x58\x04\x00\x00\x00\x73\x74\x65\x70\x71\x23\x68\x05\x28\x28\x68\x06\x68\x07\x58\x01\x00\x00\x00\x32\x71\x24\x68\x09\x4b\x01\x74\x71\x25\x51\x4b\x00\x29\x29\x89\x68\x02\x29\x52\x71"
    "\x26\x74\x71\x27\x52\x71\x28\x58\x07\x00\x00\x00\x65\x78\x70\x5f\x61\x76\x67\x71\x29\x68\x05\x28\x28\x68\x06\x68\x07\x58\x01\x00\x00\x00\x33\x71\x2a\x68\x09\x4b\x06\x74\x71\x2b\x51\x4b\x00\x4b\x02\x4b\x03\x86\x71\x2c\x4b\x03"
    "\x4b\x01\x86\x71\x2d\x89\x68\x02\x29\x52\x71\x2e\x74\x71\x2f\x52\x71\x30\x58\x0a\x00\x00\x00\x65\x78\x70\x5f\x61\x76\x67\x5f\x73\x71\x71\x31\x68\x05\x28\x28\x68\x06\x68\x07\x58\x01\x00\x00\x00\x34\x71\x32\x68\x09\x4b\x06\x74"
    "\x71\x33\x51\x4b\x00\x4b\x02\x4b\x03\x86\x71\x34\x4b\x03\x4b\x01\x86\x71\x35\x89\x68\x02\x29\x52\x71\x36\x74\x71\x37\x52\x71\x38\x75\x4b\x01\x7d\x71\x39\x28\x68\x23\x68\x05\x28\x28\x68\x06\x68\x07\x58\x01\x00\x00\x00\x35\x71"
    "\x3a\x68\x09\x4b\x01\x74\x71\x3b\x51\x4b\x00\x29\x29\x89\x68\x02\x29\x52\x71\x3c\x74\x71\x3d\x52\x71\x3e\x68\x29\x68\x05\x28\x28\x68\x06\x68\x07\x58\x01\x00\x00\x00\x36\x71\x3f\x68\x09\x4b\x02\x74\x71\x40\x51\x4b\x00\x4b\x02"
    "\x85\x71\x41\x4b\x01\x85\x71\x42\x89\x68\x02\x29\x52\x71\x43\x74\x71\x44\x52\x71\x45\x68\x31\x68\x05\x28\x28\x68\x06\x68\x07\x58\x01\x00\x00\x00\x37\x71\x46\x68\x09\x4b\x02\x74\x71\x47\x51\x4b\x00\x4b\x02\x85\x71\x48\x4b\x01"
    "\x85\x71\x49\x89\x68\x02\x29\x52\x71\x4a\x74\x71\x4b\x52\x71\x4c\x75\x75\x58\x0c\x00\x00\x00\x70\x61\x72\x61\x6d\x5f\x67\x72\x6f\x75\x70\x73\x71\x4d\x5d\x71\x4e\x7d\x71\x4f\x28\x58\x02\x00\x00\x00\x6c\x72\x71\x50\x47\x3f\x50"
    "\x62\x4d\xd2\xf1\xa9\xfc\x58\x05\x00\x00\x00\x62\x65\x74\x61\x73\x71\x51\x47\x3f\xec\xcc\xcc\xcc\xcc\xcc\xcd\x47\x3f\xef\xf7\xce\xd9\x16\x87\x2b\x86\x71\x52\x58\x03\x00\x00\x00\x65\x70\x73\x71\x53\x47\x3e\x45\x79\x8e\xe2\x30"
    "\x8c\x3a\x58\x0c\x00\x00\x00\x77\x65\x69\x67\x68\x74\x5f\x64\x65\x63\x61\x79\x71\x54\x4b\x00\x58\x07\x00\x00\x00\x61\x6d\x73\x67\x72\x61\x64\x71\x55\x89\x58\x08\x00\x00\x00\x6d\x61\x78\x69\x6d\x69\x7a\x65\x71\x56\x89\x58\x07"
    "\x00\x00\x00\x66\x6f\x72\x65\x61\x63\x68\x71\x57\x4e\x58\x0a\x00\x00\x00\x63\x61\x70\x74\x75\x72\x61\x62\x6c\x65\x71\x58\x89\x58\x0e\x00\x00\x00\x64\x69\x66\x66\x65\x72\x65\x6e\x74\x69\x61\x62\x6c\x65\x71\x59\x89\x58\x05\x00"
    "\x00\x00\x66\x75\x73\x65\x64\x71\x5a\x89\x58\x06\x00\x00\x00\x70\x61\x72\x61\x6d\x73\x71\x5b\x5d\x71\x5c\x28\x4b\x00\x4b\x01\x65\x75\x61\x75\x75\x2e"sv;
// kRealTrainXY: 239 bytes
constexpr std::string_view kRealTrainXY =
    "\x80\x02\x63\x63\x6f\x6c\x6c\x65\x63\x74\x69\x6f\x6e\x73\x0a\x4f\x72\x64\x65\x72\x65\x64\x44\x69\x63\x74\x0a\x71\x00\x29\x52\x71\x01\x28\x58\x07\x00\x00\x00\x74\x72\x61\x69\x6e\x5f\x78\x71\x02\x63\x74\x6f\x72\x63\x68\x2e\x5f"
    "\x75\x74\x69\x6c\x73\x0a\x5f\x72\x65\x62\x75\x69\x6c\x64\x5f\x74\x65\x6e\x73\x6f\x72\x5f\x76\x32\x0a\x71\x03\x28\x28\x58\x07\x00\x00\x00\x73\x74\x6f\x72\x61\x67\x65\x71\x04\x63\x74\x6f\x72\x63\x68\x0a\x46\x6c\x6f\x61\x74\x53"
    "\x74\x6f\x72\x61\x67\x65\x0a\x71\x05\x58\x01\x00\x00\x00\x30\x71\x06\x58\x03\x00\x00\x00\x63\x70\x75\x71\x07\x4b\x0c\x74\x71\x08\x51\x4b\x00\x4b\x04\x4b\x03\x86\x71\x09\x4b\x03\x4b\x01\x86\x71\x0a\x89\x68\x00\x29\x52\x71\x0b"
    "\x74\x71\x0c\x52\x71\x0d\x58\x07\x00\x00\x00\x74\x72\x61\x69\x6e\x5f\x79\x71\x0e\x68\x03\x28\x28\x68\x04\x68\x05\x58\x01\x00\x00\x00\x31\x71\x0f\x68\x07\x4b\x04\x74\x71\x10\x51\x4b\x00\x4b\x04\x85\x71\x11\x4b\x01\x85\x71\x12"
    "\x89\x68\x00\x29\x52\x71\x13\x74\x71\x14\x52\x71\x15\x75\x2e"sv;
// kRealSampleWeight: 303 bytes
constexpr std::string_view kRealSampleWeight =
    "\x80\x02\x7d\x71\x00\x28\x58\x06\x00\x00\x00\x69\x6e\x70\x75\x74\x73\x71\x01\x63\x74\x6f\x72\x63\x68\x2e\x5f\x75\x74\x69\x6c\x73\x0a\x5f\x72\x65\x62\x75\x69\x6c\x64\x5f\x74\x65\x6e\x73\x6f\x72\x5f\x76\x32\x0a\x71\x02\x28\x28"
    "\x58\x07\x00\x00\x00\x73\x74\x6f\x72\x61\x67\x65\x71\x03\x63\x74\x6f\x72\x63\x68\x0a\x46\x6c\x6f\x61\x74\x53\x74\x6f\x72\x61\x67\x65\x0a\x71\x04\x58\x01\x00\x00\x00\x30\x71\x05\x58\x03\x00\x00\x00\x63\x70\x75\x71\x06\x4b\x0c"
    "\x74\x71\x07\x51\x4b\x00\x4b\x04\x4b\x03\x86\x71\x08\x4b\x03\x4b\x01\x86\x71\x09\x89\x63\x63\x6f\x6c\x6c\x65\x63\x74\x69\x6f\x6e\x73\x0a\x4f\x72\x64\x65\x72\x65\x64\x44\x69\x63\x74\x0a\x71\x0a\x29\x52\x71\x0b\x74\x71\x0c\x52"
    "\x71\x0d\x58\x06\x00\x00\x00\x6c\x61\x62\x65\x6c\x73\x71\x0e\x68\x02\x28\x28\x68\x03\x68\x04\x58\x01\x00\x00\x00\x31\x71\x0f\x68\x06\x4b\x04\x74\x71\x10\x51\x4b\x00\x4b\x04\x85\x71\x11\x4b\x01\x85\x71\x12\x89\x68\x0a\x29\x52"
    "\x71\x13\x74\x71\x14\x52\x71\x15\x58\x0d\x00\x00\x00\x73\x61\x6d\x70\x6c\x65\x5f\x77\x65\x69\x67\x68\x74\x71\x16\x68\x02\x28\x28\x68\x03\x68\x04\x58\x01\x00\x00\x00\x32\x71\x17\x68\x06\x4b\x04\x74\x71\x18\x51\x4b\x00\x4b\x04"
    "\x85\x71\x19\x4b\x01\x85\x71\x1a\x89\x68\x0a\x29\x52\x71\x1b\x74\x71\x1c\x52\x71\x1d\x75\x2e"sv;
// kRealMnist: 247 bytes
constexpr std::string_view kRealMnist =
    "\x80\x02\x7d\x71\x00\x28\x58\x0b\x00\x00\x00\x6d\x6e\x69\x73\x74\x2e\x74\x72\x61\x69\x6e\x71\x01\x63\x74\x6f\x72\x63\x68\x2e\x5f\x75\x74\x69\x6c\x73\x0a\x5f\x72\x65\x62\x75\x69\x6c\x64\x5f\x74\x65\x6e\x73\x6f\x72\x5f\x76\x32"
    "\x0a\x71\x02\x28\x28\x58\x07\x00\x00\x00\x73\x74\x6f\x72\x61\x67\x65\x71\x03\x63\x74\x6f\x72\x63\x68\x0a\x46\x6c\x6f\x61\x74\x53\x74\x6f\x72\x61\x67\x65\x0a\x71\x04\x58\x01\x00\x00\x00\x30\x71\x05\x58\x03\x00\x00\x00\x63\x70"
    "\x75\x71\x06\x4b\x0c\x74\x71\x07\x51\x4b\x00\x4b\x04\x4b\x03\x86\x71\x08\x4b\x03\x4b\x01\x86\x71\x09\x89\x63\x63\x6f\x6c\x6c\x65\x63\x74\x69\x6f\x6e\x73\x0a\x4f\x72\x64\x65\x72\x65\x64\x44\x69\x63\x74\x0a\x71\x0a\x29\x52\x71"
    "\x0b\x74\x71\x0c\x52\x71\x0d\x58\x0a\x00\x00\x00\x6d\x6e\x69\x73\x74\x2e\x74\x65\x73\x74\x71\x0e\x68\x02\x28\x28\x68\x03\x68\x04\x58\x01\x00\x00\x00\x31\x71\x0f\x68\x06\x4b\x06\x74\x71\x10\x51\x4b\x00\x4b\x02\x4b\x03\x86\x71"
    "\x11\x4b\x03\x4b\x01\x86\x71\x12\x89\x68\x0a\x29\x52\x71\x13\x74\x71\x14\x52\x71\x15\x75\x2e"sv;
// The layout torch.cc makes of a torch-zip whose data.pkl is `pkl`.
FileLayout TorchLayout(std::string_view pkl) {
  auto scan = formats::ScanPickle(std::span(reinterpret_cast<const uint8_t*>(pkl.data()), pkl.size()));
  EXPECT_TRUE(scan.ok()) << scan.status().message();
  FileLayout l;
  l.format = "torch-zip";
  if (!scan.ok()) return l;
  l.optimizer_state = scan->optimizer_state;
  l.param_names = scan->param_names;
  l.state_names = scan->state_names;
  for (const formats::StorageRef& s : scan->storages) {
    TensorRegion r;
    r.name = r.label = s.label;
    r.dtype = s.dtype;
    r.length = s.numel * s.elsize;
    r.shape = s.shape.empty() ? std::vector<uint64_t>{s.numel} : s.shape;
    r.offset = l.tensors.empty() ? 64 : l.tensors.back().offset + l.tensors.back().length;
    r.order = s.index;
    r.module_entry = s.module_entry;
    r.optimizer_entry = s.optimizer_entry;
    l.tensors.push_back(r);
  }
  return l;
}

std::vector<std::string> RolesOf(const FileLayout& l, LossyScope scope = LossyScope::kModels) {
  std::vector<std::string> out;
  for (const RoleAssignment& r : AssignRoles(l, scope)) out.push_back(TensorRoleName(r.role));
  return out;
}

TEST(PickleProofTest, RealCheckpointIsProven) {
  FileLayout l = TorchLayout(kRealCheckpoint);
  ASSERT_EQ(l.tensors.size(), 8u);
  std::vector<std::string> labels;
  for (const TensorRegion& t : l.tensors) labels.push_back(t.label);
  EXPECT_EQ(labels, (std::vector<std::string>{"weight", "bias", "step", "exp_avg", "exp_avg_sq", "step", "exp_avg",
                                              "exp_avg_sq"}));
  EXPECT_TRUE(l.optimizer_state);
  EXPECT_TRUE(l.tensors[0].module_entry && l.tensors[1].module_entry);
  EXPECT_EQ(RolesOf(l),
            (std::vector<std::string>{"weight", "weight", "other", "adam_m", "adam_v", "other", "adam_m", "adam_v"}));
  std::vector<RoleAssignment> r = AssignRoles(l);
  EXPECT_EQ(r[0].partner_v, 4);
  EXPECT_EQ(r[1].partner_v, 7);
  // The same model and optimizer without the state_dict's _metadata (a
  // plain dict of its tensors) are still proven, by the optimizer's entries.
  l.tensors[0].module_entry = l.tensors[1].module_entry = false;
  EXPECT_EQ(RolesOf(l)[0], "weight");
  EXPECT_EQ(RolesOf(l)[1], "weight");
}

// Issue 40's three data files: nothing in them is proven, so nothing is
// lossy under scope=models (everything is under scope=all).
TEST(PickleProofTest, RealDataFilesStayExact) {
  for (std::string_view pkl : {kRealTrainXY, kRealSampleWeight, kRealMnist}) {
    FileLayout l = TorchLayout(pkl);
    ASSERT_GE(l.tensors.size(), 2u);
    EXPECT_FALSE(l.optimizer_state);
    for (const TensorRegion& t : l.tensors) EXPECT_FALSE(t.module_entry || t.optimizer_entry) << t.label;
    for (const std::string& role : RolesOf(l)) EXPECT_EQ(role, "other");
    for (const std::string& role : RolesOf(l, LossyScope::kAll)) EXPECT_EQ(role, "weight");
  }
}

}  // namespace
}  // namespace ckptfs::lossy
