// CUDA kernels of the ComputeDevice steps. Every per-element result comes
// from codec/element_ops.h, the CPU's own definition; histograms are
// integer atomics, whose sums do not depend on thread order. So each kernel
// gives exactly the CPU reference's bytes.
#include <cuda_runtime.h>

#include "codec/element_ops.h"
#include "gpu/kernels.h"

namespace ckptfs::gpu {
namespace {

constexpr unsigned kThreads = 256;
// Enough blocks to fill an H200 (132 SMs) several times over; grid-stride
// loops cover the rest.
constexpr size_t kMaxBlocks = 132 * 16;

unsigned BlocksFor(size_t items) {
  const size_t b = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b == 0 ? 1 : (b < kMaxBlocks ? b : kMaxBlocks));
}

__device__ size_t ThreadIndex() { return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ size_t GridStride() { return static_cast<size_t>(gridDim.x) * blockDim.x; }

__global__ void SplitKernel(unsigned w, bool rotate, const uint8_t* src, size_t lanes, DevicePlanes planes) {
  for (size_t i = ThreadIndex(); i < lanes; i += GridStride()) ops::SplitLaneW(w, rotate, src, i, planes.p);
}

// blockIdx.y is the plane.
__global__ void HistogramKernel(DevicePlanes planes, size_t samples, size_t stride, uint32_t* counts) {
  __shared__ uint32_t local[256];
  for (unsigned b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const uint8_t* plane = planes.p[blockIdx.y];
  for (size_t j = ThreadIndex(); j < samples; j += GridStride()) atomicAdd(&local[plane[j * stride]], 1u);
  __syncthreads();
  for (unsigned b = threadIdx.x; b < 256; b += blockDim.x) {
    if (local[b] != 0) atomicAdd(&counts[blockIdx.y * 256 + b], local[b]);
  }
}

__global__ void XorKernel(const uint8_t* raw, const uint8_t* base, uint8_t* out, size_t n) {
  for (size_t i = ThreadIndex(); i < n; i += GridStride()) out[i] = raw[i] ^ base[i];
}

// Block (x, y) takes lanes [y * per_block, (y + 1) * per_block) of run x.
constexpr size_t kLanesPerRunBlock = kThreads * 16;
__global__ void DiffRunsKernel(const uint8_t* raw, const uint8_t* base, uint8_t* out, const LaneRun* runs) {
  const LaneRun run = runs[blockIdx.x];
  const size_t lanes = (run.end - run.begin) / run.width;
  const size_t first = static_cast<size_t>(blockIdx.y) * kLanesPerRunBlock;
  const size_t last = first + kLanesPerRunBlock < lanes ? first + kLanesPerRunBlock : lanes;
  for (size_t j = first + threadIdx.x; j < last; j += blockDim.x) {
    ops::DiffLaneW(run.width, raw, base, out, run.begin + j * run.width);
  }
}

__global__ void QClassKernel(const double* r, const double* w, const uint8_t* forced, uint32_t* out, size_t n) {
  for (size_t i = ThreadIndex(); i < n; i += GridStride()) {
    out[i] = forced[i] ? ops::kQClassForced : ops::QClassOf(w[i], r[i]);
  }
}

__global__ void NearestKernel(const double* r, const double* bounds, uint32_t nb, uint16_t* out, size_t n) {
  for (size_t i = ThreadIndex(); i < n; i += GridStride()) out[i] = ops::NearestLevelIndex(bounds, nb, r[i]);
}

__global__ void Probe(int* sink) {
  if (sink != nullptr) *sink = 1;
}

}  // namespace

cudaError_t LaunchSplit(unsigned w, bool rotate, const uint8_t* src, size_t lanes, DevicePlanes planes,
                        cudaStream_t stream) {
  if (lanes == 0) return cudaSuccess;
  SplitKernel<<<BlocksFor(lanes), kThreads, 0, stream>>>(w, rotate, src, lanes, planes);
  return cudaGetLastError();
}

cudaError_t LaunchSampledHistograms(unsigned w, DevicePlanes planes, size_t lanes, size_t stride, uint32_t* counts,
                                    cudaStream_t stream) {
  const size_t samples = (lanes + stride - 1) / stride;
  if (samples == 0) return cudaSuccess;
  const dim3 grid(BlocksFor(samples) < 64 ? BlocksFor(samples) : 64, w);
  HistogramKernel<<<grid, kThreads, 0, stream>>>(planes, samples, stride, counts);
  return cudaGetLastError();
}

cudaError_t LaunchResidual(const uint8_t* raw, const uint8_t* base, uint8_t* out, size_t n, const LaneRun* runs,
                           size_t run_count, size_t max_run_lanes, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  XorKernel<<<BlocksFor(n), kThreads, 0, stream>>>(raw, base, out, n);
  if (run_count == 0 || max_run_lanes == 0) return cudaGetLastError();
  const size_t y = (max_run_lanes + kLanesPerRunBlock - 1) / kLanesPerRunBlock;
  const dim3 grid(static_cast<unsigned>(run_count), static_cast<unsigned>(y == 0 ? 1 : y));
  DiffRunsKernel<<<grid, kThreads, 0, stream>>>(raw, base, out, runs);
  return cudaGetLastError();
}

cudaError_t LaunchQClasses(const double* r, const double* w, const uint8_t* forced, uint32_t* out, size_t n,
                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  QClassKernel<<<BlocksFor(n), kThreads, 0, stream>>>(r, w, forced, out, n);
  return cudaGetLastError();
}

cudaError_t LaunchNearestLevels(const double* r, const double* bounds, uint32_t bound_count, uint16_t* out, size_t n,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  NearestKernel<<<BlocksFor(n), kThreads, 0, stream>>>(r, bounds, bound_count, out, n);
  return cudaGetLastError();
}

cudaError_t ProbeKernel(cudaStream_t stream) {
  Probe<<<1, 1, 0, stream>>>(nullptr);
  cudaError_t e = cudaGetLastError();
  return e != cudaSuccess ? e : cudaStreamSynchronize(stream);
}

}  // namespace ckptfs::gpu
