// DCP shards get their tensors' names from the save's .metadata
// (codec/lossy/dcp_labels.h). The save in tests/data/dcp/adam was written by
// torch 2.15's dcp.save (tests/data/dcp/gen.py): a two-layer model and its
// Adam state in one shard.
#include "codec/lossy/dcp_labels.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "codec/formats/pickle_scan.h"
#include "codec/lossy/roles.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using lossy::TensorRole;
using Bytes = std::vector<uint8_t>;

const std::string kDir = std::string(CKPTFS_SOURCE_DIR) + "/tests/data/dcp/adam/";
constexpr const char* kShard = "__0_0.distcp";

struct Save {
  Bytes shard = test::ReadFileBytes(kDir + kShard);
  Bytes metadata = test::ReadFileBytes(kDir + ".metadata");
  FileLayout layout = DetectLayout(SpanSource(shard));
};

// Files in memory; WaitForMore counts the waits and lets `arrive_after`
// of them pass before the .metadata shows up.
class FakeSiblings : public SiblingSource {
 public:
  FakeSiblings(std::map<std::string, Bytes> files, int arrive_after)
      : files_(std::move(files)), arrive_after_(arrive_after) {}
  std::vector<std::string> Candidates() override {
    std::vector<std::string> out;
    for (const auto& [name, bytes] : files_) {
      if (name != ".metadata" || waits_ >= arrive_after_) out.push_back(name);
    }
    return out;
  }
  Result<std::shared_ptr<const ByteSource>> Open(const std::string& name) override {
    return std::shared_ptr<const ByteSource>(std::make_shared<SpanSource>(files_.at(name)));
  }
  std::string OwnName() override { return kShard; }
  bool WaitForMore() override { return ++waits_ <= 5; }
  int waits_ = 0;

 private:
  std::map<std::string, Bytes> files_;
  int arrive_after_;
};

TEST(DcpLabelsTest, MetadataPickleListsEveryItemWithItsKeyAndPlace) {
  Save s;
  Result<formats::PickleScan> scan = formats::ScanPickle(s.metadata);
  ASSERT_TRUE(scan.ok()) << scan.status().message();
  std::map<std::string, formats::DcpItem> by_fqn;
  for (const formats::DcpItem& it : scan->dcp_items) by_fqn[it.fqn] = it;
  // 4 parameters, per parameter exp_avg, exp_avg_sq and step, and the
  // param_groups' hyperparameters (pickled BYTE_IO items)
  EXPECT_EQ(by_fqn.size(), 28u);
  EXPECT_TRUE(by_fqn.count("optim.param_groups.0.lr"));
  ASSERT_TRUE(by_fqn.count("model.0.weight"));
  ASSERT_TRUE(by_fqn.count("optim.state.0.weight.exp_avg_sq"));
  for (const auto& [fqn, it] : by_fqn) {
    EXPECT_EQ(it.relative_path, kShard) << fqn;
    EXPECT_LE(it.offset + it.length, s.shard.size()) << fqn;
  }
  // the state dict's order: the model first, each moment after its parameter's
  EXPECT_LT(by_fqn["model.1.bias"].fqn_order, by_fqn["optim.state.0.weight.exp_avg"].fqn_order);
  EXPECT_LT(by_fqn["optim.state.0.weight.exp_avg"].fqn_order, by_fqn["optim.state.0.weight.exp_avg_sq"].fqn_order);
  EXPECT_LT(by_fqn["optim.state.0.weight.exp_avg_sq"].fqn_order, by_fqn["optim.state.0.bias.exp_avg"].fqn_order);
}

TEST(DcpLabelsTest, TorchPicklesHaveNoDcpItems) {
  Save s;
  // Any one archive's data.pkl of the shard is a plain torch pickle.
  Result<formats::PickleScan> scan = formats::ScanPickle(s.metadata);
  ASSERT_TRUE(scan.ok());
  Bytes no_global = s.metadata;
  // Without the Metadata class the same dicts mean nothing.
  const std::string cls = "Metadata";
  auto at = std::search(no_global.begin(), no_global.end(), cls.begin(), cls.end());
  ASSERT_NE(at, no_global.end());
  *at = 'X';
  Result<formats::PickleScan> other = formats::ScanPickle(no_global);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->dcp_items.empty());
}

TEST(DcpLabelsTest, ShardTensorsGetKeysAndRolesPairMomentsWithWeights) {
  Save s;
  ASSERT_EQ(s.layout.format, "dcp") << s.layout.note;
  // Unlabelled, every float tensor is a weight (magnitude rule only).
  for (const lossy::RoleAssignment& r : lossy::AssignRoles(s.layout)) EXPECT_NE(r.role, TensorRole::kAdamM);
  std::optional<FileLayout> l = LabelDcpShardFrom(s.layout, s.shard.size(), kShard, SpanSource(s.metadata));
  ASSERT_TRUE(l.has_value());
  const std::vector<lossy::RoleAssignment> roles = lossy::AssignRoles(*l);
  std::map<std::string, size_t> at;
  for (size_t i = 0; i < l->tensors.size(); ++i) at[l->tensors[i].label] = i;
  for (const char* p : {"0.weight", "0.bias", "1.weight", "1.bias"}) {
    const std::string w = std::string("model.") + p, m = std::string("optim.state.") + p + ".exp_avg";
    ASSERT_TRUE(at.count(w) && at.count(m) && at.count(m + "_sq")) << p;
    EXPECT_EQ(roles[at[w]].role, TensorRole::kWeight) << p;
    EXPECT_EQ(roles[at[m]].role, TensorRole::kAdamM) << p;
    EXPECT_EQ(roles[at[m + "_sq"]].role, TensorRole::kAdamV) << p;
    EXPECT_EQ(roles[at[w]].partner_v, static_cast<int32_t>(at[m + "_sq"])) << p;
    EXPECT_EQ(roles[at[std::string("optim.state.") + p + ".step"]].role, TensorRole::kOther) << p;
  }
}

TEST(DcpLabelsTest, MetadataOfAnotherFileOrDamagedIsNotUsed) {
  Save s;
  EXPECT_FALSE(LabelDcpShardFrom(s.layout, s.shard.size(), "__1_0.distcp", SpanSource(s.metadata)));
  EXPECT_FALSE(LabelDcpShardFrom(s.layout, s.shard.size() / 2, kShard, SpanSource(s.metadata)));
  EXPECT_FALSE(LabelDcpShardFrom(s.layout, s.shard.size(), kShard, SpanSource(s.shard)));
  for (size_t cut : {size_t{1}, s.metadata.size() / 3, s.metadata.size() - 1}) {
    Bytes part(s.metadata.begin(), s.metadata.begin() + static_cast<std::ptrdiff_t>(cut));
    EXPECT_FALSE(LabelDcpShardFrom(s.layout, s.shard.size(), kShard, SpanSource(part))) << cut;
  }
  FileLayout npy = s.layout;
  npy.format = "npy";
  EXPECT_FALSE(LabelDcpShardFrom(npy, s.shard.size(), kShard, SpanSource(s.metadata)));
}

TEST(DcpLabelsTest, WaitsForTheMetadataWhileTheSaveMayStillWriteIt) {
  Save s;
  FakeSiblings late({{".metadata", s.metadata}, {"__1_0.distcp", s.shard}}, /*arrive_after=*/3);
  std::optional<LabelledShard> l = LabelDcpShard(s.layout, s.shard.size(), late);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->metadata, ".metadata");
  EXPECT_EQ(late.waits_, 3);
  FakeSiblings never({{".metadata", s.metadata}}, /*arrive_after=*/100);
  EXPECT_FALSE(LabelDcpShard(s.layout, s.shard.size(), never).has_value());
  EXPECT_EQ(never.waits_, 6);  // gives up when WaitForMore says so
}

}  // namespace
}  // namespace ckptfs
