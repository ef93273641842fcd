#include "codec/lossy/sensitivity.h"

#include <cmath>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "codec/cpu_features.h"
#include "codec/lossy/float_bits.h"
#include "codec/lossy/policy.h"

namespace ckptfs::lossy {
namespace {

// A second moment as the sensitivity reads it: finite and positive, else 0.
template <DType T>
double MomentAt(const uint8_t* bytes, size_t i) {
  const double x = BitsToFloat(T, LoadBits(T, bytes, i));
  return std::isfinite(x) && x > 0 ? x : 0.0;
}

// 1 / (sqrt(v) + eps)^2 of elements [i, n), and whether any v was counted
// (finite and positive).
template <DType T>
bool UpdateUnitWeightsFrom(const uint8_t* bytes, size_t i, size_t n, float* out) {
  bool any = false;
  for (; i < n; ++i) {
    const double v = MomentAt<T>(bytes, i);
    any |= v > 0;
    const double d = std::sqrt(v) + kAdamEps;
    out[i] = static_cast<float>(1.0 / (d * d));
  }
  return any;
}

#if defined(__x86_64__)
// The same for f32, four elements at a time: the same correctly rounded
// double operations in the same order, so the same floats. Returns where
// it stopped; *any as UpdateUnitWeightsFrom's result.
__attribute__((target("avx2"))) size_t UpdateUnitWeightsF32Avx2(const uint8_t* bytes, size_t n, float* out, bool* any) {
  const __m256d zero = _mm256_setzero_pd(), inf = _mm256_set1_pd(std::numeric_limits<double>::infinity());
  const __m256d one = _mm256_set1_pd(1.0), eps = _mm256_set1_pd(kAdamEps);
  __m256d counted = zero;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(reinterpret_cast<const float*>(bytes) + i));
    // MomentAt: finite and positive, else 0 (NaN fails both compares).
    const __m256d ok = _mm256_and_pd(_mm256_cmp_pd(x, zero, _CMP_GT_OQ), _mm256_cmp_pd(x, inf, _CMP_LT_OQ));
    counted = _mm256_or_pd(counted, ok);
    const __m256d d = _mm256_add_pd(_mm256_sqrt_pd(_mm256_and_pd(x, ok)), eps);
    _mm_storeu_ps(out + i, _mm256_cvtpd_ps(_mm256_div_pd(one, _mm256_mul_pd(d, d))));
  }
  *any = _mm256_movemask_pd(counted) != 0;
  return i;
}
#endif

// First moments' weights: the units of Adam's update. Leaves `w` empty
// when every v is 0 (no gradient seen yet).
template <DType T>
void UpdateUnitWeights(const uint8_t* bytes, size_t n, std::vector<float>* w) {
  w->resize(n);
  size_t i = 0;
  bool any = false;
#if defined(__x86_64__)
  if (T == DType::kF32 && CpuHasAvx2()) i = UpdateUnitWeightsF32Avx2(bytes, n, w->data(), &any);
#endif
  if (UpdateUnitWeightsFrom<T>(bytes, i, n, w->data())) any = true;
  if (!any) w->clear();
}

// FisherWeights for one element type, so that the sum stays in a register
// and the last loop vectorises.
template <DType T>
void FisherWeightsOf(const uint8_t* bytes, size_t n, bool weight, std::vector<float>* w) {
  if (!weight) return UpdateUnitWeights<T>(bytes, n, w);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += MomentAt<T>(bytes, i);
  w->resize(sum > 0 ? n : 0);
  if (sum <= 0) return;
  float* out = w->data();
  const double floor = kFisherFloor * sum / static_cast<double>(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(MomentAt<T>(bytes, i) + floor);
}

}  // namespace

void FisherWeights(DType dtype, std::span<const uint8_t> v, bool weight, std::vector<float>* out) {
  const size_t n = v.size() / DTypeSize(dtype);
  switch (dtype) {
    case DType::kF32:
      return FisherWeightsOf<DType::kF32>(v.data(), n, weight, out);
    case DType::kF16:
      return FisherWeightsOf<DType::kF16>(v.data(), n, weight, out);
    default:
      return FisherWeightsOf<DType::kBF16>(v.data(), n, weight, out);
  }
}

}  // namespace ckptfs::lossy
