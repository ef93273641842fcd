// Which files lossy mode may touch, and how hard. A policy is the mount's
// (-o lossy[=FIDELITY]) unless a directory on the file's path carries the
// extended attribute user.ckptfs.policy ("lossless", "lossy" or
// "lossy=FIDELITY"); the nearest such directory wins, so subtrees inherit.
// It is resolved when the file is sealed.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace ckptfs {

inline constexpr const char* kPolicyXattr = "user.ckptfs.policy";
// The fidelity "lossy" alone means: weights within 1% relative error.
inline constexpr double kDefaultFidelity = 0.01;
inline constexpr double kMaxFidelity = 0.5;

// 0 means lossless. InvalidArgument, naming the accepted forms, otherwise.
Result<double> ParseLossyPolicy(std::string_view text);
std::string FormatLossyPolicy(double fidelity);

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
