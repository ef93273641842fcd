// Delta, dedup and lineage in the store: chunks stored against other packs
// read back bit-exact, and deleting any file (or crashing while its packs
// are collected) never breaks another.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include "cache/chunk_cache.h"
#include "codec/formats/layout.h"
#include "store/base_closeness.h"
#include "store/pack_index.h"
#include "store/store.h"
#include "tests/unit/fault_env.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using test::TempDir;

constexpr uint32_t kChunk = 64 * 1024;

StoreOptions Opts(uint32_t keyframe_every = 8) {
  StoreOptions o = test::SmallChunks(kChunk);
  o.keyframe_every = keyframe_every;
  return o;
}

// A .npy file of f32 weights: recognised by content, so its tensor is coded
// (and matched against predecessors) by element type.
std::vector<uint8_t> Npy(const std::vector<float>& w) {
  return test::NpyF32({reinterpret_cast<const uint8_t*>(w.data()), 4 * w.size()});
}

// A safetensors file of f32 tensors, in the order given; `header_pad`
// spaces (a multiple of 8) grow its header, which moves every tensor.
std::vector<uint8_t> Safetensors(const std::vector<std::pair<std::string, std::vector<float>>>& tensors,
                                 size_t header_pad = 0) {
  std::string json = "{";
  uint64_t off = 0;
  for (const auto& [name, w] : tensors) {
    if (json.size() > 1) json += ",";
    json += "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(w.size()) + "],\"data_offsets\":[" +
            std::to_string(off) + "," + std::to_string(off + 4 * w.size()) + "]}";
    off += 4 * w.size();
  }
  json += "}";
  while (json.size() % 8 != 0) json += ' ';
  json.append(header_pad, ' ');
  std::vector<uint8_t> b(8);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(static_cast<uint64_t>(json.size()) >> (8 * i));
  b.insert(b.end(), json.begin(), json.end());
  for (const auto& [name, w] : tensors) {
    const size_t at = b.size();
    b.resize(at + 4 * w.size());
    std::memcpy(b.data() + at, w.data(), 4 * w.size());
  }
  return b;
}

std::vector<float> Weights(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 0.02f);
  std::vector<float> w(n);
  for (float& x : w) x = d(rng);
  return w;
}

// Training-like versions: the same weights, each step nudging them a little
// (and leaving the second half, a "frozen" part, untouched).
std::vector<std::vector<uint8_t>> Versions(int n, size_t elems = 300000) {
  std::mt19937 rng(7);
  std::normal_distribution<float> init(0.f, 0.02f), step(0.f, 1e-5f);
  std::vector<float> w(elems);
  for (float& x : w) x = init(rng);
  std::vector<std::vector<uint8_t>> out;
  for (int v = 0; v < n; ++v) {
    out.push_back(Npy(w));
    for (size_t i = 0; i < elems / 2; ++i) w[i] += step(rng);
  }
  return out;
}

class LineageTest : public ::testing::Test {
 protected:
  void SetUp() override { Reopen(); }
  void Reopen(Env* env = Env::Default(), uint32_t keyframe_every = 8) {
    store_.reset();
    auto s = Store::Open(env, dir_.path(), Opts(keyframe_every));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
    auto rep = store_->Recover();  // loads the pack index, as a mount does
    ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  }
  void Seal(const std::string& name, const std::vector<uint8_t>& bytes) {
    auto r = test::MakeSealedFile(store_.get(), name, bytes);
    ASSERT_TRUE(r.ok()) << name << ": " << r.status().ToString();
  }
  void Delete(const std::string& name, bool expect_ok = true) {
    auto fd = store_->env()->OpenAt(store_->ns_fd(), name, O_RDWR);
    auto rec = fd.ok() ? ReadStub(store_->env(), fd->get()) : Result<StubRecord>(fd.status());
    if (!expect_ok && !rec.ok()) return;  // the "process" has crashed: nothing more happens
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    ASSERT_EQ(::unlinkat(store_->ns_fd(), name.c_str(), 0), 0);
    const Status s = store_->ReleaseStubObjects(*rec);
    if (expect_ok) {
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
  }
  void ExpectContent(const std::string& name, const std::vector<uint8_t>& want) {
    auto got = test::ReadContentAt(store_.get(), name);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status().ToString();
    EXPECT_TRUE(*got == want) << name << " differs";
  }
  FileUsage UsageOf(const std::string& name) {
    auto u = store_->Usage(name);
    EXPECT_TRUE(u.ok() && u->size() == 1);
    return u.ok() && !u->empty() ? u->front() : FileUsage{};
  }
  void ExpectFsckClean() {
    auto f = store_->Fsck();
    ASSERT_TRUE(f.ok());
    EXPECT_TRUE(f->clean()) << f->errors.front();
    EXPECT_TRUE(f->warnings.empty()) << f->warnings.front();
  }
  size_t Packs() { return test::CountFiles(dir_.Sub("packs"), true); }

  static constexpr uint64_t kNoCrash = UINT64_MAX;
  // Runs `scenario` once without a crash (it returns how many mutations it
  // made, at least two pack deletions), then once per crash point.
  void ForEachCrashPoint(const std::function<uint64_t(uint64_t k)>& scenario) {
    const uint64_t total = scenario(kNoCrash);
    EXPECT_GE(total, 2u);
    for (uint64_t k = 0; k <= total; ++k) {
      SCOPED_TRACE("crash after mutation " + std::to_string(k));
      scenario(k);
    }
  }
  // An empty store holding versions v0, v1, ... as a chain.
  void FreshStoreWith(const std::vector<std::vector<uint8_t>>& v) {
    store_.reset();
    std::filesystem::remove_all(dir_.path());
    std::filesystem::create_directories(dir_.path());
    Reopen();
    for (size_t i = 0; i < v.size(); ++i) Seal("v" + std::to_string(i), v[i]);
  }
  // Whatever files are left read back exactly and fsck is clean; deleting
  // them then leaves no pack behind.
  void ExpectSurvivorsThenCollectAll(const std::vector<std::vector<uint8_t>>& v) {
    std::vector<std::string> left;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string name = "v" + std::to_string(i);
      if (::faccessat(store_->ns_fd(), name.c_str(), F_OK, 0) != 0) continue;
      ExpectContent(name, v[i]);
      left.push_back(name);
    }
    ExpectFsckClean();
    for (const std::string& name : left) Delete(name);
    EXPECT_EQ(Packs(), 0u);
  }

  TempDir dir_;
  std::unique_ptr<Store> store_;
};

TEST_F(LineageTest, SuccessorIsStoredAsDeltaAndReadsBack) {
  auto v = Versions(2);
  Seal("a", v[0]);
  Seal("b", v[1]);
  ExpectContent("a", v[0]);
  ExpectContent("b", v[1]);
  const FileUsage a = UsageOf("a"), b = UsageOf("b");
  EXPECT_EQ(b.base, a.pack);
  EXPECT_EQ(b.depth, 1u);
  // Half the tensor is unchanged: the successor costs well under half.
  EXPECT_LT(b.stored * 2, a.stored);
  ExpectFsckClean();
}

// The seal reads a delta's base with ReadPackRangeOnce: the same bytes as
// ReadPackRange for whole chunks (decoded straight into the buffer, chunks
// stored against other packs included), partial and straddling ranges, and
// a chunk the cache already holds; a miss leaves the cache as it was.
TEST_F(LineageTest, ReadPackRangeOnceReadsWhatReadPackRangeReads) {
  auto v = Versions(3);
  for (size_t i = 0; i < v.size(); ++i) Seal("v" + std::to_string(i), v[i]);
  ChunkCache cache(64 << 20);
  store_->SetBaseCache(&cache);
  const FileUsage last = UsageOf("v2");
  ASSERT_GT(last.depth, 0u);
  const uint64_t size = v[2].size();
  std::vector<uint8_t> want, got;
  auto check = [&](uint64_t off, uint64_t len) {
    SCOPED_TRACE(std::to_string(off) + "+" + std::to_string(len));
    want.assign(len, 0);
    got.assign(len, 0xEE);
    ASSERT_TRUE(store_->ReadPackRange(last.pack, off, want).ok());
    ASSERT_TRUE(store_->ReadPackRangeOnce(last.pack, off, got).ok());
    EXPECT_TRUE(got == want);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), v[2].begin() + static_cast<ptrdiff_t>(off)));
  };
  for (uint64_t off = 0; off < size; off += kChunk) {
    const uint64_t len = std::min<uint64_t>(kChunk, size - off);
    got.assign(len, 0xEE);
    ASSERT_TRUE(store_->ReadPackRangeOnce(last.pack, off, got).ok());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), v[2].begin() + static_cast<ptrdiff_t>(off))) << off;
    EXPECT_FALSE(cache.Contains(ChunkKey{last.pack, off / kChunk})) << off;
    check(off, len);  // now cached: the cache's copy
  }
  check(kChunk / 2, kChunk);  // straddles two chunks
  check(3, 100);
  std::vector<uint8_t> past(kChunk);
  EXPECT_FALSE(store_->ReadPackRangeOnce(last.pack, size - kChunk / 2, past).ok());
  store_->SetBaseCache(nullptr);
}

// DCP-style shards: every rank's file has the same layout, so by layout
// alone each step-2 shard matches all three step-1 shards (and the most
// recent would win). The content picks the rank's own predecessor.
TEST_F(LineageTest, ShardsOfEqualLayoutFindTheirOwnRanksPredecessor) {
  constexpr size_t kElems = 60000;
  std::vector<std::vector<float>> rank(3);
  for (uint32_t r = 0; r < 3; ++r) rank[r] = Weights(kElems, 100 + r);
  for (uint32_t r = 0; r < 3; ++r) Seal("s1_r" + std::to_string(r), Npy(rank[r]));
  for (uint32_t r : {2u, 0u, 1u}) {  // sealed out of rank order, as nodes finish
    std::vector<float> next = rank[r];
    for (size_t i = 0; i < kElems; i += 3) next[i] += 1e-5f;
    const std::string name = "s2_r" + std::to_string(r);
    Seal(name, Npy(next));
    ExpectContent(name, Npy(next));
    EXPECT_EQ(UsageOf(name).base, UsageOf("s1_r" + std::to_string(r)).pack) << name;
    EXPECT_LT(UsageOf(name).stored * 2, UsageOf("s1_r" + std::to_string(r)).stored) << name;
  }
  ExpectFsckClean();
}

BaseChoice Candidate(ObjectId pack, uint64_t size, uint8_t depth) {
  BaseChoice c{pack, size, size, {uint64_t{0}}, {}};
  c.depth = depth;
  return c;
}

// Between predecessors equally close where they are compared (copies of one
// save; a lossless file and its lossy twin that reconstructs it exactly),
// the shallower chain is the base, whichever comes first; a closer one
// still wins over a shallower one.
TEST(BaseClosenessTest, EquallyCloseCandidatesPreferTheShallowerChain) {
  std::vector<float> w = Weights(8192, 301), far = w;
  for (float& x : far) x += 1e-3f;
  const std::vector<uint8_t> file(reinterpret_cast<const uint8_t*>(w.data()),
                                  reinterpret_cast<const uint8_t*>(w.data() + w.size()));
  test::MemBases bases;
  bases.packs[1] = bases.packs[2] = file;
  bases.packs[3].assign(reinterpret_cast<const uint8_t*>(far.data()),
                        reinterpret_cast<const uint8_t*>(far.data() + far.size()));
  const std::vector<TensorRange> ranges = {{0, file.size(), DType::kF32}};
  const SpanSource src(file);
  const uint64_t n = file.size();
  EXPECT_EQ(ClosestBase(src, ranges, std::vector{Candidate(1, n, 1), Candidate(2, n, 0)}, bases), 1u);
  EXPECT_EQ(ClosestBase(src, ranges, std::vector{Candidate(2, n, 0), Candidate(1, n, 1)}, bases), 0u);
  EXPECT_EQ(ClosestBase(src, ranges, std::vector{Candidate(1, n, 2), Candidate(2, n, 2)}, bases), 0u);
  EXPECT_EQ(ClosestBase(src, ranges, std::vector{Candidate(3, n, 0), Candidate(1, n, 3)}, bases), 1u);
}

// Candidates carry the deepest chain among their pack's chunks.
TEST(BaseClosenessTest, CandidatesCarryTheirDeepestChain) {
  PackIndex index;
  const std::vector<TensorRange> ranges = {{0, 8 * kChunk, DType::kF32}};
  PackMeta keyframe, twin;
  keyframe.tensors = twin.tensors = ranges;
  keyframe.chunk_hash = twin.chunk_hash = std::vector<uint64_t>(8, 0);
  keyframe.chunk_depth = std::vector<uint8_t>(8, 0);
  twin.chunk_depth = {0, 2, 1, 0, 0, 0, 0, 0};
  index.Add(1, keyframe, 8 * kChunk, kChunk);
  index.Add(2, twin, 8 * kChunk, kChunk);
  index.AddRoot(1);  // files name them
  index.AddRoot(2);
  const std::vector<BaseChoice> c = index.FindBaseCandidates(ranges, 0.9, 8);
  ASSERT_EQ(c.size(), 2u);
  for (const BaseChoice& b : c) EXPECT_EQ(b.depth, b.pack == 2 ? 2u : 0u) << b.pack;
}

TEST(BaseClosenessTest, SampleDistanceByElementType) {
  const float a[] = {1.f, 2.f, 3.f}, b[] = {1.f, 2.5f, 2.f}, inf[] = {1.f, INFINITY, 3.f};
  auto bytes = [](const float* f) { return std::span(reinterpret_cast<const uint8_t*>(f), 12); };
  EXPECT_DOUBLE_EQ(SampleDistance(DType::kF32, bytes(a), bytes(a)), 0.0);
  EXPECT_DOUBLE_EQ(SampleDistance(DType::kF32, bytes(a), bytes(b)), 1.5);
  EXPECT_GT(SampleDistance(DType::kF32, bytes(a), bytes(inf)), 1e20);
  EXPECT_DOUBLE_EQ(SampleDistance(DType::kI32, bytes(a), bytes(b)), 2.0);  // bytes that differ
}

TEST_F(LineageTest, IdenticalCopyAddsUnderOnePercent) {
  auto v = Versions(1);
  Seal("epoch_3.ckpt", v[0]);
  Seal("last.ckpt", v[0]);
  const FileUsage copy = UsageOf("last.ckpt");
  EXPECT_LT(copy.stored * 100, copy.logical);
  ExpectContent("last.ckpt", v[0]);
}

// Matching is per tensor: a file that adds a tensor in front (so every
// offset moves) still stores the shared tensor against its predecessor.
TEST_F(LineageTest, PartlyMatchingFileWithShiftedTensorsBenefits) {
  const std::vector<float> backbone = Weights(200000, 1), head = Weights(30001, 2);
  const auto a = Safetensors({{"backbone", backbone}});
  const auto b = Safetensors({{"head", head}, {"backbone", backbone}});
  Seal("a.safetensors", a);
  Seal("b.safetensors", b);
  const FileUsage fa = UsageOf("a.safetensors"), fb = UsageOf("b.safetensors");
  EXPECT_EQ(fb.base, fa.pack);
  // Only the head (and the chunks it straddles) costs anything.
  EXPECT_LT(fb.stored, fa.stored / 2) << fb.stored << " vs " << fa.stored;
  ExpectContent("b.safetensors", b);
  Reopen();
  ExpectContent("b.safetensors", b);
  ExpectFsckClean();
}

// torch.save aligns tensor records to 64 bytes, so a pickle that grows
// across that alignment moves every tensor by 64 bytes. A file whose header
// grew (its first chunk's base window then starts before the predecessor:
// pack version 5) or shrank by 64 bytes is still a delta of its
// predecessor, about as small as without the move, whether it is one
// chunk or several; the next save, laid out alike, builds on it.
struct LayoutShift {
  int64_t shift;  // how much the header grew
  size_t elems;
};

void PrintTo(const LayoutShift& s, std::ostream* os) { *os << "shift " << s.shift << ", " << s.elems << " f32"; }

class LayoutShiftTest : public LineageTest, public ::testing::WithParamInterface<LayoutShift> {
 protected:
  uint32_t PackVersion(ObjectId pack) {
    auto r = store_->OpenPack(pack);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? (*r)->header().version : 0;
  }
};

TEST_P(LayoutShiftTest, MovedTensorsAreStillDeltas) {
  const auto [shift, elems] = GetParam();
  std::vector<std::vector<float>> w{Weights(elems, 21)};
  std::mt19937 rng(5);
  std::normal_distribution<float> step(0.f, 1e-5f);
  for (int v = 1; v < 3; ++v) {
    w.push_back(w.back());
    for (size_t i = 0; i < elems / 2; ++i) w.back()[i] += step(rng);
  }
  const size_t pad_before = shift < 0 ? static_cast<size_t>(-shift) : 0;
  const size_t pad_after = shift > 0 ? static_cast<size_t>(shift) : 0;
  const std::vector<uint8_t> first = Safetensors({{"w", w[0]}}, pad_before);
  const std::vector<std::vector<uint8_t>> moved = {first, Safetensors({{"w", w[1]}}, pad_after),
                                                   Safetensors({{"w", w[2]}}, pad_after)};
  ASSERT_EQ(static_cast<int64_t>(moved[1].size()), static_cast<int64_t>(first.size()) + shift);

  FreshStoreWith({first, Safetensors({{"w", w[1]}}, pad_before)});
  const FileUsage unmoved = UsageOf("v1");
  ASSERT_EQ(unmoved.depth, 1u);

  FreshStoreWith(moved);
  const FileUsage f0 = UsageOf("v0"), f1 = UsageOf("v1"), f2 = UsageOf("v2");
  EXPECT_EQ(f1.base, f0.pack);
  EXPECT_EQ(f1.depth, 1u);
  EXPECT_LE(f1.stored, unmoved.stored + unmoved.stored / 8 + 256) << "unmoved: " << unmoved.stored;
  EXPECT_EQ(PackVersion(f1.pack), shift > 0 ? kPackLeadingBaseVersion : kPackPlainVersion);
  EXPECT_NE(f2.base, 0u);
  EXPECT_GE(f2.depth, 1u);
  EXPECT_LE(f2.stored, unmoved.stored * 2);
  for (size_t i = 0; i < moved.size(); ++i) ExpectContent("v" + std::to_string(i), moved[i]);
  Reopen();
  for (size_t i = 0; i < moved.size(); ++i) ExpectContent("v" + std::to_string(i), moved[i]);
  ExpectFsckClean();
  Delete("v0");  // the first file's pack stays for the deltas
  ExpectContent("v1", moved[1]);
  ExpectContent("v2", moved[2]);
  ExpectSurvivorsThenCollectAll(moved);
}

INSTANTIATE_TEST_SUITE_P(OneChunkAndSeveral, LayoutShiftTest,
                         ::testing::Values(LayoutShift{64, 4000}, LayoutShift{-64, 4000}, LayoutShift{64, 100000},
                                           LayoutShift{-64, 100000}),
                         [](const ::testing::TestParamInfo<LayoutShift>& p) {
                           return std::string(p.param.shift > 0 ? "Grown" : "Shrunk") +
                                  (p.param.elems * 4 < kChunk ? "OneChunk" : "SeveralChunks");
                         });

// Chunks that cost as much against the keyframe at the root of their chain
// as against their predecessor (frozen layers next to a part drawn anew
// each save) are coded against the keyframe, so they stay at depth 1. That
// holds across a move after a delta: the chain is followed through the
// windows of moved chunks too, down to the first file's keyframe.
TEST_P(LayoutShiftTest, ChainsAcrossAMoveStillRootAtTheKeyframe) {
  const auto [shift, elems] = GetParam();
  const size_t pad_before = shift < 0 ? static_cast<size_t>(-shift) : 0;
  const size_t pad_after = shift > 0 ? static_cast<size_t>(shift) : 0;
  std::vector<std::vector<uint8_t>> v;
  for (uint32_t i = 0; i < 4; ++i) {
    std::vector<float> w = Weights(elems, 41);
    const std::vector<float> head = Weights(elems / 8, 50 + i);
    std::copy(head.begin(), head.end(), w.begin());
    v.push_back(Safetensors({{"w", w}}, i < 2 ? pad_before : pad_after));  // moved from the third on
  }
  FreshStoreWith(v);
  for (size_t i = 1; i < v.size(); ++i) {
    const FileUsage f = UsageOf("v" + std::to_string(i));
    EXPECT_EQ(f.depth, 1u) << "v" << i;
    EXPECT_EQ(f.base, UsageOf("v0").pack) << "v" << i;
    ExpectContent("v" + std::to_string(i), v[i]);
  }
  ExpectFsckClean();
}

// A base window may start before its base but never runs past its end: a
// one-chunk file whose header grew and whose last tensor grew too has no
// window in its predecessor, and is stored on its own, as before.
TEST_F(LineageTest, BaseWindowNeverRunsPastTheBase) {
  const std::vector<float> w = Weights(4000, 31);
  const auto a = Safetensors({{"w", w}, {"tail", Weights(100, 32)}});
  const auto b = Safetensors({{"w", w}, {"tail", Weights(120, 32)}}, 64);
  Seal("a", a);
  Seal("b", b);
  EXPECT_EQ(UsageOf("b").depth, 0u);
  EXPECT_EQ(UsageOf("b").base, 0u);
  ExpectContent("b", b);
  ExpectFsckClean();
}

// Orbax-like saves: TensorStore splits one step's arrays into data files
// differently each time, and tensors of one shape (a kernel and its Adam
// moments) are alike by element type and length. Each tensor of step 2
// finds its own predecessor by name, in whichever step-1 file holds it.
TEST_F(LineageTest, NamedTensorsFindTheirPredecessorsAcrossFiles) {
  constexpr size_t kElems = 100000;
  const std::vector<float> w = Weights(kElems, 11), mu = Weights(kElems, 12), nu = Weights(kElems, 13);
  auto nudged = [](std::vector<float> x) {
    for (size_t i = 0; i < x.size(); i += 3) x[i] += 1e-5f;
    return x;
  };
  const auto a = Safetensors({{"params.w", w}, {"mu.w", mu}});
  const auto b = Safetensors({{"nu.w", nu}});
  const auto step2 = Safetensors({{"nu.w", nudged(nu)}, {"params.w", nudged(w)}, {"mu.w", nudged(mu)}});
  Seal("step1_a", a);
  Seal("step1_b", b);
  Seal("step2", step2);
  const FileUsage fa = UsageOf("step1_a"), fb = UsageOf("step1_b"), fc = UsageOf("step2");
  EXPECT_TRUE(fc.base == fa.pack || fc.base == fb.pack) << fc.base;  // the first pack its chunks name
  EXPECT_GT(fc.depth, 0u);
  // Matched by position, nu would be coded against params and params against
  // mu: no gain. By name every tensor is a small delta.
  EXPECT_LT(fc.stored * 2, fa.stored + fb.stored) << fc.stored << " vs " << fa.stored << " + " << fb.stored;
  ExpectContent("step2", step2);
  Reopen();
  ExpectContent("step2", step2);
  ExpectFsckClean();
  Delete("step1_b");
  ExpectContent("step2", step2);
  ExpectFsckClean();
}

// Invariant 3 across a chain: a flipped byte in a base pack makes its own
// file and every file stored against it fail with EIO, never wrong bytes,
// and fsck names them all.
TEST_F(LineageTest, CorruptBaseFailsItsDependentsCleanly) {
  auto v = Versions(2);
  Seal("a", v[0]);
  Seal("b", v[1]);
  const FileUsage a = UsageOf("a");
  ASSERT_EQ(UsageOf("b").base, a.pack);
  const std::string hex = ObjectIdHex(a.pack);
  const std::string pack_path = dir_.Sub("packs/" + hex.substr(0, 2) + "/" + hex + ".pack");
  std::vector<uint8_t> bytes = test::ReadFileBytes(pack_path);
  bytes[64 + 100] ^= 0x40;  // inside the first chunk's payload
  test::WriteFileBytes(pack_path, bytes);
  Reopen();
  for (const char* name : {"a", "b"}) {
    auto got = test::ReadContentAt(store_.get(), name);
    ASSERT_FALSE(got.ok()) << name << " read back despite a corrupt base";
    EXPECT_EQ(got.status().code(), EIO) << got.status().ToString();
  }
  auto f = store_->Fsck();
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f->errors.size(), 2u);
  EXPECT_NE(f->errors[0].find("ns/"), std::string::npos);
  EXPECT_NE(f->errors[1].find("ns/"), std::string::npos);
}

TEST_F(LineageTest, UnrelatedFilesAreStandalone) {
  Seal("x", test::MixedContent(kChunk, 1));
  Seal("y", test::MixedContent(kChunk, 2));
  EXPECT_EQ(UsageOf("y").base, 0u);
  EXPECT_EQ(UsageOf("y").depth, 0u);
}

TEST_F(LineageTest, ChainsStopAtTheKeyframeInterval) {
  Reopen(Env::Default(), /*keyframe_every=*/2);
  auto v = Versions(6);
  for (size_t i = 0; i < v.size(); ++i) Seal("v" + std::to_string(i), v[i]);
  // Keyframes are per chunk: a chunk whose base is already K deep is coded
  // on its own, so no file's deepest chunk exceeds K.
  int deltas = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const uint8_t depth = UsageOf("v" + std::to_string(i)).depth;
    EXPECT_LE(depth, 2u);
    deltas += depth > 0;
    ExpectContent("v" + std::to_string(i), v[i]);
  }
  EXPECT_GE(deltas, 3);
}

// Deleting any position of a chain leaves every other file bit-exact, and
// the packs go away only with the last file that needs them.
TEST_F(LineageTest, DeletingEachPositionOfAChainBreaksNothing) {
  auto v = Versions(4);
  for (int del = 0; del < 4; ++del) {
    SCOPED_TRACE("deleting v" + std::to_string(del));
    for (size_t i = 0; i < v.size(); ++i) Seal("v" + std::to_string(i), v[i]);
    Delete("v" + std::to_string(del));
    for (size_t i = 0; i < v.size(); ++i) {
      if (static_cast<int>(i) != del) ExpectContent("v" + std::to_string(i), v[i]);
    }
    ExpectFsckClean();
    Reopen();  // recovery must keep what the remaining files need
    for (size_t i = 0; i < v.size(); ++i) {
      if (static_cast<int>(i) != del) ExpectContent("v" + std::to_string(i), v[i]);
    }
    for (size_t i = 0; i < v.size(); ++i) {
      if (static_cast<int>(i) != del) Delete("v" + std::to_string(i));
    }
    EXPECT_EQ(Packs(), 0u);
  }
}

TEST_F(LineageTest, RenamingAndOverwritingBasesBreaksNothing) {
  auto v = Versions(3);
  Seal("tmp.ckpt", v[0]);
  ASSERT_EQ(::renameat(store_->ns_fd(), "tmp.ckpt", store_->ns_fd(), "step_1.ckpt"), 0);
  Seal("step_2.ckpt", v[1]);
  EXPECT_NE(UsageOf("step_2.ckpt").base, 0u);
  // Overwrite the base in place with unrelated bytes, as last.ckpt is.
  auto fd = store_->env()->OpenAt(store_->ns_fd(), "step_1.ckpt", O_RDWR);
  ASSERT_TRUE(fd.ok());
  auto old = ReadStub(store_->env(), fd->get());
  ASSERT_TRUE(old.ok());
  ASSERT_EQ(::unlinkat(store_->ns_fd(), "step_1.ckpt", 0), 0);
  EXPECT_OK(store_->ReleaseStubObjects(*old));
  Seal("step_1.ckpt", v[2]);
  ExpectContent("step_2.ckpt", v[1]);
  ExpectContent("step_1.ckpt", v[2]);
  Reopen();
  ExpectContent("step_2.ckpt", v[1]);
  ExpectFsckClean();
}

// A crash at every mutation while deleting the later files of a chain:
// after recovery every surviving file reads back and nothing unneeded is left.
TEST_F(LineageTest, CrashWhileCollectingLosesNothing) {
  const auto v = Versions(3);
  ForEachCrashPoint([&](uint64_t k) -> uint64_t {
    FreshStoreWith(v);
    FaultEnv env;
    Reopen(&env);
    env.ResetCounters();
    if (k != kNoCrash) env.CrashAfterMutations(k);
    Delete("v2", k == kNoCrash);  // each delete frees packs: the leaf, then the middle
    Delete("v1", k == kNoCrash);
    Reopen();
    ExpectSurvivorsThenCollectAll(v);
    return env.mutations();
  });
}

// Files deleted while the daemon was down (or before it could free their
// packs): recovery's mark-and-sweep removes what nothing needs, and a crash
// at any of its deletions is finished by the next recovery.
TEST_F(LineageTest, CrashDuringRecoverySweepLosesNothing) {
  const auto v = Versions(3);
  ForEachCrashPoint([&](uint64_t k) -> uint64_t {
    FreshStoreWith(v);
    EXPECT_EQ(::unlinkat(store_->ns_fd(), "v1", 0), 0);  // no release: the packs stay
    EXPECT_EQ(::unlinkat(store_->ns_fd(), "v2", 0), 0);
    store_.reset();
    FaultEnv env;
    {
      auto s = Store::Open(&env, dir_.path(), Opts());
      EXPECT_TRUE(s.ok()) << s.status().ToString();
      if (!s.ok()) return 0;
      env.ResetCounters();
      if (k != kNoCrash) env.CrashAfterMutations(k);
      auto rep = (*s)->Recover();
      if (k == kNoCrash) {
        EXPECT_TRUE(rep.ok() && rep->orphan_packs_removed == 2u) << (rep.ok() ? "" : rep.status().ToString());
      }
    }
    Reopen();
    EXPECT_EQ(Packs(), 1u);
    ExpectSurvivorsThenCollectAll(v);
    return env.mutations();
  });
}

}  // namespace
}  // namespace ckptfs
