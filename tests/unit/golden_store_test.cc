// Golden stores (tests/data/golden/README.md): real stores written by the
// binaries of earlier commits, one per pack format version they wrote, read
// with today's Store on a copy: every file's bytes (a lossy file's as the
// old code reconstructed them), each pack's version and codecs as the old
// code wrote them, fsck clean, and a recovery that keeps every pack.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "store/pack.h"
#include "store/store.h"
#include "store/stub.h"
#include "test_util.h"

namespace ckptfs {
namespace {

namespace fs = std::filesystem;
using test::ReadContentAt;
using test::ReadFileBytes;
using test::TempDir;

const fs::path kGolden = fs::path(CKPTFS_SOURCE_DIR) / "tests" / "data" / "golden";

std::vector<std::string> GoldenStores() {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(kGolden)) {
    if (fs::exists(e.path() / "manifest.json")) names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

nlohmann::json Manifest(const std::string& name) {
  std::ifstream in(kGolden / name / "manifest.json");
  return nlohmann::json::parse(in);
}

const std::map<std::string, ChunkCodec> kCodecByName = {{"raw", ChunkCodec::kRaw},    {"zstd", ChunkCodec::kZstd},
                                                        {"zero", ChunkCodec::kZero},  {"tensor", ChunkCodec::kTensor},
                                                        {"ref", ChunkCodec::kRef},    {"delta", ChunkCodec::kDelta},
                                                        {"lossy", ChunkCodec::kLossy}};

class GoldenStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    manifest_ = Manifest(GetParam());
    fs::copy(kGolden / GetParam() / "store", path_, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
    // Git keeps no empty directory: a checkout lacks the store's empty
    // staging/ and tmp/, which only a writable open recreates.
    fs::create_directories(path_ + "/staging");
    fs::create_directories(path_ + "/tmp");
  }

  std::unique_ptr<Store> Open(bool writable) {
    StoreOptions o;
    o.create_if_missing = writable;
    o.take_lock = writable;
    Result<std::unique_ptr<Store>> s = Store::Open(Env::Default(), path_, o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  nlohmann::json manifest_;
  TempDir dir_;
  std::string path_ = dir_.Sub("store");
};

TEST_P(GoldenStoreTest, EveryFileReadsBackAsTheOldCodeServedIt) {
  std::unique_ptr<Store> store = Open(false);
  ASSERT_NE(store, nullptr);
  for (const nlohmann::json& f : manifest_["files"]) {
    const std::string path = f["path"];
    Result<std::vector<uint8_t>> got = ReadContentAt(store.get(), path);
    ASSERT_TRUE(got.ok()) << path << ": " << got.status().ToString();
    EXPECT_EQ(got->size(), f["size"].get<size_t>()) << path;
    EXPECT_TRUE(*got == ReadFileBytes((kGolden / f["expected"].get<std::string>()).string()))
        << path << " differs from " << f["expected"];
  }
}

TEST_P(GoldenStoreTest, PacksHaveTheVersionAndCodecsTheOldCodeWrote) {
  std::unique_ptr<Store> store = Open(false);
  ASSERT_NE(store, nullptr);
  for (const nlohmann::json& f : manifest_["files"]) {
    const std::string path = f["path"];
    UniqueFd stub = std::move(Env::Default()->OpenAt(store->ns_fd(), path, O_RDONLY)).value();
    Result<StubRecord> rec = ReadStub(Env::Default(), stub.get());
    ASSERT_TRUE(rec.ok()) << path << ": " << rec.status().ToString();
    if (f["pack"].is_null()) {
      EXPECT_EQ(rec->object, 0u) << path;
      continue;
    }
    EXPECT_EQ(ObjectIdHex(rec->object), f["pack"].get<std::string>()) << path;
    Result<std::shared_ptr<PackReader>> pack = store->OpenPack(rec->object);
    ASSERT_TRUE(pack.ok()) << path << ": " << pack.status().ToString();
    EXPECT_EQ((*pack)->header().version, f["pack_version"].get<uint32_t>()) << path;
    EXPECT_TRUE((*pack)->meta_status().ok()) << path << ": " << (*pack)->meta_status().ToString();
    std::vector<ChunkCodec> want;
    for (const nlohmann::json& c : f["codecs"]) want.push_back(kCodecByName.at(c.get<std::string>()));
    std::vector<ChunkCodec> have;
    for (const ChunkEntry& e : (*pack)->chunks()) have.push_back(e.codec);
    EXPECT_TRUE(have == want) << path << ": chunk codecs differ from the manifest";
    // The lossy section, in either of its versions, names the policy.
    EXPECT_EQ((*pack)->meta().lossy.has_value(), f["lossy"].get<bool>()) << path;
    if ((*pack)->meta().lossy) {
      EXPECT_FLOAT_EQ((*pack)->meta().lossy->fidelity, 0.01f) << path;
    }
  }
}

TEST_P(GoldenStoreTest, FsckIsClean) {
  std::unique_ptr<Store> store = Open(false);
  ASSERT_NE(store, nullptr);
  Result<FsckReport> r = store->Fsck();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->clean()) << (r->errors.empty() ? "" : r->errors[0]);
  EXPECT_TRUE(r->warnings.empty()) << r->warnings[0];
  EXPECT_EQ(r->files_checked, manifest_["files"].size());
}

TEST_P(GoldenStoreTest, RecoveryKeepsEveryPack) {
  const size_t packs = test::CountFiles(path_ + "/packs", /*one_level_down=*/true);
  std::unique_ptr<Store> store = Open(true);
  ASSERT_NE(store, nullptr);
  Result<RecoveryReport> r = store->Recover();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->swept()) << r->unreadable[0];
  EXPECT_EQ(r->broken_stubs, 0u);
  EXPECT_EQ(r->staged_resealed, 0u);
  EXPECT_EQ(r->orphan_packs_removed, 0u);
  EXPECT_EQ(test::CountFiles(path_ + "/packs", true), packs);
  for (const nlohmann::json& f : manifest_["files"]) {
    Result<std::vector<uint8_t>> got = ReadContentAt(store.get(), f["path"].get<std::string>());
    ASSERT_TRUE(got.ok()) << f["path"] << ": " << got.status().ToString();
    EXPECT_TRUE(*got == ReadFileBytes((kGolden / f["expected"].get<std::string>()).string())) << f["path"];
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenStoreTest, ::testing::ValuesIn(GoldenStores()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string n = p.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(GoldenStores, CoverEveryPackVersionAndCodec) {
  std::set<uint32_t> versions;
  std::set<std::string> codecs;
  for (const std::string& name : GoldenStores()) {
    const nlohmann::json m = Manifest(name);
    for (uint32_t v : m["pack_versions"]) versions.insert(v);
    for (const nlohmann::json& c : m["codecs"]) codecs.insert(c.get<std::string>());
  }
  EXPECT_EQ(versions, (std::set<uint32_t>{1, 2, 3, 4, 5}));
  std::set<std::string> all;
  for (const auto& [name, codec] : kCodecByName) all.insert(name);
  EXPECT_EQ(codecs, all);
}

}  // namespace
}  // namespace ckptfs
