// Which tensors of a checkpoint are model weights and which are optimizer
// moments, and which second moment (Adam's v) goes with each, so the lossy
// encoder can weigh errors by sensitivity. Decided from the layout alone
// (labels and order the parsers found), never from file names.
#pragma once

#include <cstdint>
#include <vector>

#include "codec/formats/layout.h"

namespace ckptfs::lossy {

enum class TensorRole : uint8_t {
  kOther = 0,   // not floating point, or nothing lossy may touch
  kWeight = 1,  // a parameter or any other floating-point tensor
  kAdamM = 2,   // first moment (exp_avg, momentum_buffer)
  kAdamV = 3,   // second moment (exp_avg_sq, max_exp_avg_sq): non-negative
};

const char* TensorRoleName(TensorRole r);

struct RoleAssignment {
  TensorRole role = TensorRole::kOther;
  // Index into layout.tensors of the second moment that belongs to the same
  // parameter (for kWeight and kAdamM), or -1 when there is none. It has the
  // same element count and element type.
  int32_t partner_v = -1;
};

// One entry per layout.tensors element, in the same order.
std::vector<RoleAssignment> AssignRoles(const FileLayout& layout);

}  // namespace ckptfs::lossy
