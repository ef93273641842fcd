#include "store/lossy_policy.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace ckptfs {

Result<double> ParseLossyPolicy(std::string_view text) {
  const std::string given(text);
  auto bad = [&] {
    return Status::InvalidArgument("lossy policy \"" + given +
                                   "\": expected \"lossless\", \"lossy\" or \"lossy=FIDELITY\" with FIDELITY in (0, " +
                                   std::to_string(kMaxFidelity).substr(0, 3) + "], e.g. lossy=0.01");
  };
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\0')) text.remove_suffix(1);
  if (text == "lossless") return 0.0;
  if (text == "lossy") return kDefaultFidelity;
  if (!text.starts_with("lossy=")) return bad();
  text.remove_prefix(6);
  double v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || !std::isfinite(v) || v <= 0 || v > kMaxFidelity) {
    return bad();
  }
  return v;
}

std::string FormatLossyPolicy(double fidelity) {
  if (fidelity <= 0) return "lossless";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "lossy=%g", fidelity);
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
