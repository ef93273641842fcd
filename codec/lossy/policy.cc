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
        "\": expected \"lossless\", \"lossy\" or \"lossy=FIDELITY\" with FIDELITY in (0, " +
        std::to_string(kMaxFidelity).substr(0, 3) +
        "], optionally followed by \",scope=models\" (the default) or \",scope=all\", e.g. lossy=0.01");
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
  if (text == "lossy") {
    p.fidelity = kDefaultFidelity;
    return p;
  }
  if (!text.starts_with("lossy=")) return bad();
  text.remove_prefix(6);
  double v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || !std::isfinite(v) || v <= 0 || v > kMaxFidelity) {
    return bad();
  }
  p.fidelity = v;
  return p;
}

std::string FormatLossyPolicy(const LossyPolicy& policy) {
  if (!policy.lossy()) return "lossless";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "lossy=%g%s", policy.fidelity,
                policy.scope == lossy::LossyScope::kAll ? ",scope=all" : "");
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

}  // namespace ckptfs
