// The Fisher weights the lossy encoder weighs each element's squared error
// with, from Adam's second moments v of the same elements (docs/LOSSY.md,
// "The measure"): a weight's error counts as v + a floor, a first moment's
// in the units of Adam's update, 1 / (sqrt(v) + eps)^2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/dtype.h"

namespace ckptfs::lossy {

// Adam's update divides m by sqrt(v) + eps: errors of m count in those units.
inline constexpr double kAdamEps = 1e-8;

// The weights of the elements whose second moments `v` holds (of `dtype`;
// f32, f16 or bf16): v + kFisherFloor * mean(v) for weights (`weight`),
// 1 / (sqrt(v) + kAdamEps)^2 for first moments, where a v that is not
// finite and positive counts as 0. `out` is left empty when no v is (no
// gradient seen yet: the caller weighs by magnitude alone). The same
// floats on every CPU, with or without its vector loops.
void FisherWeights(DType dtype, std::span<const uint8_t> v, bool weight, std::vector<float>* out);

}  // namespace ckptfs::lossy
