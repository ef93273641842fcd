// Sealing with several workers (PackWorkers, StoreOptions::seal_workers):
// the pack holds the same chunks, in the same places, as one thread writes;
// failures are the ones one thread would meet first; deltas and dedup work
// per worker.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "store/pack.h"
#include "store/store.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using Bytes = std::vector<uint8_t>;

// A file mixing an npy tensor, zeros, text and random bytes, 20 chunks of 64 KiB and a bit.
Bytes MixedFile(std::vector<TensorRange>* ranges) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0, 0.02f);
  Bytes f32(4 * 200000);
  for (size_t i = 0; i < f32.size(); i += 4) {
    const float v = normal(rng);
    std::memcpy(f32.data() + i, &v, 4);
  }
  Bytes file = test::NpyF32(f32);
  ranges->push_back({file.size() - f32.size(), f32.size(), DType::kF32, 0});
  file.resize(file.size() + 70000, 0);
  const Bytes text = test::CompressibleBytes(150000, 6), noise = test::RandomBytes(90001, 7);
  file.insert(file.end(), text.begin(), text.end());
  file.insert(file.end(), noise.begin(), noise.end());
  return file;
}

class SealWorkersTest : public ::testing::Test {
 protected:
  Result<PackStats> Write(const Bytes& content, unsigned workers, const std::string& name,
                          std::span<const TensorRange> tensors, uint64_t size,
                          const std::atomic<bool>* cancel = nullptr) {
    test::WriteFileBytes(dir_.Sub("src"), content);
    ASSIGN_OR_RETURN(UniqueFd src, env_->OpenAt(AT_FDCWD, dir_.Sub("src"), O_RDONLY));
    ASSIGN_OR_RETURN(UniqueFd dst, env_->OpenAt(AT_FDCWD, dir_.Sub(name), O_CREAT | O_TRUNC | O_RDWR, 0644));
    return WritePack(env_, src.get(), size, dst.get(), 64 << 10, {}, cancel, tensors, PackWorkers{workers, {}});
  }
  Result<std::shared_ptr<PackReader>> Open(const std::string& name) {
    ASSIGN_OR_RETURN(UniqueFd fd, env_->OpenAt(AT_FDCWD, dir_.Sub(name), O_RDONLY));
    return PackReader::Open(env_, std::move(fd), name);
  }

  test::TempDir dir_;
  Env* env_ = Env::Default();
};

TEST_F(SealWorkersTest, SameChunksAsOneThread) {
  std::vector<TensorRange> ranges;
  const Bytes file = MixedFile(&ranges);
  ASSERT_OK(Write(file, 1, "one", ranges, file.size()).status());
  auto one = Open("one");
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  for (unsigned workers : {2u, 3u, 8u, 64u}) {
    const std::string name = "w" + std::to_string(workers);
    ASSERT_OK(Write(file, workers, name, ranges, file.size()).status());
    auto many = Open(name);
    ASSERT_TRUE(many.ok()) << many.status().ToString();
    ASSERT_EQ((*many)->chunks().size(), (*one)->chunks().size());
    for (size_t i = 0; i < (*one)->chunks().size(); ++i) {
      const ChunkEntry &a = (*one)->chunks()[i], &b = (*many)->chunks()[i];
      EXPECT_EQ(a.offset, b.offset) << name << " chunk " << i;
      EXPECT_EQ(a.stored_len, b.stored_len) << name << " chunk " << i;
      EXPECT_EQ(a.codec, b.codec) << name << " chunk " << i;
      EXPECT_EQ(a.stored_checksum, b.stored_checksum) << name << " chunk " << i;
      EXPECT_EQ(a.raw_checksum, b.raw_checksum) << name << " chunk " << i;
    }
    EXPECT_EQ((*many)->meta().chunk_hash, (*one)->meta().chunk_hash);
    EXPECT_EQ((*many)->stored_size(), (*one)->stored_size());
    Bytes back, chunk;
    for (uint64_t i = 0; i < (*many)->chunks().size(); ++i) {
      ASSERT_OK((*many)->ReadChunk(i, &chunk));
      back.insert(back.end(), chunk.begin(), chunk.end());
    }
    EXPECT_EQ(back, file) << name;
  }
}

TEST_F(SealWorkersTest, ShrunkSourceIsEagainLikeOneThread) {
  std::vector<TensorRange> ranges;
  const Bytes file = MixedFile(&ranges);
  for (unsigned workers : {1u, 4u}) {
    Result<PackStats> st = Write(file, workers, "p", ranges, file.size() + 200000);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), EAGAIN) << workers;
    EXPECT_NE(st.status().message().find("got end of file at " + std::to_string(file.size())), std::string::npos)
        << st.status().message();
  }
}

TEST_F(SealWorkersTest, CancelStopsEveryWorker) {
  std::vector<TensorRange> ranges;
  const Bytes file = MixedFile(&ranges);
  std::atomic<bool> cancel{true};
  Result<PackStats> st = Write(file, 4, "p", ranges, file.size(), &cancel);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), ECANCELED);
}

TEST_F(SealWorkersTest, PlannersMustMatchTheWorkers) {
  std::vector<TensorRange> ranges;
  const Bytes file = MixedFile(&ranges);
  test::WriteFileBytes(dir_.Sub("src"), file);
  auto src = env_->OpenAt(AT_FDCWD, dir_.Sub("src"), O_RDONLY);
  auto dst = env_->OpenAt(AT_FDCWD, dir_.Sub("p"), O_CREAT | O_TRUNC | O_RDWR, 0644);
  ASSERT_TRUE(src.ok() && dst.ok());
  ChunkPlanner* one[] = {nullptr};
  Result<PackStats> st =
      WritePack(env_, src->get(), file.size(), dst->get(), 64 << 10, {}, nullptr, ranges, PackWorkers{3, one});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), EINVAL);
}

// Holds the coding of one chunk until a later chunk has been reached, so
// that chunks finish out of file order; may fail chosen chunks. Shared by
// every worker's planner.
class GatedPlanner : public ChunkPlanner {
 public:
  GatedPlanner(uint64_t chunk, uint64_t hold, uint64_t until, std::map<uint64_t, Status> fail)
      : chunk_(chunk), hold_(hold), until_(until), fail_(std::move(fail)) {}

  Result<std::optional<ChunkPlan>> TransformLossy(uint64_t offset, std::span<uint8_t>,
                                                  std::span<const TensorRange>) override {
    const uint64_t i = offset / chunk_;
    std::unique_lock lk(mu_);
    if (i == hold_ && !reached_cv_.wait_for(lk, std::chrono::seconds(20), [&] { return reached_.count(until_); })) {
      held_too_long_ = true;
    }
    reached_.insert(i);
    reached_cv_.notify_all();
    if (fail_.count(i)) return fail_.at(i);
    return std::optional<ChunkPlan>{};
  }
  std::optional<ChunkPlan> PlanRef(uint64_t, std::span<const uint8_t>, uint64_t,
                                   std::span<const TensorRange>) override {
    return std::nullopt;
  }
  std::optional<ChunkPlan> PlanDelta(uint64_t, std::span<const uint8_t>, std::span<const TensorRange>,
                                     const std::function<size_t()>&) override {
    return std::nullopt;
  }
  // Whether the held chunk waited in vain: the others could not go on.
  bool held_too_long() const { return held_too_long_; }

 private:
  const uint64_t chunk_, hold_, until_;
  const std::map<uint64_t, Status> fail_;
  std::mutex mu_;
  std::condition_variable reached_cv_;
  std::set<uint64_t> reached_;
  bool held_too_long_ = false;
};

class SealWorkersOrderTest : public SealWorkersTest {
 protected:
  Result<PackStats> WriteGated(const Bytes& file, std::span<const TensorRange> ranges, GatedPlanner* gate) {
    test::WriteFileBytes(dir_.Sub("src"), file);
    ASSIGN_OR_RETURN(UniqueFd src, env_->OpenAt(AT_FDCWD, dir_.Sub("src"), O_RDONLY));
    ASSIGN_OR_RETURN(UniqueFd dst, env_->OpenAt(AT_FDCWD, dir_.Sub("gated"), O_CREAT | O_TRUNC | O_RDWR, 0644));
    ChunkPlanner* const planners[] = {gate, gate};
    return WritePack(env_, src.get(), file.size(), dst.get(), 64 << 10, {}, nullptr, ranges, PackWorkers{2, planners});
  }
};

// A worker whose chunk is coded while an earlier one is not leaves it
// waiting and codes the next: chunk 0 is held until chunk 2 is reached,
// which only the other worker can do, past chunk 1.
TEST_F(SealWorkersOrderTest, WorkerGoesOnPastAChunkStillBeingCoded) {
  std::vector<TensorRange> ranges;
  const Bytes file = MixedFile(&ranges);
  ASSERT_OK(Write(file, 1, "one", ranges, file.size()).status());
  GatedPlanner gate(64 << 10, 0, 2, {});
  ASSERT_OK(WriteGated(file, ranges, &gate).status());
  EXPECT_FALSE(gate.held_too_long());
  auto one = Open("one");
  auto gated = Open("gated");
  ASSERT_TRUE(one.ok() && gated.ok());
  ASSERT_EQ((*gated)->chunks().size(), (*one)->chunks().size());
  for (size_t i = 0; i < (*one)->chunks().size(); ++i) {
    EXPECT_EQ((*gated)->chunks()[i].offset, (*one)->chunks()[i].offset) << i;
    EXPECT_EQ((*gated)->chunks()[i].stored_checksum, (*one)->chunks()[i].stored_checksum) << i;
  }
  EXPECT_EQ((*gated)->stored_size(), (*one)->stored_size());
}

// Chunk 2 fails before chunk 1 does (chunk 1 waits for it): the caller
// still gets chunk 1's failure, the first in file order.
TEST_F(SealWorkersOrderTest, FirstFailureInFileOrderWhenALaterOneFailsFirst) {
  std::vector<TensorRange> ranges;
  const Bytes file = MixedFile(&ranges);
  GatedPlanner gate(64 << 10, 1, 2,
                    {{1, Status::Error(EIO, "chunk 1 failed")}, {2, Status::Error(ENOSPC, "chunk 2 failed")}});
  Result<PackStats> st = WriteGated(file, ranges, &gate);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), EIO) << st.status().ToString();
  EXPECT_NE(st.status().message().find("chunk 1 failed"), std::string::npos) << st.status().message();
  EXPECT_FALSE(gate.held_too_long());
}

// Through a store: a lineage of checkpoints sealed by several workers (each
// with its own delta planner) stores what one worker stores, deltas included.
struct Sealed {
  std::vector<uint64_t> stored;
  std::vector<Bytes> read_back;
};

Sealed SealLineage(unsigned workers, uint64_t* delta_free, double lossy = 0) {
  test::TempDir dir;
  StoreOptions o = test::SmallChunks(64 << 10);
  o.seal_workers = workers;
  o.lossy = lossy;
  auto store = Store::Open(Env::Default(), dir.path(), o);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_TRUE((*store)->Recover().ok());  // loads the pack index, which lineage needs
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0, 0.02f);
  std::vector<float> w(300000);
  for (float& v : w) v = normal(rng);
  Sealed out;
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < w.size(); i += 3) w[i] += 1e-4f * normal(rng);
    const Bytes file = test::NpyF32({reinterpret_cast<const uint8_t*>(w.data()), 4 * w.size()});
    const std::string name = "step" + std::to_string(step) + ".npy";
    auto rec = test::MakeSealedFile(store->get(), name, file);
    EXPECT_TRUE(rec.ok()) << rec.status().ToString();
    auto back = test::ReadContentAt(store->get(), name);
    EXPECT_TRUE(back.ok() && back->size() == file.size()) << name;
    EXPECT_TRUE(lossy > 0 || (back.ok() && *back == file)) << name;
    out.read_back.push_back(back.ok() ? *back : Bytes{});
    auto usage = (*store)->Usage(name);
    out.stored.push_back(usage.ok() && usage->size() == 1 ? (*usage)[0].stored : 0);
    if (step == 2) *delta_free = usage.ok() && usage->size() == 1 ? (*usage)[0].base : 0;
  }
  return out;
}

TEST(SealWorkersStore, LineageStoresWhatOneWorkerStores) {
  uint64_t base_one = 0, base_many = 0;
  const Sealed one = SealLineage(1, &base_one);
  const Sealed many = SealLineage(4, &base_many);
  EXPECT_EQ(one.stored, many.stored);
  EXPECT_NE(base_many, 0u) << "the third checkpoint was not stored against the second";
  EXPECT_LT(many.stored[2], many.stored[0]) << "deltas should make later checkpoints smaller";
}

TEST(SealWorkersStore, LossyLineageReconstructsTheSameOnAnyWorkerCount) {
  uint64_t base_one = 0, base_many = 0;
  const Sealed one = SealLineage(1, &base_one, 0.01);
  const Sealed many = SealLineage(4, &base_many, 0.01);
  EXPECT_EQ(one.stored, many.stored);
  EXPECT_EQ(one.read_back, many.read_back);
  EXPECT_NE(base_many, 0u) << "lossy chunks are predicted from the predecessor";
}

// torch.save checkpoints (model and Adam state, tests/data/golden/inputs)
// in 4 KiB chunks: the zip CRC pass runs on every worker, joining the CRCs
// of chunks coded in any order, and the pack's pass reuses its choices.
Sealed SealTorchLineage(unsigned workers) {
  test::TempDir dir;
  StoreOptions o = test::SmallChunks(4096);
  o.seal_workers = workers;
  o.lossy = 0.05;
  auto store = Store::Open(Env::Default(), dir.path(), o);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_TRUE((*store)->Recover().ok());
  Sealed out;
  for (const char* name : {"ckpt1.pt", "ckpt2.pt"}) {
    const Bytes file = test::ReadFileBytes(std::string(CKPTFS_SOURCE_DIR) + "/tests/data/golden/inputs/lossy/" + name);
    auto rec = test::MakeSealedFile(store->get(), name, file);
    EXPECT_TRUE(rec.ok()) << rec.status().ToString();
    auto back = test::ReadContentAt(store->get(), name);
    EXPECT_TRUE(back.ok() && back->size() == file.size()) << name;
    EXPECT_TRUE(back.ok() && *back != file) << name << ": nothing was coded lossily";
    out.read_back.push_back(back.ok() ? *back : Bytes{});
    auto usage = (*store)->Usage(name);
    out.stored.push_back(usage.ok() && usage->size() == 1 ? (*usage)[0].stored : 0);
  }
  return out;
}

TEST(SealWorkersStore, LossyTorchZipIsTheSameOnAnyWorkerCount) {
  const Sealed one = SealTorchLineage(1);
  for (unsigned workers : {2u, 5u}) {
    const Sealed many = SealTorchLineage(workers);
    EXPECT_EQ(one.stored, many.stored) << workers << " workers";
    EXPECT_EQ(one.read_back, many.read_back) << workers << " workers";
  }
}

}  // namespace
}  // namespace ckptfs
