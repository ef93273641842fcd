// GPU against all CPU cores, end to end: a synthetic fp32 checkpoint (weights,
// Adam m and v as row/column-scaled matrices) in pinned host memory, cut in
// 4 MiB chunks, encoded by the chunk encoders exactly as sealing runs them,
// by T threads, once with the CPU inline and once with the GPU device (its
// data-parallel steps on the GPU, entropy coding on the same T threads).
// Lossless and lossy. Checks that both devices give identical streams, and
// times the GPU's own steps (split + histograms) alone.
//
//   gpu_bench [--mib N] [--threads T] [--rounds R]
// Prints a Markdown table and the acceptance lines; exit 1 on a parity
// failure. Without a usable GPU it prints the CPU rows and says why.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/hash.h"
#include "codec/compute_device.h"
#include "codec/lossless/lanes.h"
#include "codec/lossy/lossy_chunk.h"
#include "codec/tensor_chunk.h"
#include "gpu/cuda_device.h"

namespace ckptfs {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kChunk = 4u << 20;
constexpr size_t kHeader = 4096;

struct Args {
  size_t mib = 1024;
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  int rounds = 2;
};

// A fast deterministic generator: per-thread xorshift, sums of uniforms
// for roughly normal values (the codec cares about the exponent spread).
struct Rng {
  uint64_t s;
  uint32_t Next() {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return static_cast<uint32_t>(s >> 32);
  }
  float Normal() {
    float u = 0;
    for (int i = 0; i < 4; ++i) u += static_cast<float>(Next()) * 2.3283064e-10f;
    return (u - 2.0f) * 1.7320508f;
  }
};

void ParallelFor(size_t n, unsigned threads, const std::function<void(size_t)>& f) {
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < n;) f(i);
    });
  }
  for (auto& th : pool) th.join();
}

// [header][W][m][v], each a rows x cols fp32 matrix; v = row scale * column
// scale * noise, m = signed and smaller, W = N(0, 0.02).
struct Checkpoint {
  std::unique_ptr<gpu::PinnedBuffer> bytes;
  std::vector<TensorRange> ranges;
};

Checkpoint MakeCheckpoint(size_t mib, unsigned threads) {
  const size_t cols = 1024;
  const size_t per_tensor = (mib << 20) / 3 / (cols * 4) * (cols * 4);
  const size_t rows = per_tensor / (cols * 4);
  Checkpoint c;
  c.bytes = std::make_unique<gpu::PinnedBuffer>(kHeader + 3 * per_tensor);
  uint8_t* p = c.bytes->data();
  std::memset(p, 0x5A, kHeader);
  std::vector<float> rs(rows), cs(cols);
  Rng g{42};
  for (float& s : rs) s = std::exp(2.0f * g.Normal());
  for (float& s : cs) s = std::exp(2.0f * g.Normal());
  for (int t = 0; t < 3; ++t) {
    c.ranges.push_back({kHeader + t * per_tensor, per_tensor, DType::kF32, cols});
    auto* f = reinterpret_cast<float*>(p + kHeader + t * per_tensor);
    ParallelFor(rows, threads, [&](size_t r) {
      Rng rng{0x9E3779B97F4A7C15ull * (r + 1) + t};
      for (size_t j = 0; j < cols; ++j) {
        const float n = rng.Normal();
        f[r * cols + j] = t == 0   ? 0.02f * n
                          : t == 1 ? 1e-4f * n * std::sqrt(rs[r] * cs[j])
                                   : 1e-8f * rs[r] * cs[j] * (1.0f + 0.3f * std::abs(n));
      }
    });
  }
  return c;
}

struct Outcome {
  double seconds = 1e30;
  uint64_t stored = 0;
  std::vector<uint64_t> hashes;  // per chunk, of the stored stream
  bool ok = true;
};

lossy::ChunkSegment Exact(uint64_t begin, uint64_t end) {
  lossy::ChunkSegment s;
  s.begin = begin, s.end = end;
  return s;
}

std::vector<lossy::ChunkSegment> LossySegments(uint64_t off, size_t len, std::span<const TensorRange> ranges) {
  std::vector<lossy::ChunkSegment> segs;
  uint64_t pos = 0;
  for (const TensorRange& r : ranges) {
    const uint64_t b = std::max<uint64_t>(r.offset, off), e = std::min<uint64_t>(r.offset + r.length, off + len);
    if (b >= e) continue;
    if (b - off > pos) segs.push_back(Exact(pos, b - off));
    lossy::ChunkSegment s;
    s.begin = b - off, s.end = e - off, s.lossy = true;
    const size_t t = (r.offset - kHeader) / r.length;
    s.spec = {DType::kF32, t == 2 ? lossy::Domain::kLogBits : lossy::Domain::kValue,
              t == 0   ? 0.01
              : t == 1 ? 0.2
                       : 0.1};
    segs.push_back(std::move(s));
    pos = e - off;
  }
  if (pos < len) segs.push_back(Exact(pos, len));
  return segs;
}

Outcome Encode(const Checkpoint& c, bool lossy_mode, const ComputeDevice* device, const Args& a) {
  const size_t size = c.bytes->size();
  const size_t chunks = (size + kChunk - 1) / kChunk;
  Outcome best;
  best.hashes.assign(chunks, 0);
  for (int round = 0; round < a.rounds; ++round) {
    std::atomic<uint64_t> stored{0};
    std::atomic<bool> ok{true};
    TensorChunkOptions opts;
    opts.planes.device = device;
    const auto t0 = Clock::now();
    ParallelFor(chunks, a.threads, [&](size_t i) {
      thread_local std::vector<uint8_t> out, work;
      const uint64_t off = i * kChunk;
      const size_t len = std::min(kChunk, size - off);
      std::span<const uint8_t> raw(c.bytes->data() + off, len);
      const auto ranges = RangesOverlapping(c.ranges, off, off + len);
      out.clear();
      Status s;
      if (lossy_mode) {
        work.assign(raw.begin(), raw.end());  // the encoder rewrites it with the reconstruction
        std::vector<lossy::ChunkSegment> segs = LossySegments(off, len, ranges);
        s = lossy::EncodeLossyChunk(work, {}, off, ranges, segs, opts, &out);
      } else {
        s = EncodeTensorChunk(raw, off, ranges, opts, &out);
      }
      if (!s.ok()) {
        std::fprintf(stderr, "gpu_bench: chunk %zu: %s\n", i, s.ToString().c_str());
        ok = false;
      }
      stored += out.size();
      best.hashes[i] = Checksum64(out);
    });
    best.seconds = std::min(best.seconds, std::chrono::duration<double>(Clock::now() - t0).count());
    best.stored = stored;
    best.ok = best.ok && ok;
  }
  return best;
}

// The device's split + histogram step alone over the whole checkpoint.
double SplitSeconds(const Checkpoint& c, const ComputeDevice& dev, const Args& a) {
  const size_t size = c.bytes->size() / kChunk * kChunk;
  double best = 1e30;
  for (int round = 0; round < a.rounds; ++round) {
    const auto t0 = Clock::now();
    ParallelFor(size / kChunk, a.threads, [&](size_t i) {
      thread_local std::vector<uint8_t> planes(kChunk);
      uint8_t* p[4];
      for (int k = 0; k < 4; ++k) p[k] = planes.data() + k * (kChunk / 4);
      ByteCounts h[4];
      const Status s = dev.Split({4, true, {c.bytes->data() + i * kChunk, kChunk}, {p, 4}, 16, {h, 4}});
      if (!s.ok()) std::fprintf(stderr, "gpu_bench: split: %s\n", s.ToString().c_str());
    });
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--mib") a.mib = std::strtoull(argv[i + 1], nullptr, 10);
    if (k == "--threads") a.threads = static_cast<unsigned>(std::strtoul(argv[i + 1], nullptr, 10));
    if (k == "--rounds") a.rounds = std::atoi(argv[i + 1]);
  }
  a.mib = std::max<size_t>(a.mib, 16);
  a.threads = std::max(1u, a.threads);
  a.rounds = std::max(1, a.rounds);
  return a;
}

int Main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  Result<std::unique_ptr<ComputeDevice>> gpu = gpu::OpenCudaDevice({size_t{4} << 30, 0});
  std::printf(
      "gpu_bench: %zu MiB synthetic fp32 checkpoint (weights, Adam m, v), 4 MiB chunks, %u threads, best of %d\n",
      a.mib, a.threads, a.rounds);
  std::printf("GPU: %s\n\n", gpu.ok() ? (*gpu)->Name().c_str() : gpu.status().message().c_str());
  const Checkpoint c = MakeCheckpoint(a.mib, a.threads);
  const double gb = static_cast<double>(c.bytes->size()) / 1e9;
  std::printf(
      "| mode | CPU, %u threads: GB/s | ratio | GPU + %u threads: GB/s | ratio | GPU / CPU speed | identical chunks "
      "|\n",
      a.threads, a.threads);
  std::printf("|---|---|---|---|---|---|---|\n");
  bool parity = true;
  double worst_gpu = 1e30, worst_speedup = 1e30;
  for (bool lossy_mode : {false, true}) {
    const Outcome cpu = Encode(c, lossy_mode, nullptr, a);
    const double ratio = static_cast<double>(c.bytes->size()) / static_cast<double>(cpu.stored);
    std::string gpu_cols = "n/a | n/a | n/a | n/a";
    if (gpu.ok()) {
      const Outcome g = Encode(c, lossy_mode, gpu->get(), a);
      size_t same = 0;
      for (size_t i = 0; i < g.hashes.size(); ++i) same += g.hashes[i] == cpu.hashes[i];
      parity = parity && same == g.hashes.size() && g.ok;
      char buf[256];
      std::snprintf(buf, sizeof buf, "%.2f | %.4f | %.2fx | %zu/%zu", gb / g.seconds,
                    static_cast<double>(c.bytes->size()) / static_cast<double>(g.stored), cpu.seconds / g.seconds, same,
                    g.hashes.size());
      gpu_cols = buf;
      worst_gpu = std::min(worst_gpu, gb / g.seconds);
      worst_speedup = std::min(worst_speedup, cpu.seconds / g.seconds);
    }
    std::printf("| %s | %.2f | %.4f | %s |\n", lossy_mode ? "lossy" : "lossless", gb / cpu.seconds, ratio,
                gpu_cols.c_str());
    parity = parity && cpu.ok;
  }
  const double split_cpu = SplitSeconds(c, CpuComputeDevice(), a);
  std::string split_gpu = "n/a | | n/a | ";
  if (gpu.ok()) {
    const double s = SplitSeconds(c, **gpu, a);
    char buf[128];
    std::snprintf(buf, sizeof buf, "%.2f | | %.2fx | ", gb / s, split_cpu / s);
    split_gpu = buf;
  }
  std::printf("| split + histograms only | %.2f | | %s |\n\n", gb / split_cpu, split_gpu.c_str());
  if (!gpu.ok()) {
    std::printf("acceptance: not measured: %s\n", gpu.status().message().c_str());
  } else {
    std::printf("acceptance: GPU end to end >= 20 GB/s: %s (%.2f); GPU >= 5x all CPU threads: %s (%.2fx); parity: %s\n",
                worst_gpu >= 20 ? "PASS" : "FAIL", worst_gpu, worst_speedup >= 5 ? "PASS" : "FAIL", worst_speedup,
                parity ? "PASS" : "FAIL");
  }
  return parity ? 0 : 1;
}

}  // namespace
}  // namespace ckptfs

int main(int argc, char** argv) { return ckptfs::Main(argc, argv); }
