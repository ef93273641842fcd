// Which files lossy mode may touch, and how hard: a policy, its text form
// ("lossless", "lossy", "lossy=FIDELITY", each lossy form optionally
// followed by ",scope=models" or ",scope=all") and the per-role error
// targets one fidelity gives. A file's policy is the mount's
// (-o lossy[=FIDELITY][,lossy_scope=SCOPE]) unless a directory on its path
// carries the extended attribute kPolicyXattr (store/lossy_xattrs.h); the
// store resolves it when the file is sealed (Store::PolicyFor).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "codec/lossy/roles.h"

namespace ckptfs {

// The fidelity "lossy" alone means: weights within 1% relative error.
inline constexpr double kDefaultFidelity = 0.01;
inline constexpr double kMaxFidelity = 0.5;

struct LossyPolicy {
  double fidelity = 0;  // 0: lossless
  // What may be quantized (codec/lossy/roles.h): by default only the
  // parameters and optimizer moments of model and checkpoint files.
  lossy::LossyScope scope = lossy::LossyScope::kModels;
  bool lossy() const { return fidelity > 0; }
  bool operator==(const LossyPolicy&) const = default;
};

// InvalidArgument, naming the accepted forms, for anything else.
Result<LossyPolicy> ParseLossyPolicy(std::string_view text);
// "models" or "all" (the mount option lossy_scope=).
Result<lossy::LossyScope> ParseLossyScope(std::string_view text);
std::string FormatLossyPolicy(const LossyPolicy& policy);

// Per-role error targets derived from one fidelity (docs/SEMANTICS.md):
// weights within `fidelity` relative error weighted by sensitivity; first
// moments within a looser bound of the normalised update they produce;
// second moments within a log2-domain RMS error.
struct RoleTargets {
  double weight = 0;
  // Weights coded against their predecessor also keep the error within
  // this share of their change since it (PieceSpec::residual_cap).
  double weight_update = 0;
  double first_moment = 0;
  double second_moment = 0;
};
RoleTargets TargetsFor(double fidelity);

}  // namespace ckptfs
