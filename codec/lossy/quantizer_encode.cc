#include "codec/lossy/quantizer.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <utility>

#include "codec/compute_device.h"
#include "codec/element_ops.h"
#include "codec/lossless/byte_io.h"
#include "codec/lossless/entropy.h"
#include "codec/lossless/rans.h"
#include "codec/lossy/float_bits.h"
#include "codec/lossy/levels.h"
#include "codec/lossy/piece_format.h"

namespace ckptfs::lossy {
namespace {

using lossless::PutByte;
using lossless::PutU32;
using lossless::PutVarint;
using piece::ClampBits;
using piece::kFlagAgainstBase;
using piece::kFlagUniformGrid;
using piece::Reconstruct;
using piece::StoredLevels;
using piece::ZigZag;

constexpr double kInf = std::numeric_limits<double>::infinity();
// Level counts the search tries, smallest first.
constexpr unsigned kLevelCounts[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, kMaxLevels};
// Share of the error budget spent on pruning, and share of elements kept
// at full precision, tried by the search.
constexpr double kPruneShares[] = {0.05, 0.2, 0.4, 0.6, 0.8, 0.95};
constexpr double kEscapeShares[] = {0.0, 0.002, 0.02};
// Fits are estimates from a histogram; leave room for the exact check.
constexpr double kFitSlack = 0.95;
// The uniform quantizer's step is searched between this share of the
// residuals' span and the whole span, in this many halvings of the ratio.
constexpr double kUniformFinest = 1e-4;
constexpr int kUniformBisections = 12;
// A base whose element cannot predict (non-finite; in the log domain also
// negative) where the element itself is fine makes that element an escape,
// stored at full width. A base with more than one such element in this many
// is not a predecessor of the piece: the predecessor's bytes at this place
// belong to another array (a chunk straddling two arrays of an Orbax data
// file that moved between saves: a second moment predicted from weights
// escaped half its elements and cost twice a keyframe).
constexpr size_t kMaxBaseEscapeShare = 64;

// Whether to predict from the base, given the weighted squared errors
// against it and against zero over the elements both can predict, and how
// many elements only the base cannot predict.
bool UseBase(const PieceInput& in, double e_base, double e_zero, size_t base_escapes, size_t n) {
  if (in.base.empty()) return false;
  if (in.choice != nullptr) return in.choice->against_base;
  return e_base <= e_zero && base_escapes * kMaxBaseEscapeShare <= n;
}

// The residuals the search works on, with everything it needs per element.
struct Analysis {
  size_t n = 0;
  bool against_base = false;
  std::span<double> r;  // residual (kValue: value units; kLogBits: units of 2^mantissa)
  std::span<double> w;  // weight of the squared error
  std::span<uint8_t> must_escape;
  double budget = 0;  // allowed weighted squared error
  // The error measure's denominator: sum of w x^2 over the finite elements
  // (kValue), or n (kLogBits). Not computed when coding again as chosen.
  double energy = 0;
};

bool ValueUnusable(float f) { return !std::isfinite(f); }

template <DType T>
void AnalyseValuesOf(const PieceSpec& spec, const PieceInput& in, Analysis* a) {
  const size_t n = a->n;
  const bool has_base = !in.base.empty();
  // e_zero: over the elements the base can predict too (to compare with
  // e_base); e_all: over all (the budget).
  double e_zero = 0, e_base = 0, e_all = 0;
  size_t base_escapes = 0;
  // Coded again as chosen: the budget is not needed, only the predictor.
  for (size_t i = 0; i < n && in.choice == nullptr; ++i) {
    const float x = BitsToFloat(T, LoadBits(T, in.x.data(), i));
    const float p = has_base ? BitsToFloat(T, LoadBits(T, in.base.data(), i)) : 0.0f;
    const double w = in.weight.empty() ? 1.0 : static_cast<double>(in.weight[i]);
    if (ValueUnusable(x)) continue;
    e_all += w * double(x) * double(x);
    if (ValueUnusable(p)) {
      ++base_escapes;
      continue;
    }
    e_zero += w * double(x) * double(x);
    e_base += w * (double(x) - double(p)) * (double(x) - double(p));
  }
  a->against_base = UseBase(in, e_base, e_zero, base_escapes, n);
  a->energy = e_all;
  a->budget = spec.target * spec.target * e_all;
  if (a->against_base && spec.residual_cap > 0) {
    a->budget = std::min(a->budget, spec.residual_cap * spec.residual_cap * e_base);
  }
  for (size_t i = 0; i < n; ++i) {
    const float x = BitsToFloat(T, LoadBits(T, in.x.data(), i));
    const float p = a->against_base ? BitsToFloat(T, LoadBits(T, in.base.data(), i)) : 0.0f;
    a->w[i] = in.weight.empty() ? 1.0 : static_cast<double>(in.weight[i]);
    const bool unusable = ValueUnusable(x) || ValueUnusable(p);
    a->must_escape[i] = unusable ? 1 : 0;
    a->r[i] = unusable ? 0.0 : double(x) - double(p);
  }
}

template <DType T>
void AnalyseLogBitsOf(const PieceSpec& spec, const PieceInput& in, Analysis* a) {
  const size_t n = a->n;
  const bool has_base = !in.base.empty();
  const double unit = std::ldexp(1.0, -static_cast<int>(MantissaBits(T)));
  double e_zero = 0, e_base = 0;
  size_t base_escapes = 0;
  for (size_t i = 0; i < n && in.choice == nullptr; ++i) {
    const uint32_t x = LoadBits(T, in.x.data(), i);
    const uint32_t p = has_base ? LoadBits(T, in.base.data(), i) : 0;
    if (BitsNegativeOrNonFinite(T, x)) continue;
    if (BitsNegativeOrNonFinite(T, p)) {
      ++base_escapes;
      continue;
    }
    e_zero += double(x) * double(x);
    e_base += (double(x) - double(p)) * (double(x) - double(p));
  }
  a->against_base = UseBase(in, e_base, e_zero, base_escapes, n);
  a->energy = static_cast<double>(n);
  a->budget = spec.target * spec.target * static_cast<double>(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = LoadBits(T, in.x.data(), i);
    const uint32_t p = a->against_base ? LoadBits(T, in.base.data(), i) : 0;
    a->w[i] = 1.0;
    const bool unusable = BitsNegativeOrNonFinite(T, x) || BitsNegativeOrNonFinite(T, p);
    a->must_escape[i] = unusable ? 1 : 0;
    a->r[i] = unusable ? 0.0 : (static_cast<double>(x) - static_cast<double>(p)) * unit;
  }
}

// The analysis, one instance per element type (loads inline, loops unswitched).
void Analyse(const PieceSpec& spec, const PieceInput& in, Analysis* a) {
  const bool value = spec.domain == Domain::kValue;
  switch (spec.dtype) {
    case DType::kF32:
      return value ? AnalyseValuesOf<DType::kF32>(spec, in, a) : AnalyseLogBitsOf<DType::kF32>(spec, in, a);
    case DType::kF16:
      return value ? AnalyseValuesOf<DType::kF16>(spec, in, a) : AnalyseLogBitsOf<DType::kF16>(spec, in, a);
    default:
      return value ? AnalyseValuesOf<DType::kBF16>(spec, in, a) : AnalyseLogBitsOf<DType::kBF16>(spec, in, a);
  }
}

// One configuration the search considers. Elements are ranked by the
// error pruning them would cost (q = w r^2), in logarithmic classes.
struct Plan {
  uint32_t prune_below = 0;           // q class below this: pruned
  uint32_t escape_from = UINT32_MAX;  // q class at or above this: escaped
  std::vector<double> levels;
  double est_bits = kInf;
  std::optional<UniformGrid> grid;  // levels from UniformFit
};

// A uniform grid's levels with their counts, as UniformFit found them.
struct GridFit {
  LevelFit fit;
  UniformGrid grid;
};

// Bits a piece's levels take in the blob.
double LevelBits(const LevelFit& fit, const std::optional<UniformGrid>& grid) {
  return grid ? 48.0 : 32.0 * static_cast<double>(fit.levels.size());
}

double EntropyBits(std::span<const uint64_t> counts) {
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  double bits = 0;
  for (uint64_t c : counts) {
    if (c > 0) bits += static_cast<double>(c) * std::log2(static_cast<double>(total) / static_cast<double>(c));
  }
  return bits;
}

// Classes of q from the top bits of its double (ops::QClassOf): monotonic, 8 per octave.
constexpr uint32_t kQClasses = 1u << 14;
constexpr uint32_t kForced = UINT32_MAX;  // must escape (not a finite value)
static_assert(kForced == ops::kQClassForced && kQClasses == (1u << 14), "devices compute the same classes");

// Elements a device pass is worth sending: each costs 17 bytes of input.
bool OffloadElements(const ComputeDevice* device, size_t n) { return Offload(device, n * 17); }

// The prune class of every element (kForced where it must escape), on the
// device when it takes the job, else (or when it fails) on this thread.
void QClasses(const Analysis& a, const ComputeDevice* device, std::span<uint32_t> out) {
  const QClassJob job{a.r, a.w, a.must_escape, out};
  if (OffloadElements(device, a.n) && device->QClasses(job).ok()) return;
  (void)CpuComputeDevice().QClasses(job);  // sizes agree by construction
}

// Where one (prune share, escape share) configuration cuts the q classes.
struct Cut {
  uint32_t prune_below = 0;
  uint32_t escape_from = UINT32_MAX;
  double pruned_err = 0;
  uint64_t pruned = 0, escaped = 0;
};

// The index of the level coded with the "unchanged" symbol, or UINT_MAX:
// a value-domain level at exactly zero reconstructs the predictor (a
// uniform quantizer's levels include zero; Lloyd levels hardly ever do).
// The search's estimate and AssignElements must agree on it.
unsigned UnchangedLevel(Domain domain, std::span<const double> levels) {
  if (domain != Domain::kValue) return UINT_MAX;
  const auto it = std::find(levels.begin(), levels.end(), 0.0);
  return it == levels.end() ? UINT_MAX : static_cast<unsigned>(it - levels.begin());
}

// What TallyClasses adds up over the elements that need not escape.
struct Tally {
  double lo = kInf, hi = -kInf, sq = 0, total = 0;
  uint64_t finite = 0, forced = 0;
};

// Counts and sums q = w r^2 per class (count, sum: kQClasses each), and
// the residuals' range and square sum. kClassify: also fills `qclass` as
// ops::QClassOf does (each residual is read once, not twice). A function
// of its own, with its sums in plain locals: inside Search's constructor
// they were kept in memory, and each one's store and reload set the pace.
template <bool kClassify>
__attribute__((noinline)) Tally TallyClasses(const Analysis& a, std::span<uint32_t> qclass, uint64_t* count,
                                             double* sum) {
  const double* const r = a.r.data();
  const double* const w = a.w.data();
  const uint8_t* const must_escape = a.must_escape.data();
  uint32_t* const classes = qclass.data();
  double lo = kInf, hi = -kInf, sq = 0, total = 0;
  uint64_t finite = 0, forced = 0;
  for (size_t i = 0; i < a.n; ++i) {
    uint32_t c;
    if constexpr (kClassify) {
      c = must_escape[i] != 0 ? kForced : ops::QClassOf(w[i], r[i]);
      classes[i] = c;
    } else {
      c = classes[i];
    }
    if (c == kForced) {
      ++forced;
      continue;
    }
    const double ri = r[i];
    const double q = w[i] * ri * ri;
    ++count[c];
    sum[c] += q;
    total += q;
    lo = std::min(lo, ri), hi = std::max(hi, ri), sq += ri * ri;
    ++finite;
  }
  return Tally{lo, hi, sq, total, finite, forced};
}

class Search {
 public:
  // `classify`: no device computed the q classes, and this pass fills
  // `qclass` as ops::QClassOf does (each residual is read once, not twice).
  Search(const PieceSpec& spec, const Analysis& a, std::span<uint32_t> qclass, bool classify)
      : spec_(spec), a_(a), qclass_(qclass) {
    count_.assign(kQClasses, 0);
    sum_.assign(kQClasses, 0.0);
    const Tally t = classify ? TallyClasses<true>(a_, qclass, count_.data(), sum_.data())
                             : TallyClasses<false>(a_, qclass, count_.data(), sum_.data());
    total_ = t.total, forced_ = t.forced;
    const double lo = t.lo, hi = t.hi, sq = t.sq;
    const uint64_t finite = t.finite;
    if (finite == 0) return;
    for (double prune_share : kPruneShares) {
      for (double escape_share : kEscapeShares) cuts_.push_back(CutAt(spec.prune ? prune_share : 0.0, escape_share));
    }
    BinByInterval(ResidualHistogram(lo, hi, 0.1 * std::sqrt(sq / static_cast<double>(finite)) + 1e-300,
                                    kResidualBins));
  }

  bool AllPrunable() const { return total_ <= a_.budget; }

  // The cheapest plan found, or none when nothing meets the budget.
  // allow_uniform: whether UniformFit's grids compete with the k-means levels.
  std::optional<Plan> Best(unsigned min_levels, bool allow_uniform) const {
    // Pruned, escaped and coded elements as three symbols cost no more
    // than with the levels told apart: configurations are tried from the
    // lowest such bound up, and one whose bound is no better than the best
    // plan so far is never chosen, so its fits are skipped. Ties go to the
    // configuration listed first, as when every one was tried in order.
    std::vector<std::pair<double, size_t>> order;
    for (size_t i = 0; i < cuts_.size(); ++i) {
      const bool repeat = std::any_of(cuts_.begin(), cuts_.begin() + static_cast<std::ptrdiff_t>(i), [&](const Cut& c) {
        return c.prune_below == cuts_[i].prune_below && c.escape_from == cuts_[i].escape_from;
      });
      if (!repeat) order.emplace_back(LowerBoundBits(cuts_[i]), i);
    }
    std::sort(order.begin(), order.end());
    std::optional<Plan> best;
    size_t best_index = 0;
    for (const auto& [bound, i] : order) {
      if (best && bound > best->est_bits) break;
      if (best && bound == best->est_bits && i > best_index) continue;
      std::optional<Plan> p = Try(cuts_[i], min_levels, allow_uniform);
      if (!p) continue;
      if (!best || p->est_bits < best->est_bits || (p->est_bits == best->est_bits && i < best_index)) {
        best = std::move(p);
        best_index = i;
      }
    }
    return best;
  }

 private:
  static constexpr size_t kResidualBins = 4096;

  // Elements a piece's level fits are estimated from, at least, and how
  // many of the largest (by q class) are always among them.
  static constexpr size_t kSampleElements = 1 << 17;
  static constexpr uint64_t kExactTail = 1 << 12;

  Cut CutAt(double prune_share, double escape_share) const {
    Cut c;
    while (c.prune_below < kQClasses && c.pruned_err + sum_[c.prune_below] <= prune_share * a_.budget) {
      c.pruned_err += sum_[c.prune_below];
      c.pruned += count_[c.prune_below++];
    }
    const uint64_t want_escapes = static_cast<uint64_t>(escape_share * static_cast<double>(a_.n));
    if (want_escapes > 0) {
      c.escape_from = kQClasses;
      while (c.escape_from > c.prune_below + 1 && c.escaped + count_[c.escape_from - 1] <= want_escapes) {
        c.escaped += count_[--c.escape_from];
      }
    }
    return c;
  }

  // Every cut's coded elements are a union of the intervals between the
  // cuts' class boundaries: one pass bins the residuals of each interval,
  // and each configuration then only adds up its intervals' histograms.
  void BinByInterval(const ResidualHistogram& shape) {
    for (const Cut& c : cuts_) {
      bounds_.push_back(c.prune_below);
      bounds_.push_back(std::min<uint32_t>(c.escape_from, kQClasses));
    }
    bounds_.push_back(kQClasses);
    std::sort(bounds_.begin(), bounds_.end());
    bounds_.erase(std::unique(bounds_.begin(), bounds_.end()), bounds_.end());
    std::vector<uint8_t> interval(kQClasses, kNoInterval);
    for (size_t k = 0; k + 1 < bounds_.size(); ++k) {
      std::fill(interval.begin() + bounds_[k], interval.begin() + bounds_[k + 1], static_cast<uint8_t>(k));
      hists_.push_back(shape.EmptyLike());
    }
    // The levels are fitted on a sample: every stride-th element (an odd
    // stride, so rows of any even length are sampled in every column),
    // scaled up per interval to its exact count, plus every element of the
    // highest classes (the largest errors, where a sample would miss the
    // few that set the outer levels), which are binned as they are.
    const size_t stride = a_.n > kSampleElements ? (a_.n / kSampleElements) | 1 : 1;
    uint32_t top = kQClasses;
    for (uint64_t above = 0; top > 0 && above + count_[top - 1] <= kExactTail;) above += count_[--top];
    std::vector<ResidualHistogram> sampled(hists_.size(), shape.EmptyLike());
    std::vector<uint64_t> want(hists_.size(), 0);
    for (uint32_t c = 0; c < top; ++c) {
      if (interval[c] != kNoInterval) want[interval[c]] += count_[c];
    }
    // Two loops, each adding to its own histograms in element order: the
    // sample's touches only every stride-th element.
    for (size_t i = 0; top < kQClasses && i < a_.n; ++i) {
      const uint32_t c = qclass_[i];
      if (c >= top && c != kForced && interval[c] != kNoInterval) hists_[interval[c]].Add(a_.r[i], a_.w[i]);
    }
    for (size_t i = 0; i < a_.n; i += stride) {
      const uint32_t c = qclass_[i];  // below top: not kForced
      if (c < top && interval[c] != kNoInterval) sampled[interval[c]].Add(a_.r[i], a_.w[i]);
    }
    for (size_t k = 0; k < hists_.size(); ++k) {
      if (sampled[k].count() == 0) continue;
      if (stride > 1) sampled[k].Scale(static_cast<double>(want[k]) / static_cast<double>(sampled[k].count()));
      hists_[k].Merge(sampled[k]);
    }
  }

  double LowerBoundBits(const Cut& cut) const {
    const uint64_t escaped = cut.escaped + forced_;
    const uint64_t coded = a_.n - std::min<uint64_t>(a_.n, cut.pruned + escaped);
    const uint64_t counts[] = {cut.pruned, escaped, coded};
    return EntropyBits(counts) + static_cast<double>(escaped) * 8.0 * DTypeSize(spec_.dtype);
  }

  std::optional<Plan> Try(const Cut& cut, unsigned min_levels, bool allow_uniform) const {
    const double room = (a_.budget - cut.pruned_err) * kFitSlack;
    if (room <= 0 || cut.pruned + cut.escaped + forced_ >= a_.n) return std::nullopt;
    Plan p;
    p.prune_below = cut.prune_below;
    p.escape_from = cut.escape_from;
    ResidualHistogram h = hists_.front().EmptyLike();
    const uint32_t escape_from = std::min<uint32_t>(cut.escape_from, kQClasses);
    for (size_t k = 0; k + 1 < bounds_.size(); ++k) {
      if (bounds_[k] >= cut.prune_below && bounds_[k + 1] <= escape_from && hists_[k].count() > 0) h.Merge(hists_[k]);
    }
    // The error falls as levels are added: binary search for the fewest that fit.
    size_t lo = 0, hi = std::size(kLevelCounts);
    while (lo < hi && kLevelCounts[lo] < min_levels) ++lo;
    std::optional<LevelFit> found;
    const LevelFitter fitter(h);
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      LevelFit fit = fitter.Fit(kLevelCounts[mid]);
      if (spec_.preserve_energy) fitter.PreserveEnergy(&fit);
      if (fit.error <= room) {
        found = std::move(fit);
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    std::optional<GridFit> uniform = allow_uniform ? UniformFit(fitter, room, min_levels) : std::nullopt;
    if (!found && !uniform) return std::nullopt;
    const double lloyd_bits = found ? EstimatedBits(cut, *found) + LevelBits(*found, std::nullopt) : kInf;
    const double uniform_bits =
        uniform ? EstimatedBits(cut, uniform->fit) + LevelBits(uniform->fit, uniform->grid) : kInf;
    const bool grid = uniform_bits < lloyd_bits;
    p.est_bits = grid ? uniform_bits : lloyd_bits;
    p.levels = std::move(grid ? uniform->fit.levels : found->levels);
    if (grid) p.grid = uniform->grid;
    return p;
  }

  // The symbols' and escapes' bits (the levels' are LevelBits).
  double EstimatedBits(const Cut& cut, const LevelFit& fit) const {
    std::vector<uint64_t> counts = fit.counts;
    uint64_t unchanged = cut.pruned;  // the predictor's symbol (AssignElements)
    const unsigned zero = UnchangedLevel(spec_.domain, fit.levels);
    if (zero != UINT_MAX) unchanged += std::exchange(counts[zero], 0);
    counts.push_back(unchanged);
    counts.push_back(cut.escaped + forced_);
    const double elem_bits = 8.0 * DTypeSize(spec_.dtype);
    return EntropyBits(counts) + static_cast<double>(cut.escaped + forced_) * elem_bits;
  }

  // The coarsest uniform quantizer (FitUniform) whose estimated error fits
  // `room`, with at least `min_levels` and at most kMaxLevels levels. Its
  // step is found by bisection, so its error lands near the room, where the
  // fewest Lloyd levels from kLevelCounts fall short of it by up to a step
  // of that list. None in the log domain, whose levels are stored as whole
  // steps, nor where the energy is to be kept (Adam's m): a coarse grid
  // inflates it (1.23x on a Gaussian at 0.5), which would amplify the
  // momentum at every restore as shrinking it damps it, and levels moved
  // to keep it are no longer a uniform grid.
  std::optional<GridFit> UniformFit(const LevelFitter& fitter, double room, unsigned min_levels) const {
    const double span = fitter.Span();
    if (spec_.domain != Domain::kValue || spec_.preserve_energy || !(span > 0) || !std::isfinite(span))
      return std::nullopt;
    // Steps are f32, as the blob stores them.
    const auto fits = [&](double step, LevelFit* out) {
      const float f = static_cast<float>(step);
      if (!(f > 0) || !std::isfinite(f)) return false;
      LevelFit fit = fitter.FitUniform(f);
      if (fit.levels.empty() || fit.error > room) return false;
      *out = std::move(fit);
      return true;
    };
    double fine = span * kUniformFinest, coarse = span;
    LevelFit best;
    if (!fits(fine, &best)) return std::nullopt;
    for (int i = 0; i < kUniformBisections; ++i) {
      const double mid = std::sqrt(fine * coarse);
      LevelFit fit;
      if (fits(mid, &fit)) {
        fine = mid;
        best = std::move(fit);
      } else {
        coarse = mid;
      }
    }
    return Consecutive(best, static_cast<float>(fine), min_levels);
  }

  // FitUniform keeps the occupied multiples only; the blob stores a grid
  // as every multiple from the lowest to the highest (the empty ones cost
  // the symbols nothing).
  static std::optional<GridFit> Consecutive(const LevelFit& fit, float step, unsigned min_levels) {
    const double lo = std::round(fit.levels.front() / step), hi = std::round(fit.levels.back() / step);
    const double limit = static_cast<double>(piece::kMaxGridMultiple);
    if (!(std::abs(lo) <= limit && std::abs(hi) <= limit)) return std::nullopt;
    const int64_t first = static_cast<int64_t>(lo);
    const uint64_t k = static_cast<uint64_t>(static_cast<int64_t>(hi) - first) + 1;
    if (k > kMaxLevels || k < min_levels) return std::nullopt;
    GridFit g{{}, UniformGrid{step, first}};
    g.fit.error = fit.error;
    g.fit.counts.assign(k, 0);
    for (unsigned i = 0; i < k; ++i) g.fit.levels.push_back(piece::GridLevel(g.grid, i));
    for (size_t i = 0; i < fit.levels.size(); ++i)
      g.fit.counts[static_cast<size_t>(std::llround(fit.levels[i] / step) - first)] += fit.counts[i];
    return g;
  }

  static constexpr uint8_t kNoInterval = 0xFF;

  const PieceSpec& spec_;
  const Analysis& a_;
  std::span<const uint32_t> qclass_;
  std::vector<uint64_t> count_;
  std::vector<double> sum_;
  double total_ = 0;
  uint64_t forced_ = 0;
  std::vector<Cut> cuts_;
  std::vector<uint32_t> bounds_;          // class boundaries of the intervals, ascending
  std::vector<ResidualHistogram> hists_;  // one per interval
};

StoredLevels StoreLevels(const PieceSpec& spec, std::span<const double> levels,
                         const std::optional<UniformGrid>& grid) {
  StoredLevels s;
  s.grid = grid;
  const double per_unit = std::ldexp(1.0, static_cast<int>(MantissaBits(spec.dtype)));
  for (double l : levels) {
    if (spec.domain == Domain::kValue) {
      s.value.push_back(static_cast<float>(l));
    } else {
      s.steps.push_back(std::llround(l * per_unit));
    }
  }
  return s;
}

struct Coded {
  std::span<uint8_t> symbols;   // in the PieceScratch
  std::span<uint32_t> escapes;  // element bits, in the PieceScratch
  PieceOutcome outcome;
};

// What AssignElements returns besides the symbols and the reconstruction.
struct Assigned {
  uint64_t pruned = 0, escaped = 0;
  double error_sum = 0;  // the error measure's numerator (when measured)
  bool lost_non_finite = false;
};

// Assign's per-element loop, one instance per element type and domain so
// that loads, stores and the reconstruction inline without branching on
// them. kMeasure: add up the error's numerator while the elements are at
// hand (MeasureError's terms in the same order; its denominator is the
// analysis's energy). Escapes go to a span, not a vector: with no call in
// the loop, its sums stay in registers.
template <DType T, Domain D, bool kMeasure>
Assigned AssignElements(const PieceInput& in, const Analysis& a, std::span<const uint32_t> qclass, const Plan& p,
                        const StoredLevels& lv, const LevelLookup& nearest_level, std::span<const uint16_t> nearest,
                        std::span<uint8_t> recon, Coded* c) {
  const unsigned k = static_cast<unsigned>(p.levels.size());
  const uint8_t* xs = in.x.data();
  const uint8_t* base = a.against_base ? in.base.data() : nullptr;
  const float* weight = in.weight.empty() ? nullptr : in.weight.data();
  const double unit = std::ldexp(1.0, -static_cast<int>(MantissaBits(T)));
  const unsigned zero_level = UnchangedLevel(D, p.levels);
  const uint32_t prune_below = p.prune_below, escape_from = p.escape_from;
  const bool any_levels = k > 0;
  uint8_t* const symbols = c->symbols.data();
  uint32_t* const escapes = c->escapes.data();
  uint64_t pruned = 0, escaped = 0;
  double num = 0;
  bool lost_non_finite = false;
  for (size_t i = 0; i < a.n; ++i) {
    const uint32_t x = LoadBits(T, xs, i);
    const uint32_t pred = base != nullptr ? LoadBits(T, base, i) : 0;
    const uint32_t qc = qclass[i];
    unsigned sym;
    if (qc != kForced && qc < prune_below) {
      sym = 0;
      ++pruned;
    } else if (qc == kForced || qc >= escape_from || !any_levels) {
      sym = k + 1;
    } else {
      const unsigned j = static_cast<unsigned>(nearest.empty() ? nearest_level(a.r[i]) : nearest[i]);
      // A level at exactly zero reconstructs the predictor: the predictor's
      // own symbol says the same, so the two share one probability.
      sym = j == zero_level ? 0 : 1 + j;
    }
    uint32_t out = sym == k + 1 ? x : Reconstruct(T, D, pred, sym, lv);
    // A level can push a value past the largest finite one: keep it exact.
    if (sym != k + 1 && D == Domain::kValue && !std::isfinite(BitsToFloat(T, out))) sym = k + 1;
    if (sym == k + 1) {
      out = x;
      escapes[escaped++] = x;
    }
    symbols[i] = static_cast<uint8_t>(sym);
    StoreBits(T, recon.data(), i, out);
    if constexpr (!kMeasure) continue;
    if constexpr (D == Domain::kLogBits) {
      const double d = (static_cast<double>(out) - static_cast<double>(x)) * unit;
      num += d * d;
    } else {
      if (x == out) continue;
      const double xv = BitsToFloat(T, x);
      if (!std::isfinite(xv)) {
        lost_non_finite = true;
        continue;
      }
      const double w = weight == nullptr ? 1.0 : weight[i];
      const double rv = BitsToFloat(T, out);
      num += w * (rv - xv) * (rv - xv);
    }
  }
  return Assigned{pruned, escaped, num, lost_non_finite};
}

template <Domain D, bool kMeasure>
Assigned AssignIn(DType t, const PieceInput& in, const Analysis& a, std::span<const uint32_t> qclass, const Plan& p,
                  const StoredLevels& lv, const LevelLookup& nearest_level, std::span<const uint16_t> nearest,
                  std::span<uint8_t> recon, Coded* c) {
  switch (t) {
    case DType::kF32:
      return AssignElements<DType::kF32, D, kMeasure>(in, a, qclass, p, lv, nearest_level, nearest, recon, c);
    case DType::kF16:
      return AssignElements<DType::kF16, D, kMeasure>(in, a, qclass, p, lv, nearest_level, nearest, recon, c);
    default:
      return AssignElements<DType::kBF16, D, kMeasure>(in, a, qclass, p, lv, nearest_level, nearest, recon, c);
  }
}

template <bool kMeasure>
Assigned AssignAll(const PieceSpec& spec, const PieceInput& in, const Analysis& a, std::span<const uint32_t> qclass,
                   const Plan& p, const StoredLevels& lv, const LevelLookup& nearest_level,
                   std::span<const uint16_t> nearest, std::span<uint8_t> recon, Coded* c) {
  return spec.domain == Domain::kValue
             ? AssignIn<Domain::kValue, kMeasure>(spec.dtype, in, a, qclass, p, lv, nearest_level, nearest, recon, c)
             : AssignIn<Domain::kLogBits, kMeasure>(spec.dtype, in, a, qclass, p, lv, nearest_level, nearest, recon, c);
}

// The error MeasureError would give, from AssignElements' numerator and
// the analysis's energy.
double ErrorOf(const Assigned& s, double energy) {
  if (s.lost_non_finite) return kInf;
  if (s.error_sum == 0) return 0;
  return energy > 0 ? std::sqrt(s.error_sum / energy) : kInf;
}

// measure: whether to measure the reconstruction's error (outcome.error);
// coding again as chosen takes the error measured the first time.
Coded Assign(const PieceSpec& spec, const PieceInput& in, const Analysis& a, std::span<const uint32_t> qclass,
             const Plan& p, const StoredLevels& lv, std::span<uint8_t> recon, PieceScratch& scratch, bool measure) {
  Coded c;
  c.symbols = ScratchSpan(scratch.symbols, a.n);
  if (scratch.escapes_room < a.n) {
    scratch.escapes.reset(new uint32_t[a.n]);
    scratch.escapes_room = a.n;
  }
  c.escapes = {scratch.escapes.get(), a.n};
  const std::vector<double> bounds = LevelBounds(p.levels);
  const LevelLookup nearest_level(bounds);
  const unsigned k = static_cast<unsigned>(p.levels.size());
  // Nearest levels of every element in one device pass, when there is one.
  std::vector<uint16_t> nearest;
  if (k > 1 && OffloadElements(in.device, a.n)) {
    nearest.resize(a.n);
    if (!in.device->NearestLevels({a.r, bounds, nearest}).ok()) nearest.clear();
  }
  const Assigned s = measure ? AssignAll<true>(spec, in, a, qclass, p, lv, nearest_level, nearest, recon, &c)
                             : AssignAll<false>(spec, in, a, qclass, p, lv, nearest_level, nearest, recon, &c);
  c.escapes = c.escapes.first(s.escaped);
  c.outcome.pruned = s.pruned;
  c.outcome.escaped = s.escaped;
  if (measure) c.outcome.error = ErrorOf(s, a.energy);
  c.outcome.levels = k;
  c.outcome.against_base = a.against_base;
  return c;
}

void WriteBlob(const PieceSpec& spec, const Analysis& a, const StoredLevels& lv, const Coded& c,
               std::vector<uint8_t>* out) {
  PutByte(out, kPieceVersion);
  PutByte(out, static_cast<uint8_t>(spec.dtype));
  PutByte(out, static_cast<uint8_t>(spec.domain));
  PutByte(out, static_cast<uint8_t>((a.against_base ? kFlagAgainstBase : 0) | (lv.grid ? kFlagUniformGrid : 0)));
  PutVarint(out, a.n);
  const size_t k = spec.domain == Domain::kValue ? lv.value.size() : lv.steps.size();
  PutByte(out, static_cast<uint8_t>(k));
  if (lv.grid) {
    PutU32(out, std::bit_cast<uint32_t>(lv.grid->step));
    PutVarint(out, ZigZag(lv.grid->first));
  } else {
    for (size_t i = 0; i < k; ++i) {
      if (spec.domain == Domain::kValue) {
        PutU32(out, std::bit_cast<uint32_t>(lv.value[i]));
      } else {
        PutVarint(out, ZigZag(lv.steps[i]));
      }
    }
  }
  PutVarint(out, c.escapes.size());
  std::vector<uint8_t> rans;
  lossless::RansEncodeCompact(c.symbols, &rans);
  PutVarint(out, rans.size());
  out->insert(out->end(), rans.begin(), rans.end());
  const size_t es = DTypeSize(spec.dtype);
  const size_t at = out->size();
  out->resize(at + es * c.escapes.size());
  for (size_t i = 0; i < c.escapes.size(); ++i) StoreBits(spec.dtype, out->data() + at, i, c.escapes[i]);
}

// Codes a piece as an earlier EncodePiece of the same input chose, without
// searching: the same plan over the same residuals gives the same symbols,
// reconstruction and error.
Result<PieceOutcome> Recode(const PieceSpec& spec, const PieceInput& in, const Analysis& a,
                            std::span<const uint32_t> qclass, const PieceChoice& choice, std::vector<uint8_t>* out,
                            std::span<uint8_t> recon, PieceScratch& scratch) {
  if (choice.exact) return Status::Error(EFBIG, "lossy piece: no configuration meets the error target");
  Plan plan;
  plan.prune_below = choice.prune_below;
  plan.escape_from = choice.escape_from;
  plan.levels = choice.levels;
  plan.grid = choice.grid;
  const StoredLevels lv = StoreLevels(spec, plan.levels, plan.grid);
  Coded c = Assign(spec, in, a, qclass, plan, lv, recon, scratch, /*measure=*/false);
  c.outcome.error = choice.error;
  if (out != nullptr) WriteBlob(spec, a, lv, c, out);
  c.outcome.choice = choice;
  return c.outcome;
}

}  // namespace

double MeasureError(const PieceSpec& spec, std::span<const uint8_t> x, std::span<const uint8_t> recon,
                    std::span<const float> weight) {
  const size_t n = x.size() / DTypeSize(spec.dtype);
  const double unit = std::ldexp(1.0, -static_cast<int>(MantissaBits(spec.dtype)));
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t xb = LoadBits(spec.dtype, x.data(), i), rb = LoadBits(spec.dtype, recon.data(), i);
    if (spec.domain == Domain::kLogBits) {
      const double d = (static_cast<double>(rb) - static_cast<double>(xb)) * unit;
      num += d * d;
      den += 1;
      continue;
    }
    const double xv = BitsToFloat(spec.dtype, xb), rv = BitsToFloat(spec.dtype, rb);
    if (!std::isfinite(xv)) {
      if (xb != rb) return kInf;
      continue;
    }
    const double w = weight.empty() ? 1.0 : weight[i];
    den += w * xv * xv;
    if (xb != rb) num += w * (rv - xv) * (rv - xv);
  }
  if (num == 0) return 0;
  return den > 0 ? std::sqrt(num / den) : kInf;
}

Result<PieceOutcome> EncodePiece(const PieceSpec& spec, const PieceInput& in, std::vector<uint8_t>* out,
                                 std::span<uint8_t> recon) {
  if (!LossyDTypeSupported(spec.dtype)) return Status::InvalidArgument("lossy piece: unsupported element type");
  const size_t es = DTypeSize(spec.dtype);
  if (in.x.size() % es != 0 || recon.size() != in.x.size() || (!in.base.empty() && in.base.size() != in.x.size()) ||
      (!in.weight.empty() && in.weight.size() != in.x.size() / es)) {
    return Status::InvalidArgument("lossy piece: sizes of elements, base, weights and output disagree");
  }
  Analysis a;
  a.n = in.x.size() / es;
  PieceScratch own;
  PieceScratch& scratch = in.scratch != nullptr ? *in.scratch : own;
  a.r = ScratchSpan(scratch.r, a.n), a.w = ScratchSpan(scratch.w, a.n);
  a.must_escape = ScratchSpan(scratch.must_escape, a.n);
  // The analysis writes every element of r, w and must_escape.
  Analyse(spec, in, &a);
  const std::span<uint32_t> qclass = ScratchSpan(scratch.qclass, a.n);
  const bool offload = OffloadElements(in.device, a.n);
  if (in.choice != nullptr || offload) QClasses(a, in.device, qclass);
  if (in.choice != nullptr) return Recode(spec, in, a, qclass, *in.choice, out, recon, scratch);
  const Search search(spec, a, qclass, !offload);
  std::optional<Plan> plan;
  if (search.AllPrunable()) {
    plan = Plan{};
    plan->prune_below = kQClasses;
  }
  unsigned min_levels = 0;
  bool allow_uniform = true;
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (!plan) plan = search.Best(min_levels, allow_uniform);
    if (!plan) break;
    const StoredLevels lv = StoreLevels(spec, plan->levels, plan->grid);
    Coded c = Assign(spec, in, a, qclass, *plan, lv, recon, scratch, /*measure=*/true);
    if (c.outcome.error <= spec.target) {
      if (out != nullptr) WriteBlob(spec, a, lv, c, out);
      c.outcome.choice = PieceChoice{.against_base = a.against_base,
                                     .prune_below = plan->prune_below,
                                     .escape_from = plan->escape_from,
                                     .levels = std::move(plan->levels),
                                     .grid = plan->grid,
                                     .error = c.outcome.error};
      return c.outcome;
    }
    // The histogram fit was optimistic. A uniform grid gives way to the
    // k-means levels as they would have been chosen without it: asking it
    // for twice its levels would ask the k-means fit for as many, far more
    // than it needs (a 4% larger MiniLM fine-tune on the panel). Else ask
    // for more levels.
    if (plan->grid) {
      allow_uniform = false;
    } else {
      min_levels = static_cast<unsigned>(plan->levels.size()) * 2 + 2;
    }
    plan.reset();
  }
  return Status::Error(EFBIG, "lossy piece: no configuration meets the error target");
}

}  // namespace ckptfs::lossy
