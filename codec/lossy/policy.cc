#include "codec/lossy/policy.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace ckptfs {

Result<lossy::LossyScope> ParseLossyScope(std::string_view text) {
  if (text == "models") return lossy::LossyScope::kModels;
  if (text == "all") return lossy::LossyScope::kAll;
  return Status::InvalidArgument("lossy scope \"" + std::string(text) +
                                 "\": expected \"models\" (parameters and optimizer state of model and "
                                 "checkpoint files, the default) or \"all\" (every float tensor, NumPy arrays "
                                 "and data included)");
}

Result<LossyPolicy> ParseLossyPolicy(std::string_view text) {
  const std::string given(text);
  auto bad = [&] {
    return Status::InvalidArgument(
        "lossy policy \"" + given +
        "\": expected \"lossless\", \"lossy\" (the same as lossy=safe), \"lossy=aggressive\", "
        "\"lossy=steps:C\" with C in (0, 100], or \"lossy=FIDELITY\" with FIDELITY in (0, " +
        std::to_string(kMaxFidelity).substr(0, 3) +
        "], optionally followed by \",scope=models\" (the default) or \",scope=all\", e.g. lossy=safe");
  };
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\0')) text.remove_suffix(1);
  if (text == "lossless") return LossyPolicy{};
  LossyPolicy p;
  if (const size_t comma = text.find(','); comma != std::string_view::npos) {
    std::string_view rest = text.substr(comma + 1);
    text = text.substr(0, comma);
    if (!rest.starts_with("scope=")) return bad();
    Result<lossy::LossyScope> scope = ParseLossyScope(rest.substr(6));
    if (!scope.ok()) return bad();
    p.scope = *scope;
  }
  if (text == "lossy" || text == "lossy=safe") {
    p.fidelity = kSafeFallbackFidelity;
    p.step_budget = kSafeSteps;
    return p;
  }
  if (text == "lossy=aggressive") {
    p.fidelity = kAggressiveFidelity;
    p.step_budget = kAggressiveSteps;
    return p;
  }
  if (!text.starts_with("lossy=")) return bad();
  text.remove_prefix(6);
  const bool steps = text.starts_with("steps:");
  if (steps) text.remove_prefix(6);
  double v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || !std::isfinite(v) || v <= 0 ||
      v > (steps ? kMaxSteps : kMaxFidelity)) {
    return bad();
  }
  p.fidelity = steps ? kSafeFallbackFidelity : v;
  p.step_budget = steps ? v : 0;
  return p;
}

std::string FormatLossyPolicy(const LossyPolicy& policy) {
  if (!policy.lossy()) return "lossless";
  const char* scope = policy.scope == lossy::LossyScope::kAll ? ",scope=all" : "";
  char buf[64];
  if (policy.step_budget <= 0) {
    std::snprintf(buf, sizeof(buf), "lossy=%g%s", policy.fidelity, scope);
  } else if (policy.step_budget == kSafeSteps && policy.fidelity == kSafeFallbackFidelity) {
    std::snprintf(buf, sizeof(buf), "lossy=safe%s", scope);
  } else if (policy.step_budget == kAggressiveSteps && policy.fidelity == kAggressiveFidelity) {
    std::snprintf(buf, sizeof(buf), "lossy=aggressive%s", scope);
  } else {
    std::snprintf(buf, sizeof(buf), "lossy=steps:%g%s", policy.step_budget, scope);
  }
  return buf;
}

RoleTargets TargetsFor(double fidelity) {
  RoleTargets t;
  t.weight = fidelity;
  t.weight_update = std::min(1.0, 10 * fidelity);
  t.first_moment = std::min(0.9, 20 * fidelity);
  t.second_moment = 10 * fidelity;
  return t;
}

RoleTargets StepTargetsFor(double step_budget) {
  RoleTargets t;
  t.first_moment = std::min(0.9, kFirstMomentUpdateErrorPerStep * step_budget);
  t.second_moment = std::min(1.0, kSecondMomentLog2ErrorPerStep * step_budget);
  return t;
}

double OneStepWeightTarget(std::span<const double> w, std::span<const double> m, std::span<const double> v,
                           double lr, double eps, double step_budget) {
  const size_t n = std::min({w.size(), m.size(), v.size()});
  return OneStepWeightTargetOf(
      n, [&](size_t i) { return w[i]; }, [&](size_t i) { return m[i]; }, [&](size_t i) { return v[i]; }, lr, eps,
      step_budget);
}

}  // namespace ckptfs
