// What lossy mode did to one file: the record the per-file coder
// (codec/lossy/file_coder.h) fills while sealing, which the pack's meta
// block keeps (store/pack_meta.h) for `ckptfs stats` and the
// user.ckptfs.lossy.* attributes.
#pragma once

#include <cstdint>

#include "codec/lossy/roles.h"

namespace ckptfs {

struct LossyRoleInfo {
  float target = 0;     // the error bound the role was coded to
  float max_error = 0;  // the largest error measured on any piece
  uint64_t elements = 0;
  uint64_t stored = 0;  // bytes of their lossy pieces
};
// What weighed the weights' errors: nothing (no weights were coded),
// their magnitude alone, Adam's second moments in the same file, or those
// of a sibling file of the same save (codec/lossy/siblings.h).
enum class SensitivityRule : uint8_t { kNone = 0, kMagnitude = 1, kOwnMoments = 2, kSibling = 3 };
const char* SensitivityRuleName(SensitivityRule r);
// What the weights' errors were bounded by (codec/lossy/policy.h,
// docs/LOSSY.md): relative error (a numeric fidelity, or the fallback for a
// file without Adam moments and a learning rate), or the one-step measure,
// in which case roles[0].target is the step budget C and roles[0].max_error
// the largest error of a piece in the same unit (steps).
enum class BudgetMeasure : uint8_t { kRelative = 0, kOneStep = 1 };
const char* BudgetMeasureName(BudgetMeasure m);

struct LossyInfo {
  float fidelity = 0;
  uint64_t exact_elements = 0;      // float elements of lossy tensors that stayed exact
  LossyRoleInfo roles[3];           // weights, first moments, second moments
  // Unknown (kModels, kNone) in packs written before version 2 of the section.
  lossy::LossyScope scope = lossy::LossyScope::kModels;
  SensitivityRule sensitivity = SensitivityRule::kNone;
  BudgetMeasure measure = BudgetMeasure::kRelative;  // kRelative in packs written before the measure existed
};

}  // namespace ckptfs
