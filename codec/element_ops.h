// The per-element definitions of the ComputeDevice steps
// (codec/compute_device.h), compiled both for the CPU and, by nvcc, for the
// GPU (CKPTFS_HD): a GPU thread computes exactly what the CPU reference
// computes for the same index, whatever order the threads run in. Only
// integer arithmetic, one IEEE multiply pair and comparisons: no libm, no
// fused multiply-add, so every device gives the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CKPTFS_HD __host__ __device__ __forceinline__
#else
#define CKPTFS_HD inline
#endif

namespace ckptfs::ops {

template <typename U>
CKPTFS_HD U LoadLane(const uint8_t* p) {
  U v = 0;
  for (unsigned i = 0; i < sizeof(U); ++i) v |= static_cast<U>(static_cast<U>(p[i]) << (8 * i));
  return v;
}

template <typename U>
CKPTFS_HD void StoreLane(uint8_t* p, U v) {
  for (unsigned i = 0; i < sizeof(U); ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

template <typename U>
CKPTFS_HD U Rotl1(U v) {
  return static_cast<U>((v << 1) | (v >> (8 * sizeof(U) - 1)));
}

// Lane i of `src` into the planes (SplitJob).
template <typename U>
CKPTFS_HD void SplitLane(bool rotate, const uint8_t* src, size_t i, uint8_t* const* planes) {
  U v = LoadLane<U>(src + i * sizeof(U));
  if (rotate) v = Rotl1(v);
  for (unsigned k = 0; k < sizeof(U); ++k) planes[k][i] = static_cast<uint8_t>(v >> (8 * k));
}

CKPTFS_HD void SplitLaneW(unsigned w, bool rotate, const uint8_t* src, size_t i, uint8_t* const* planes) {
  if (w == 2) SplitLane<uint16_t>(rotate, src, i, planes);
  if (w == 4) SplitLane<uint32_t>(rotate, src, i, planes);
  if (w == 8) SplitLane<uint64_t>(rotate, src, i, planes);
}

// zigzag(raw - base mod 2^w): the sign in bit 0, so small steps either way
// leave the high bytes zero (codec/delta_chunk.h).
template <typename U>
CKPTFS_HD U ZigZagDiff(U raw, U base) {
  const U d = static_cast<U>(raw - base);
  return static_cast<U>((d << 1) ^ (U{0} - (d >> (8 * sizeof(U) - 1))));
}

template <typename U>
CKPTFS_HD U UnZigZagAdd(U z, U base) {
  const U d = static_cast<U>((z >> 1) ^ (U{0} - (z & 1)));
  return static_cast<U>(base + d);
}

// The residual of lane j (of width w) at byte offset `at`.
CKPTFS_HD void DiffLaneW(unsigned w, const uint8_t* raw, const uint8_t* base, uint8_t* out, uint64_t at) {
  if (w == 2) StoreLane<uint16_t>(out + at, ZigZagDiff(LoadLane<uint16_t>(raw + at), LoadLane<uint16_t>(base + at)));
  if (w == 4) StoreLane<uint32_t>(out + at, ZigZagDiff(LoadLane<uint32_t>(raw + at), LoadLane<uint32_t>(base + at)));
  if (w == 8) StoreLane<uint64_t>(out + at, ZigZagDiff(LoadLane<uint64_t>(raw + at), LoadLane<uint64_t>(base + at)));
}

// Lossy prune-mask classes: the top 15 bits of a non-negative double, 8
// classes per octave, monotonic in q (codec/lossy/quantizer.cc).
inline constexpr uint32_t kQClassForced = 0xFFFFFFFFu;

CKPTFS_HD uint64_t DoubleBits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
#endif
}

CKPTFS_HD double MulNoContract(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);  // never fused into a neighbouring add
#else
  return a * b;
#endif
}

CKPTFS_HD uint32_t QClassOf(double w, double r) {
  return static_cast<uint32_t>(DoubleBits(MulNoContract(MulNoContract(w, r), r)) >> 49);
}

// The index of the first bound above v (std::upper_bound's predicate, so
// NaN compares the same way): the index of the level nearest v.
CKPTFS_HD uint16_t NearestLevelIndex(const double* bounds, uint32_t n, double v) {
  uint32_t lo = 0, hi = n;
  while (lo < hi) {
    const uint32_t mid = (lo + hi) / 2;
    if (!(v < bounds[mid])) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return static_cast<uint16_t>(lo);
}

}  // namespace ckptfs::ops
