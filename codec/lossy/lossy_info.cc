#include "codec/lossy/lossy_info.h"

namespace ckptfs {

const char* SensitivityRuleName(SensitivityRule r) {
  switch (r) {
    case SensitivityRule::kNone:
      return "none";
    case SensitivityRule::kMagnitude:
      return "magnitude";
    case SensitivityRule::kOwnMoments:
      return "second-moments";
    case SensitivityRule::kSibling:
      return "sibling-second-moments";
  }
  return "none";
}

const char* BudgetMeasureName(BudgetMeasure m) { return m == BudgetMeasure::kOneStep ? "one-step" : "relative"; }

}  // namespace ckptfs
