// ComputeDevice: the CPU reference against the definitions, the argument
// checks every device shares, and stream parity: the encoders give the same
// bytes with a device as without one. Parity runs against an emulated GPU
// (the kernels' per-element code in a scrambled thread order, with the CUDA
// device's own slicing) everywhere, and against the real CUDA device when
// one is visible; without one those tests skip and say why.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "codec/chunk_codec.h"
#include "codec/compute_device.h"
#include "codec/compute_jobs.h"
#include "codec/delta_chunk.h"
#include "codec/element_ops.h"
#include "codec/lossless/lanes.h"
#include "codec/lossy/levels.h"
#include "codec/lossy/lossy_chunk.h"
#include "gpu/cuda_device.h"
#include "gpu/device_select.h"
#include "gpu/slices.h"
#include "store/store.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using Bytes = std::vector<uint8_t>;

// Indices 0..n-1 in the order a GPU might happen to run them: strided and
// reversed, so that any dependence between elements would show.
std::vector<size_t> ScrambledOrder(size_t n) {
  std::vector<size_t> order;
  order.reserve(n);
  const size_t step = 97;
  for (size_t s = step; s-- > 0;) {
    for (size_t i = s; i < n; i += step) order.push_back(i);
  }
  return order;
}

// The CUDA device's algorithm on the CPU: its slicing (gpu/slices.h), its
// per-thread element code, and its histogram sampling per slice. Small
// slots force many slices. Counts jobs, so tests see the device was used.
class EmulatedGpu final : public ComputeDevice {
 public:
  explicit EmulatedGpu(size_t slot = 64 << 10) : slot_(slot) {}
  std::string Name() const override { return "emulated gpu"; }
  bool accelerated() const override { return true; }
  size_t min_job_bytes() const override { return 0; }
  mutable std::atomic<int> jobs{0};

  Status Split(const SplitJob& job) const override {
    RETURN_IF_ERROR(CheckJob(job));
    ++jobs;
    const size_t lanes = job.src.size() / job.w;
    const size_t per = gpu::SplitSliceLanes(job.w, slot_);
    for (ByteCounts& h : job.hists) h.fill(0);
    for (size_t first = 0; first < lanes; first += per) {
      const size_t n = std::min(per, lanes - first);
      Bytes dev(n * job.w);  // the slice's planes, as in device memory
      uint8_t* planes[8];
      for (unsigned k = 0; k < job.w; ++k) planes[k] = dev.data() + k * n;
      for (size_t i : ScrambledOrder(n)) ops::SplitLaneW(job.w, job.rotate, job.src.data() + first * job.w, i, planes);
      for (unsigned k = 0; k < job.w; ++k) std::memcpy(job.planes[k] + first, planes[k], n);
      for (size_t k = 0; k < job.hists.size(); ++k) {
        for (size_t j = 0; j * job.hist_stride < n; ++j) ++job.hists[k][planes[k][j * job.hist_stride]];
      }
    }
    return Status::Ok();
  }

  Status Residual(const ResidualJob& job) const override {
    RETURN_IF_ERROR(CheckJob(job));
    ++jobs;
    for (size_t begin = 0; begin < job.raw.size();) {
      const size_t end = gpu::ResidualSliceEnd(job, begin, slot_);
      if (end <= begin) return Status::InvalidArgument("empty slice");
      size_t max_lanes = 0;
      const std::vector<LaneRun> runs = gpu::RunsInSlice(job, begin, end, &max_lanes);
      const uint8_t* raw = job.raw.data() + begin;
      const uint8_t* base = job.base.data() + begin;
      uint8_t* out = job.out.data() + begin;
      for (size_t i : ScrambledOrder(end - begin)) out[i] = raw[i] ^ base[i];
      for (const LaneRun& r : runs) {
        EXPECT_LE((r.end - r.begin) / r.width, max_lanes);
        for (size_t j : ScrambledOrder((r.end - r.begin) / r.width)) {
          ops::DiffLaneW(r.width, raw, base, out, r.begin + j * r.width);
        }
      }
      begin = end;
    }
    return Status::Ok();
  }

  Status QClasses(const QClassJob& job) const override {
    RETURN_IF_ERROR(CheckJob(job));
    ++jobs;
    for (size_t i : ScrambledOrder(job.r.size())) {
      job.out[i] = job.forced[i] ? ops::kQClassForced : ops::QClassOf(job.w[i], job.r[i]);
    }
    return Status::Ok();
  }

  Status NearestLevels(const NearestLevelJob& job) const override {
    RETURN_IF_ERROR(CheckJob(job));
    ++jobs;
    for (size_t i : ScrambledOrder(job.r.size())) {
      job.out[i] = ops::NearestLevelIndex(job.bounds.data(), static_cast<uint32_t>(job.bounds.size()), job.r[i]);
    }
    return Status::Ok();
  }

 private:
  size_t slot_;
};

// The real GPU, or null with the reason in `why`.
const ComputeDevice* CudaOrNull(std::string* why) {
  static std::string reason;
  static std::unique_ptr<ComputeDevice> dev = [] {
    Result<std::unique_ptr<ComputeDevice>> d = gpu::OpenCudaDevice({256 << 20, 0});
    if (!d.ok()) {
      reason = d.status().message();
      return std::unique_ptr<ComputeDevice>();
    }
    return std::move(*d);
  }();
  *why = reason;
  return dev.get();
}

#define DEVICE_OR_SKIP(var)                     \
  std::string why_;                             \
  const ComputeDevice* var = CudaOrNull(&why_); \
  if (var == nullptr) {                         \
    GTEST_SKIP() << "no GPU: " << why_;         \
  }

// ---- data -------------------------------------------------------------------------

void PutF32(Bytes* b, float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  for (int i = 0; i < 4; ++i) b->push_back(static_cast<uint8_t>(u >> (8 * i)));
}

// A chunk as a checkpoint holds them: a header, an fp32 weight matrix, an
// Adam second-moment matrix (row and column scales), bf16 weights, int64
// steps; and the tensor ranges (chunk at file offset 4096).
struct Workload {
  Bytes raw;
  std::vector<TensorRange> ranges;
};

Workload MakeWorkload(uint32_t seed, size_t rows = 256, size_t cols = 512) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  Workload w;
  w.raw = test::RandomBytes(777, seed);  // a pickle or JSON header
  const uint64_t at = 4096;
  auto start = [&] { return at + w.raw.size(); };
  uint64_t b = start();
  for (size_t i = 0; i < rows * cols; ++i) PutF32(&w.raw, normal(rng));
  w.ranges.push_back({b, rows * cols * 4, DType::kF32, cols});
  b = start();
  std::vector<float> rs(rows), cs(cols);
  for (float& s : rs) s = std::exp(normal(rng) * 100);
  for (float& s : cs) s = std::exp(normal(rng) * 100);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) PutF32(&w.raw, 1e-8f * rs[r] * cs[c] * (1 + std::abs(normal(rng)) * 10));
  }
  w.ranges.push_back({b, rows * cols * 4, DType::kF32, cols});
  b = start();
  for (size_t i = 0; i < rows * cols; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(normal(rng));
    w.raw.push_back(static_cast<uint8_t>(u >> 16));
    w.raw.push_back(static_cast<uint8_t>(u >> 24));
  }
  w.ranges.push_back({b, rows * cols * 2, DType::kBF16, 0});
  b = start();
  for (size_t i = 0; i < 4096; ++i) {
    const uint64_t step = 1000 + i % 7;
    for (int k = 0; k < 8; ++k) w.raw.push_back(static_cast<uint8_t>(step >> (8 * k)));
  }
  w.ranges.push_back({b, 4096 * 8, DType::kI64, 0});
  return w;
}

// The next checkpoint: most values moved by a few units in the last place,
// some not at all (the tensors start at byte 777 of the chunk).
Bytes NextStep(const Bytes& raw, uint32_t seed) {
  Bytes next = raw;
  std::mt19937 rng(seed);
  for (size_t i = 777; i + 4 <= next.size(); i += 4) {
    if (rng() % 3 == 0) continue;
    uint32_t u;
    std::memcpy(&u, next.data() + i, 4);
    u += static_cast<uint32_t>(rng() % 64) - 32;
    std::memcpy(next.data() + i, &u, 4);
  }
  return next;
}

// ---- stream parity ----------------------------------------------------------------

TensorChunkOptions OptionsOn(const ComputeDevice* dev) {
  TensorChunkOptions o;
  o.planes.device = dev;
  return o;
}

void ExpectLosslessParity(const ComputeDevice* dev) {
  const Workload w = MakeWorkload(7);
  Bytes cpu, on_dev;
  ASSERT_OK(EncodeTensorChunk(w.raw, 4096, w.ranges, OptionsOn(nullptr), &cpu));
  ASSERT_OK(EncodeTensorChunk(w.raw, 4096, w.ranges, OptionsOn(dev), &on_dev));
  EXPECT_EQ(cpu, on_dev) << dev->Name();
  Bytes back(w.raw.size());
  ASSERT_OK(DecodeTensorChunk(on_dev, back));  // decoded here, on the CPU
  EXPECT_EQ(back, w.raw);
}

void ExpectDeltaParity(const ComputeDevice* dev) {
  const Workload w = MakeWorkload(8);
  const Bytes next = NextStep(w.raw, 9);
  const Bytes unrelated = test::RandomBytes(w.raw.size(), 10);  // XOR wins there
  for (const Bytes* base : {&w.raw, &unrelated}) {
    Bytes cpu, on_dev;
    ASSERT_OK(EncodeDeltaChunk(next, *base, 4096, w.ranges, OptionsOn(nullptr), &cpu));
    ASSERT_OK(EncodeDeltaChunk(next, *base, 4096, w.ranges, OptionsOn(dev), &on_dev));
    EXPECT_EQ(cpu, on_dev) << dev->Name();
    Bytes back(next.size());
    ASSERT_OK(DecodeDeltaChunk(on_dev, *base, back));
    EXPECT_EQ(back, next);
  }
}

void ExpectLossyParity(const ComputeDevice* dev) {
  const Workload w = MakeWorkload(11);
  const Bytes next = NextStep(w.raw, 12);
  for (const Bytes* base : {static_cast<const Bytes*>(nullptr), &w.raw}) {
    Bytes recon[2], payload[2];
    for (int d = 0; d < 2; ++d) {
      recon[d] = next;
      // Header exact, weights and second moments lossy, the rest exact.
      const uint64_t cuts[] = {0, w.ranges[0].offset - 4096, w.ranges[1].offset - 4096, w.ranges[2].offset - 4096,
                               next.size()};
      std::vector<lossy::ChunkSegment> segs(4);
      for (size_t i = 0; i < 4; ++i) segs[i].begin = cuts[i], segs[i].end = cuts[i + 1];
      segs[1].lossy = segs[2].lossy = true;
      segs[1].spec = lossy::PieceSpec{DType::kF32, lossy::Domain::kValue, 0.01};
      segs[2].spec = lossy::PieceSpec{DType::kF32, lossy::Domain::kLogBits, 0.1};
      const std::span<const uint8_t> b = base ? std::span<const uint8_t>(*base) : std::span<const uint8_t>();
      ASSERT_OK(lossy::EncodeLossyChunk(recon[d], b, 4096, w.ranges, segs, OptionsOn(d ? dev : nullptr), &payload[d]));
      EXPECT_TRUE(segs[1].coded_lossy) << segs[1].outcome.error;
      EXPECT_TRUE(segs[2].coded_lossy) << segs[2].outcome.error;
    }
    EXPECT_EQ(payload[0], payload[1]) << dev->Name();
    EXPECT_EQ(recon[0], recon[1]);
    Bytes back(next.size());
    ASSERT_OK(
        lossy::DecodeLossyChunk(payload[1], base ? std::span<const uint8_t>(*base) : std::span<const uint8_t>(), back));
    EXPECT_EQ(back, recon[1]);
  }
}

TEST(DeviceParity, EmulatedGpuGivesTheCpuStreams) {
  EmulatedGpu dev;
  ExpectLosslessParity(&dev);
  ExpectDeltaParity(&dev);
  ExpectLossyParity(&dev);
  EXPECT_GT(dev.jobs.load(), 10);
}

TEST(DeviceParity, CpuDeviceGivesTheInlineStreams) {
  // Not accelerated: the encoders run inline, and the result is the same.
  ExpectLosslessParity(&CpuComputeDevice());
  ExpectDeltaParity(&CpuComputeDevice());
}

TEST(DeviceParity, CudaLossless) {
  DEVICE_OR_SKIP(dev);
  ExpectLosslessParity(dev);
}

TEST(DeviceParity, CudaDelta) {
  DEVICE_OR_SKIP(dev);
  ExpectDeltaParity(dev);
}

TEST(DeviceParity, CudaLossy) {
  DEVICE_OR_SKIP(dev);
  ExpectLossyParity(dev);
}

// Sealing through a store: SetComputeDevice routes the encoder's steps to
// the device, and two checkpoints of a lineage (the second a delta) read
// back exactly, with the same stored sizes as a store without the device.
std::vector<uint64_t> SealLineage(const std::shared_ptr<const ComputeDevice>& dev) {
  test::TempDir dir;
  auto store = Store::Open(Env::Default(), dir.path(), test::SmallChunks(1 << 20));
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_TRUE((*store)->Recover().ok());  // loads the pack index: the second file is a delta
  if (dev) (*store)->SetComputeDevice(dev);
  const Workload w = MakeWorkload(21);
  const Bytes weights(w.raw.begin() + 777, w.raw.begin() + 777 + w.ranges[0].length);
  const Bytes files[2] = {test::NpyF32(weights), test::NpyF32(NextStep(weights, 22))};
  std::vector<uint64_t> stored;
  for (int i = 0; i < 2; ++i) {
    const std::string name = "step" + std::to_string(i) + ".npy";
    auto rec = test::MakeSealedFile(store->get(), name, files[i]);
    EXPECT_TRUE(rec.ok()) << rec.status().ToString();
    auto back = test::ReadContentAt(store->get(), name);
    EXPECT_TRUE(back.ok() && *back == files[i]) << name;
    auto usage = (*store)->Usage(name);
    EXPECT_TRUE(usage.ok() && usage->size() == 1);
    stored.push_back(usage.ok() && !usage->empty() ? (*usage)[0].stored : 0);
  }
  return stored;
}

TEST(DeviceParity, SealingUsesTheStoresDevice) {
  auto dev = std::make_shared<EmulatedGpu>();
  const std::vector<uint64_t> on_dev = SealLineage(dev);
  EXPECT_GT(dev->jobs.load(), 0);
  EXPECT_EQ(on_dev, SealLineage(nullptr));
}

// ---- each step against the CPU reference -------------------------------------------

void ExpectSplitMatches(const ComputeDevice& dev, size_t lanes, unsigned w, bool rotate, size_t stride) {
  const Bytes src = test::RandomBytes(lanes * w, lanes + w);
  Bytes want(src.size()), got(src.size(), 0xEE);
  uint8_t *pw[8], *pg[8];
  for (unsigned k = 0; k < w; ++k) pw[k] = want.data() + k * lanes, pg[k] = got.data() + k * lanes;
  lossless::SplitLanes(w, rotate, src.data(), lanes, pw);
  std::vector<ByteCounts> hw(w), hg(w);
  for (unsigned k = 0; k < w; ++k) {
    hw[k].fill(0);
    for (size_t i = 0; i < lanes; i += stride) ++hw[k][pw[k][i]];
  }
  ASSERT_OK(dev.Split({w, rotate, src, {pg, w}, stride, hg}));
  const std::string what = dev.Name() + " lanes " + std::to_string(lanes) + " w " + std::to_string(w);
  EXPECT_EQ(got, want) << what;
  EXPECT_EQ(hg, hw) << what;
}

void ExpectStepsMatch(const ComputeDevice& dev, size_t big) {
  for (unsigned w : {2u, 4u, 8u}) {
    for (size_t lanes : {size_t{0}, size_t{1}, size_t{4095}, size_t{4097}, big / w + 3}) {
      ExpectSplitMatches(dev, lanes, w, w != 8, 1);
      ExpectSplitMatches(dev, lanes, w, true, 16);
    }
  }
  // Residual: runs of every width, one crossing where slices may cut.
  const Bytes raw = test::RandomBytes(big + 13, 1), base = test::RandomBytes(big + 13, 2);
  const std::vector<LaneRun> runs = {
      {1, 1 + 2 * 1000, 2}, {3001, 3001 + 4 * 777, 4}, {9000, 9000 + 8 * ((big - 9000) / 8), 8}};
  Bytes want(raw.size()), got(raw.size());
  ASSERT_OK(CpuComputeDevice().Residual({raw, base, runs, want}));
  ASSERT_OK(dev.Residual({raw, base, runs, got}));
  EXPECT_EQ(got, want) << dev.Name();
  // Lossy steps, with the values that compare oddly.
  std::vector<double> r(big / 8 + 5), wt(r.size());
  std::vector<uint8_t> forced(r.size());
  std::mt19937 rng(3);
  std::normal_distribution<double> normal(0, 1);
  for (size_t i = 0; i < r.size(); ++i) r[i] = normal(rng), wt[i] = std::abs(normal(rng)), forced[i] = i % 101 == 0;
  r[1] = std::nan(""), r[2] = INFINITY, r[3] = -0.0, r[4] = 1e-310;
  std::vector<uint32_t> qw(r.size()), qg(r.size());
  ASSERT_OK(CpuComputeDevice().QClasses({r, wt, forced, qw}));
  ASSERT_OK(dev.QClasses({r, wt, forced, qg}));
  EXPECT_EQ(qg, qw) << dev.Name();
  const std::vector<double> bounds = lossy::LevelBounds(std::vector<double>{-1.5, -0.25, 0, 0.25, 2});
  std::vector<uint16_t> nw(r.size()), ng(r.size());
  r[5] = bounds[1];  // a tie goes up, as with std::upper_bound
  ASSERT_OK(CpuComputeDevice().NearestLevels({r, bounds, nw}));
  ASSERT_OK(dev.NearestLevels({r, bounds, ng}));
  EXPECT_EQ(ng, nw) << dev.Name();
}

TEST(DeviceSteps, CpuMatchesTheDefinitions) {
  std::vector<double> r = {-3, -1, -0.5, 0, 0.5, 0.75, 1, 7, std::nan("")};
  const std::vector<double> bounds = {-1, 0.5, 0.75};
  std::vector<uint16_t> idx(r.size());
  ASSERT_OK(CpuComputeDevice().NearestLevels({r, bounds, idx}));
  for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ(idx[i], lossy::NearestLevel(bounds, r[i])) << r[i];
  std::vector<double> w(r.size(), 2.0);
  std::vector<uint8_t> forced(r.size(), 0);
  forced[0] = 1;
  std::vector<uint32_t> q(r.size());
  ASSERT_OK(CpuComputeDevice().QClasses({r, w, forced, q}));
  EXPECT_EQ(q[0], ops::kQClassForced);
  EXPECT_EQ(q[1], static_cast<uint32_t>(std::bit_cast<uint64_t>(2.0 * -1 * -1) >> 49));
  // Residual: zigzag of the lane difference, XOR outside the runs.
  const Bytes raw = {1, 0, 5, 0, 0, 0, 0xFF}, base = {2, 0, 4, 0, 0, 0, 0x0F};
  Bytes out(raw.size());
  const std::vector<LaneRun> runs = {{0, 2, 2}, {2, 6, 4}};
  ASSERT_OK(CpuComputeDevice().Residual({raw, base, runs, out}));
  EXPECT_EQ(out, (Bytes{1, 0, 2, 0, 0, 0, 0xF0}));  // -1 -> 1, +1 -> 2, 0xFF ^ 0x0F
  ExpectStepsMatch(CpuComputeDevice(), 100000);
}

TEST(DeviceSteps, EmulatedGpuSlicesMatchTheCpu) { ExpectStepsMatch(EmulatedGpu(16 << 10), 300000); }

TEST(DeviceSteps, CudaMatchesTheCpu) {
  DEVICE_OR_SKIP(dev);
  ExpectStepsMatch(*dev, 40u << 20);  // several 16 MiB slices
}

TEST(DeviceSteps, ResidualSlicesNeverCutALane) {
  const Bytes raw(1000), base(1000);
  Bytes out(1000);
  const std::vector<LaneRun> runs = {{3, 3 + 8 * 100, 8}};
  ResidualJob job{raw, base, runs, out};
  for (size_t slot : {10, 64, 333}) {
    for (size_t begin = 0; begin < raw.size();) {
      const size_t end = gpu::ResidualSliceEnd(job, begin, slot);
      ASSERT_GT(end, begin);
      if (end > 3 && end < 803) {
        EXPECT_EQ((end - 3) % 8, 0u) << slot;
      }
      begin = end;
    }
  }
}

// ---- bad jobs ---------------------------------------------------------------------

void ExpectRejectsBadJobs(const ComputeDevice& dev) {
  Bytes src(12), planes_mem(12);
  uint8_t* p[8] = {planes_mem.data(), planes_mem.data() + 4, planes_mem.data() + 8};
  EXPECT_EQ(dev.Split({3, false, src, {p, 3}, 1, {}}).code(), EINVAL);        // width 3
  EXPECT_EQ(dev.Split({4, false, src, {p, 3}, 1, {}}).code(), EINVAL);        // planes != width
  EXPECT_EQ(dev.Split({8, false, src, {p, 8}, 1, {}}).code(), EINVAL);        // not whole lanes
  EXPECT_EQ(dev.Split({2, false, Bytes(12), {p, 2}, 0, {}}).code(), EINVAL);  // stride 0
  Bytes raw(64), base(64), out(64), short_out(63);
  EXPECT_EQ(dev.Residual({raw, base, {}, short_out}).code(), EINVAL);
  const std::vector<LaneRun> unsorted = {{16, 32, 4}, {0, 8, 4}}, past_end = {{60, 68, 4}}, partial = {{0, 6, 4}},
                             width = {{0, 6, 3}};
  for (const auto* runs : {&unsorted, &past_end, &partial, &width}) {
    EXPECT_EQ(dev.Residual({raw, base, *runs, out}).code(), EINVAL);
  }
  std::vector<double> r(4), w(3);
  std::vector<uint8_t> f(4);
  std::vector<uint32_t> q(4);
  EXPECT_EQ(dev.QClasses({r, w, f, q}).code(), EINVAL);
  std::vector<uint16_t> idx(3);
  EXPECT_EQ(dev.NearestLevels({r, {}, idx}).code(), EINVAL);
}

TEST(DeviceSteps, BadJobsAreInvalidArgument) {
  ExpectRejectsBadJobs(CpuComputeDevice());
  ExpectRejectsBadJobs(EmulatedGpu());
}

TEST(DeviceSteps, CudaRejectsBadJobs) {
  DEVICE_OR_SKIP(dev);
  ExpectRejectsBadJobs(*dev);
}

// ---- choosing a device ------------------------------------------------------------

TEST(DeviceChoice, ParsesRequests) {
  EXPECT_EQ(*ParseDeviceRequest("auto"), DeviceRequest::kAuto);
  EXPECT_EQ(*ParseDeviceRequest("cpu"), DeviceRequest::kCpu);
  EXPECT_EQ(*ParseDeviceRequest("gpu"), DeviceRequest::kGpu);
  Result<DeviceRequest> bad = ParseDeviceRequest("tpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("use auto"), std::string::npos);
}

TEST(DeviceChoice, CpuAlwaysAndAutoFallsBackSayingWhy) {
  Result<gpu::DeviceChoice> cpu = gpu::ChooseDevice(DeviceRequest::kCpu, {});
  ASSERT_TRUE(cpu.ok());
  EXPECT_FALSE(cpu->device->accelerated());
  EXPECT_EQ(cpu->why, "compute device: cpu (device=cpu)");
  std::string why;
  const bool has_gpu = CudaOrNull(&why) != nullptr;
  Result<gpu::DeviceChoice> autod = gpu::ChooseDevice(DeviceRequest::kAuto, {64 << 20, 0});
  ASSERT_TRUE(autod.ok());
  EXPECT_EQ(autod->device->accelerated(), has_gpu) << autod->why;
  Result<gpu::DeviceChoice> gpu = gpu::ChooseDevice(DeviceRequest::kGpu, {64 << 20, 0});
  EXPECT_EQ(gpu.ok(), has_gpu);
  if (!has_gpu) {
    EXPECT_NE(autod->why.find("compute device: cpu (device=auto, no usable GPU: "), std::string::npos) << autod->why;
    EXPECT_EQ(gpu.status().code(), ENODEV);
    EXPECT_NE(gpu.status().message().find("device=gpu: no usable GPU"), std::string::npos) << gpu.status().message();
  }
}

TEST(DeviceChoice, TooLittleGpuMemoryIsRefused) {
  DEVICE_OR_SKIP(dev);
  Result<std::unique_ptr<ComputeDevice>> small = gpu::OpenCudaDevice({1 << 20, 0});
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), ENOMEM);
}

TEST(PinnedBufferTest, UsableWithOrWithoutCuda) {
  gpu::PinnedBuffer b(1 << 20);
  ASSERT_NE(b.data(), nullptr);
  std::memset(b.data(), 7, b.size());
  EXPECT_EQ(b.data()[b.size() - 1], 7);
  std::string why;
  if (CudaOrNull(&why) != nullptr) {
    EXPECT_TRUE(b.pinned());
  }
}

}  // namespace
}  // namespace ckptfs
