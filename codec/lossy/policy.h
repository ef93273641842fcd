// Which files lossy mode may touch, and how hard: a policy, its text form
// ("lossless", "lossy", "lossy=safe", "lossy=aggressive", "lossy=steps:C",
// "lossy=FIDELITY", each lossy form optionally
// followed by ",scope=models" or ",scope=all") and the per-role error
// targets one fidelity gives. A file's policy is the mount's
// (-o lossy[=FIDELITY][,lossy_scope=SCOPE]) unless a directory on its path
// carries the extended attribute kPolicyXattr (store/lossy_xattrs.h); the
// store resolves it when the file is sealed (Store::PolicyFor).
#pragma once

#include <cmath>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "base/status.h"
#include "codec/lossy/roles.h"

namespace ckptfs {

// Two measures (docs/LOSSY.md). The one-step measure, for weights whose
// file holds Adam's m and v and the optimizer's learning rate: the Fisher
// energy of the error, sum (v+floor)*dw^2, at most C^2 times that of one
// optimizer step, sum (v+floor)*(lr*m/(sqrt(v)+eps))^2 ("C steps"). The
// relative measure, for everything else (the fallback) and for a numeric
// FIDELITY: sqrt(sum s*dw^2 / sum s*w^2) at most FIDELITY, s the
// sensitivity (v, or 1).
//
// The named levels, calibrated on bench/lossy_accuracy.py's panel
// (docs/LOSSY.md): "lossy" alone is "safe". Safe was one step while the
// weights' least sensitive elements were pruned (their updates dropped at
// every restore); unpruned, 5 steps was within +1% on every Adam workload
// of the panel and 3 steps keeps a margin.
inline constexpr double kSafeSteps = 3.0;
inline constexpr double kAggressiveSteps = 6.0;
inline constexpr double kMaxSteps = 100.0;
// The relative fidelity of files the one-step measure cannot judge (no
// optimizer state, no learning rate) at the safe level and steps:C: on the
// panel's SGD workload, 1% with the weights unpruned cost -0.46% final loss
// (pruned it cost +1.19%), 2% +2.76% (docs/LOSSY.md).
inline constexpr double kSafeFallbackFidelity = 0.01;
inline constexpr double kAggressiveFidelity = 0.03;
inline constexpr double kMaxFidelity = 0.5;
// Weights of a parameter's error: Adam's v estimates the diagonal of the
// Fisher information, so sum(v * dw^2) approximates the loss increase. The
// floor, this share of the mean v, keeps parameters that saw no gradient
// yet from being free to move.
inline constexpr double kFisherFloor = 0.01;
// m's error under the one-step measure, relative in update units, per step
// of budget: 0.3 at the safe level. Measured, not derived (docs/LOSSY.md):
// unbiased noise of 0.5 in update units added to m at every restore moved
// the panel's Adam workloads' final loss by at most 0.7%, but the quantizer's
// error is not unbiased noise: levels at conditional means also shrink m (by
// 1 - e^2 in energy at error e) and pruning zeroes its smallest elements,
// and dropping m costs 1% to 16%. So the named levels code m without pruning
// and with energy-preserving levels (LossyCoder::Segments). With the weights
// unpruned at 3 steps, m at 0.3 was within +0.2% on the panel's B and C, m
// at 0.5 +0.88% on C.
inline constexpr double kFirstMomentUpdateErrorPerStep = 0.1;
// v's log2 RMS error per step of budget: 0.1 at the safe level, as before.
inline constexpr double kSecondMomentLog2ErrorPerStep = 1.0 / 30;

struct LossyPolicy {
  double fidelity = 0;  // 0: lossless; else the relative measure's bound (the fallback's, with step_budget)
  // What may be quantized (codec/lossy/roles.h): by default only the
  // parameters and optimizer moments of model and checkpoint files.
  lossy::LossyScope scope = lossy::LossyScope::kModels;
  // C of the one-step measure (with the Adam bias corrections of the
  // checkpoint's step count); 0: the relative measure for every file.
  double step_budget = 0;
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
// second moments within a log2-domain RMS error. Under the one-step
// measure (StepTargetsFor) the weight target is per piece
// (OneStepWeightTarget) and `weight` is unused.
struct RoleTargets {
  double weight = 0;
  // Weights coded against their predecessor also keep the error within
  // this share of their change since it (PieceSpec::residual_cap).
  double weight_update = 0;
  double first_moment = 0;
  double second_moment = 0;
};
RoleTargets TargetsFor(double fidelity);
// The moments' targets for a step budget C: m's relative error in Adam's
// update units (|dm|/(sqrt(v)+eps) against |m|/(sqrt(v)+eps)) at
// kFirstMomentUpdateErrorPerStep * C (at most 0.9); v's log2 RMS error at
// kSecondMomentLog2ErrorPerStep * C (at most 1).
RoleTargets StepTargetsFor(double step_budget);

// The one-step measure's relative target for a piece of a weight tensor
// with its first and second moments (same element count, each given as
// doubles): C * sqrt(sum s*(lr*m/(sqrt(v)+eps))^2 / sum s*w^2), s = v +
// 0.01*mean(v) as the encoder weighs (kFisherFloor), so that a piece coded
// within it has sum s*dw^2 <= C^2 * sum s*step^2. 0 when it cannot be
// judged (no gradient seen yet, all-zero weights).
double OneStepWeightTarget(std::span<const double> w, std::span<const double> m, std::span<const double> v,
                           double lr, double eps, double step_budget);
// The same over n elements read through accessors (element index -> double),
// so the encoder need not widen a piece's three arrays first.
template <typename W, typename M, typename V>
double OneStepWeightTargetOf(size_t n, W w, M m, V v, double lr, double eps, double step_budget) {
  auto clean_v = [&](size_t i) {
    const double x = v(i);
    return x > 0 && std::isfinite(x) ? x : 0.0;
  };
  double v_sum = 0;
  for (size_t i = 0; i < n; ++i) v_sum += clean_v(i);
  if (n == 0 || v_sum <= 0 || !(lr > 0)) return 0;
  const double floor = kFisherFloor * v_sum / static_cast<double>(n);
  double step_energy = 0, weight_energy = 0;
  for (size_t i = 0; i < n; ++i) {
    const double vi = clean_v(i), s = vi + floor;
    const double step = lr * m(i) / (std::sqrt(vi) + eps), wi = w(i);
    if (std::isfinite(step)) step_energy += s * step * step;
    if (std::isfinite(wi)) weight_energy += s * wi * wi;
  }
  if (weight_energy <= 0 || step_energy <= 0) return 0;
  return step_budget * std::sqrt(step_energy / weight_energy);
}

}  // namespace ckptfs
