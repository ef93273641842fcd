// Host side of the CUDA device: contexts, slicing, copies and fallbacks.
// Plain C++ against the CUDA runtime API; the kernels are gpu/kernels.cu.
#include "gpu/cuda_device.h"

#include <cuda_runtime_api.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "codec/compute_jobs.h"
#include "gpu/kernels.h"
#include "gpu/slices.h"

namespace ckptfs::gpu {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
// Per context: three data slots and a table area (histogram counts, lane
// runs, level bounds).
constexpr size_t kTableBytes = kMiB;
constexpr size_t kMaxSlot = 16 * kMiB;
constexpr size_t kMinSlot = kMiB;
constexpr size_t kMaxContexts = 8;

Status CudaStatus(const std::string& what, cudaError_t e) {
  return Status::Error(EIO, "CUDA " + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

#define CUDA_RETURN_IF_ERROR(what, expr)              \
  do {                                                \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) { \
      return CudaStatus(what, e_);                    \
    }                                                 \
  } while (0)

struct DeviceMemory {
  void* p = nullptr;
  ~DeviceMemory() {
    if (p != nullptr) cudaFree(p);
  }
};
struct HostMemory {
  void* p = nullptr;
  ~HostMemory() {
    if (p != nullptr) cudaFreeHost(p);
  }
};
struct Stream {
  cudaStream_t s = nullptr;
  ~Stream() {
    if (s != nullptr) cudaStreamDestroy(s);
  }
};

// A stream with its device and pinned buffers: slots A, B, C and a table.
struct Context {
  Stream stream;
  DeviceMemory dev;
  HostMemory host;
  size_t slot = 0;
  uint8_t* d(int k) const { return static_cast<uint8_t*>(dev.p) + k * slot; }
  uint8_t* h(int k) const { return static_cast<uint8_t*>(host.p) + k * slot; }
  uint8_t* dtable() const { return d(3); }
  uint8_t* htable() const { return h(3); }
};

bool IsPinned(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // pageable memory can report an error on old drivers: clear it
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

// Host -> device: straight from pinned memory, else through the staging slot.
Status CopyIn(const Context& c, int slot, const void* src, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  const void* from = src;
  if (!IsPinned(src)) {
    std::memcpy(c.h(slot), src, bytes);
    from = c.h(slot);
  }
  CUDA_RETURN_IF_ERROR("copy to device", cudaMemcpyAsync(c.d(slot), from, bytes, cudaMemcpyHostToDevice, c.stream.s));
  return Status::Ok();
}

class CudaDevice final : public ComputeDevice {
 public:
  CudaDevice(int ordinal, std::string name) : ordinal_(ordinal), name_(std::move(name)) {}

  Status Reserve(size_t memory_bytes) {
    size_t slot = kMaxSlot;
    while (slot > kMinSlot && 3 * slot + kTableBytes > memory_bytes) slot /= 2;
    if (3 * slot + kTableBytes > memory_bytes) {
      return Status::Error(ENOMEM, "gpu_mem=" + std::to_string(memory_bytes / kMiB) + "M is below the " +
                                       std::to_string((3 * kMinSlot + kTableBytes) / kMiB) + "M one stream needs");
    }
    const size_t per = 3 * slot + kTableBytes;
    const size_t n = std::clamp<size_t>(memory_bytes / per, 1, kMaxContexts);
    for (size_t i = 0; i < n; ++i) {
      auto c = std::make_unique<Context>();
      c->slot = slot;
      CUDA_RETURN_IF_ERROR("stream", cudaStreamCreateWithFlags(&c->stream.s, cudaStreamNonBlocking));
      CUDA_RETURN_IF_ERROR("device buffers", cudaMalloc(&c->dev.p, per));
      CUDA_RETURN_IF_ERROR("pinned host buffers", cudaHostAlloc(&c->host.p, per, cudaHostAllocDefault));
      free_.push_back(c.get());
      contexts_.push_back(std::move(c));
    }
    name_ += " (" + std::to_string(n) + " streams, " + std::to_string(slot / kMiB) + " MiB slices, " +
             std::to_string(n * per / kMiB) + " MiB of device memory)";
    return Status::Ok();
  }

  std::string Name() const override { return name_; }
  void AddToName(const std::string& note) { name_ += "; " + note; }
  bool accelerated() const override { return !broken_.load(std::memory_order_relaxed); }
  // Below a few hundred KiB, the launches and copies cost more than the CPU.
  size_t min_job_bytes() const override { return min_job_; }

  // Times a chunk-sized split, staged as the encoder's jobs are, on the GPU
  // and on this CPU. Where the CPU is faster (copies through host memory can
  // cost more than the work), jobs stay on the CPU: the bytes are the same
  // either way, so this decides speed only. Returns what was measured.
  std::string Calibrate() {
    constexpr size_t kBytes = 4 << 20;
    std::vector<uint8_t> src(kBytes), planes(kBytes);
    for (size_t i = 0; i < kBytes; ++i) src[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
    uint8_t* p[4];
    for (int k = 0; k < 4; ++k) p[k] = planes.data() + k * (kBytes / 4);
    ByteCounts h[4];
    const SplitJob job{4, true, src, {p, 4}, 16, {h, 4}};
    auto best_ms = [&](const ComputeDevice& d) {
      double best = 1e30;
      for (int i = 0; i < 5; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        if (!d.Split(job).ok()) return 1e30;
        best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      return best;
    };
    const double gpu = best_ms(*this), cpu = best_ms(CpuComputeDevice());
    char buf[160];
    std::snprintf(buf, sizeof buf, "a 4 MiB split takes %.2f ms here, %.2f ms on the CPU: %s", gpu, cpu,
                  gpu < cpu ? "jobs go to the GPU" : "jobs stay on the CPU");
    if (!(gpu < cpu)) min_job_ = SIZE_MAX;
    return buf;
  }

  Status Split(const SplitJob& job) const override {
    RETURN_IF_ERROR(CheckJob(job));
    return Run([&](const Context& c) { return SplitOn(c, job); });
  }
  Status Residual(const ResidualJob& job) const override {
    RETURN_IF_ERROR(CheckJob(job));
    return Run([&](const Context& c) { return ResidualOn(c, job); });
  }
  Status QClasses(const QClassJob& job) const override {
    RETURN_IF_ERROR(CheckJob(job));
    return Run([&](const Context& c) { return QClassesOn(c, job); });
  }
  Status NearestLevels(const NearestLevelJob& job) const override {
    RETURN_IF_ERROR(CheckJob(job));
    if (job.bounds.size() * sizeof(double) > kTableBytes)
      return Status::InvalidArgument("nearest level: too many levels");
    return Run([&](const Context& c) { return NearestOn(c, job); });
  }

 private:
  // Takes a free context for the job. A CUDA error leaves the device
  // unused from then on (the context may be lost); callers fall back to
  // the CPU, which gives the same bytes.
  template <typename F>
  Status Run(F&& f) const {
    if (broken_.load(std::memory_order_relaxed)) return Status::Error(ENODEV, "GPU disabled after an earlier error");
    Context* c = Acquire();
    Status s = Status::Ok();
    if (cudaError_t e = cudaSetDevice(ordinal_); e != cudaSuccess) {
      s = CudaStatus("select device", e);
    } else {
      s = f(*c);
    }
    if (!s.ok()) {
      cudaStreamSynchronize(c->stream.s);  // nothing may still write the buffers
      // A job the device cannot take (EINVAL) says nothing about the GPU.
      if (s.code() != EINVAL && !broken_.exchange(true)) {
        spdlog::error("GPU {}: {}; encoding continues on the CPU", name_, s.message());
      }
    }
    Release(c);
    return s;
  }

  Context* Acquire() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !free_.empty(); });
    Context* c = free_.back();
    free_.pop_back();
    return c;
  }
  void Release(Context* c) const {
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(c);
    }
    cv_.notify_one();
  }

  static Status Sync(const Context& c) {
    CUDA_RETURN_IF_ERROR("kernel or copy", cudaStreamSynchronize(c.stream.s));
    return Status::Ok();
  }

  static Status SplitOn(const Context& c, const SplitJob& job) {
    const unsigned w = job.w;
    const size_t lanes = job.src.size() / w;
    const size_t per_slice = SplitSliceLanes(w, c.slot);
    if (!job.hists.empty()) {
      for (ByteCounts& h : job.hists) h.fill(0);
      if (job.hist_stride > kSliceLaneAlign || kSliceLaneAlign % job.hist_stride != 0) {
        return Status::InvalidArgument("split: histogram stride must divide " + std::to_string(kSliceLaneAlign));
      }
    }
    auto* counts = reinterpret_cast<uint32_t*>(c.dtable());
    for (size_t first = 0; first < lanes; first += per_slice) {
      const size_t n = std::min(per_slice, lanes - first);
      RETURN_IF_ERROR(CopyIn(c, 0, job.src.data() + first * w, n * w));
      DevicePlanes planes{};
      for (unsigned k = 0; k < w; ++k) planes.p[k] = c.d(1) + k * n;
      CUDA_RETURN_IF_ERROR("split", LaunchSplit(w, job.rotate, c.d(0), n, planes, c.stream.s));
      CUDA_RETURN_IF_ERROR("copy planes", cudaMemcpyAsync(c.h(1), c.d(1), n * w, cudaMemcpyDeviceToHost, c.stream.s));
      if (!job.hists.empty()) {
        CUDA_RETURN_IF_ERROR("clear counts", cudaMemsetAsync(counts, 0, w * 256 * sizeof(uint32_t), c.stream.s));
        CUDA_RETURN_IF_ERROR("histograms", LaunchSampledHistograms(w, planes, n, job.hist_stride, counts, c.stream.s));
        CUDA_RETURN_IF_ERROR("copy counts", cudaMemcpyAsync(c.htable(), counts, w * 256 * sizeof(uint32_t),
                                                            cudaMemcpyDeviceToHost, c.stream.s));
      }
      RETURN_IF_ERROR(Sync(c));
      for (unsigned k = 0; k < w; ++k) std::memcpy(job.planes[k] + first, c.h(1) + k * n, n);
      const auto* hc = reinterpret_cast<const uint32_t*>(c.htable());
      for (size_t k = 0; k < job.hists.size(); ++k) {
        for (unsigned b = 0; b < 256; ++b) job.hists[k][b] += hc[k * 256 + b];
      }
    }
    return Status::Ok();
  }

  static Status ResidualOn(const Context& c, const ResidualJob& job) {
    for (size_t begin = 0; begin < job.raw.size();) {
      const size_t end = ResidualSliceEnd(job, begin, c.slot);
      if (end <= begin) return Status::InvalidArgument("residual: slice would be empty");
      const size_t n = end - begin;
      size_t max_lanes = 0;
      const std::vector<LaneRun> local = RunsInSlice(job, begin, end, &max_lanes);
      if (local.size() * sizeof(LaneRun) > kTableBytes) {
        return Status::InvalidArgument("residual: more lane runs in a slice than the GPU table holds");
      }
      RETURN_IF_ERROR(CopyIn(c, 0, job.raw.data() + begin, n));
      RETURN_IF_ERROR(CopyIn(c, 1, job.base.data() + begin, n));
      if (!local.empty()) {
        std::memcpy(c.htable(), local.data(), local.size() * sizeof(LaneRun));
        CUDA_RETURN_IF_ERROR("copy runs", cudaMemcpyAsync(c.dtable(), c.htable(), local.size() * sizeof(LaneRun),
                                                          cudaMemcpyHostToDevice, c.stream.s));
      }
      CUDA_RETURN_IF_ERROR("residual",
                           LaunchResidual(c.d(0), c.d(1), c.d(2), n, reinterpret_cast<const LaneRun*>(c.dtable()),
                                          local.size(), max_lanes, c.stream.s));
      CUDA_RETURN_IF_ERROR("copy residual", cudaMemcpyAsync(c.h(2), c.d(2), n, cudaMemcpyDeviceToHost, c.stream.s));
      RETURN_IF_ERROR(Sync(c));
      std::memcpy(job.out.data() + begin, c.h(2), n);
      begin = end;
    }
    return Status::Ok();
  }

  static Status QClassesOn(const Context& c, const QClassJob& job) {
    const size_t per_slice = c.slot / sizeof(double);
    for (size_t first = 0; first < job.r.size(); first += per_slice) {
      const size_t n = std::min(per_slice, job.r.size() - first);
      RETURN_IF_ERROR(CopyIn(c, 0, job.r.data() + first, n * sizeof(double)));
      RETURN_IF_ERROR(CopyIn(c, 1, job.w.data() + first, n * sizeof(double)));
      RETURN_IF_ERROR(CopyIn(c, 2, job.forced.data() + first, n));
      auto* out = reinterpret_cast<uint32_t*>(c.d(2) + (n + 7) / 8 * 8);  // after the forced flags
      CUDA_RETURN_IF_ERROR(
          "qclasses", LaunchQClasses(reinterpret_cast<const double*>(c.d(0)), reinterpret_cast<const double*>(c.d(1)),
                                     c.d(2), out, n, c.stream.s));
      CUDA_RETURN_IF_ERROR("copy classes",
                           cudaMemcpyAsync(c.h(1), out, n * sizeof(uint32_t), cudaMemcpyDeviceToHost, c.stream.s));
      RETURN_IF_ERROR(Sync(c));
      std::memcpy(job.out.data() + first, c.h(1), n * sizeof(uint32_t));
    }
    return Status::Ok();
  }

  static Status NearestOn(const Context& c, const NearestLevelJob& job) {
    const size_t nb = job.bounds.size();
    if (nb > 0) {
      std::memcpy(c.htable(), job.bounds.data(), nb * sizeof(double));
      CUDA_RETURN_IF_ERROR("copy bounds", cudaMemcpyAsync(c.dtable(), c.htable(), nb * sizeof(double),
                                                          cudaMemcpyHostToDevice, c.stream.s));
    }
    const size_t per_slice = c.slot / sizeof(double);
    for (size_t first = 0; first < job.r.size(); first += per_slice) {
      const size_t n = std::min(per_slice, job.r.size() - first);
      RETURN_IF_ERROR(CopyIn(c, 0, job.r.data() + first, n * sizeof(double)));
      auto* out = reinterpret_cast<uint16_t*>(c.d(1));
      CUDA_RETURN_IF_ERROR("nearest levels", LaunchNearestLevels(reinterpret_cast<const double*>(c.d(0)),
                                                                 reinterpret_cast<const double*>(c.dtable()),
                                                                 static_cast<uint32_t>(nb), out, n, c.stream.s));
      CUDA_RETURN_IF_ERROR("copy levels",
                           cudaMemcpyAsync(c.h(1), out, n * sizeof(uint16_t), cudaMemcpyDeviceToHost, c.stream.s));
      RETURN_IF_ERROR(Sync(c));
      std::memcpy(job.out.data() + first, c.h(1), n * sizeof(uint16_t));
    }
    return Status::Ok();
  }

  const int ordinal_;
  std::string name_;
  size_t min_job_ = 256 << 10;  // below this, launches and copies cost more than the work
  std::vector<std::unique_ptr<Context>> contexts_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable std::vector<Context*> free_;
  mutable std::atomic<bool> broken_{false};
};

Status NoDevice(const std::string& why) { return Status::Error(ENODEV, "no usable GPU: " + why); }

}  // namespace

bool BuiltWithCuda() { return true; }

Result<std::unique_ptr<ComputeDevice>> OpenCudaDevice(const CudaOptions& opts) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    std::string why = std::string("the CUDA runtime says: ") + cudaGetErrorString(e);
    if (e == cudaErrorInsufficientDriver) {
      why +=
          " (no NVIDIA driver is loaded, or it is older than CUDA " + std::to_string(CUDART_VERSION / 1000) + " needs)";
    }
    return NoDevice(why);
  }
  if (count == 0) return NoDevice("the CUDA runtime sees no device");
  if (opts.ordinal < 0 || opts.ordinal >= count) {
    return NoDevice("GPU " + std::to_string(opts.ordinal) + " asked for, " + std::to_string(count) + " visible");
  }
  cudaDeviceProp prop{};
  if (cudaError_t e = cudaSetDevice(opts.ordinal); e != cudaSuccess) return NoDevice(cudaGetErrorString(e));
  if (cudaError_t e = cudaGetDeviceProperties(&prop, opts.ordinal); e != cudaSuccess) {
    return NoDevice(cudaGetErrorString(e));
  }
  const std::string arch = "sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
  {
    Stream probe;
    cudaError_t e = cudaStreamCreate(&probe.s);
    if (e == cudaSuccess) e = ProbeKernel(probe.s);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return NoDevice(std::string(prop.name) + " (" + arch + ") cannot run this build's kernels (built for sm_90 and " +
                      "its PTX): " + cudaGetErrorString(e));
    }
  }
  std::string name = "cuda:" + std::to_string(opts.ordinal) + " " + prop.name + " (" + arch + ", " +
                     std::to_string(prop.totalGlobalMem >> 30) + " GiB)";
  auto dev = std::make_unique<CudaDevice>(opts.ordinal, std::move(name));
  RETURN_IF_ERROR(dev->Reserve(opts.memory_bytes));
  if (opts.calibrate) dev->AddToName(dev->Calibrate());
  return std::unique_ptr<ComputeDevice>(std::move(dev));
}

PinnedBuffer::PinnedBuffer(size_t bytes) : size_(bytes) {
  void* p = nullptr;
  if (bytes > 0 && cudaHostAlloc(&p, bytes, cudaHostAllocDefault) == cudaSuccess) {
    data_ = static_cast<uint8_t*>(p);
    pinned_ = true;
    return;
  }
  cudaGetLastError();
  data_ = static_cast<uint8_t*>(::operator new(bytes == 0 ? 1 : bytes));
}

PinnedBuffer::~PinnedBuffer() {
  if (pinned_) {
    cudaFreeHost(data_);
  } else {
    ::operator delete(data_);
  }
}

}  // namespace ckptfs::gpu
