// Non-uniform quantization levels fitted to a residual distribution:
// weighted 1-D k-means (Lloyd-Max) run on a fine histogram rather than on
// the elements, so that trying many level counts stays cheap. Encoder only:
// the chosen levels are stored in the stream, so the decoder never fits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

namespace ckptfs::lossy {

// Sums over the elements that fell into one bin.
struct Bin {
  double w = 0;    // sum of weights
  double wr = 0;   // sum of weight * value
  double wrr = 0;  // sum of weight * value^2
  uint64_t count = 0;
};

// A histogram in asinh(value / scale) space: fine near zero, where most
// residuals are, and still resolving the tails.
class ResidualHistogram {
 public:
  // `scale` sets where bins turn from linear to logarithmic; `lo`..`hi`
  // must bound every value added.
  ResidualHistogram(double lo, double hi, double scale, size_t bins = 2048);
  void Add(double value, double weight) { AddToBin(BinOf(value), value, weight); }
  size_t BinOf(double value) const {
    const double u = (std::asinh(value / scale_) - ulo_) * inv_width_;
    return u <= 0 ? 0 : std::min(bins_.size() - 1, static_cast<size_t>(u));
  }
  // Width of bin i in value units.
  double BinWidth(size_t i) const { return widths_[i]; }
  void AddToBin(size_t bin, double value, double weight) {
    Bin& b = bins_[bin];
    b.w += weight;
    b.wr += weight * value;
    b.wrr += weight * value * value;
    ++b.count;
    ++count_;
  }
  // Adds another histogram's contents; it must have the same bins (EmptyLike).
  void Merge(const ResidualHistogram& other);
  // Multiplies every sum and count by `f`, as if each element had been
  // added f times (a sample standing for the whole).
  void Scale(double f);
  // Same bins, no contents.
  ResidualHistogram EmptyLike() const {
    ResidualHistogram h = *this;
    h.bins_.assign(bins_.size(), Bin{});
    h.count_ = 0;
    return h;
  }
  const std::vector<Bin>& bins() const { return bins_; }
  uint64_t count() const { return count_; }

 private:
  double scale_, ulo_, inv_width_;
  std::vector<Bin> bins_;
  std::vector<double> widths_;  // computed once: sinh is not cheap
  uint64_t count_ = 0;
};

struct LevelFit {
  std::vector<double> levels;  // ascending
  std::vector<uint64_t> counts;  // elements nearest each level
  double error = 0;              // weighted squared error, estimated from the bins
};

// Fits levels to one histogram for several level counts, preparing the
// occupied bins once.
class LevelFitter {
 public:
  explicit LevelFitter(const ResidualHistogram& h);
  // k levels minimising the weighted squared error of the histogram's values.
  LevelFit Fit(size_t k, int iterations = 16) const;
  // An entropy-coded uniform quantizer: levels at the multiples of `step`
  // that values fall nearest to (the others are left out; zero, where the
  // predictor is, among them). At the same error it needs fewer bits than
  // the same number of Lloyd levels once the indices are entropy-coded
  // (Lloyd places levels for a fixed count, not for the fewest bits).
  // Levels at multiples rather than at their values' means keep the
  // nearest level of every value the multiple it was estimated at, and
  // they do not shrink what they code (they may inflate it).
  // Every occupied multiple is a level, however many: the caller checks the count.
  LevelFit FitUniform(double step) const;
  // The distance between the lowest and the highest value (0 when empty).
  double Span() const { return bins_.empty() ? 0.0 : means_.back() - means_.front(); }
  // Scales fit's levels up (never down) until the values, each at its
  // nearest level, keep their weighted energy (within 1%, at most
  // kEnergyRounds scalings), then recomputes its counts and error.
  void PreserveEnergy(LevelFit* fit) const;

 private:
  static constexpr int kEnergyRounds = 8;
  // One Lloyd step: moves each level to the weighted mean of the bins
  // nearest it; returns the error before the move.
  double Step(std::vector<double>* levels, std::vector<uint64_t>* counts) const;
  // The sums of bins [lo, hi), from the prefix sums.
  Bin RunSums(size_t lo, size_t hi) const;
  // FitUniform by a pass over every bin (means out of order).
  LevelFit FitUniformByBins(double step) const;
  // The weighted energy of the values, each at its nearest level.
  double CodedEnergy(std::span<const double> levels) const;

  std::vector<Bin> bins_;      // the occupied ones, in order
  std::vector<double> means_;  // each bin's weighted mean
  std::vector<double> mass_;   // density^(1/3) share, for the initial levels
  double total_ = 0;
  bool ascending_ = true;    // means_ (bins whose weights are all 0 break it)
  std::vector<Bin> prefix_;  // prefix_[i]: the sums of bins [0, i), when ascending
};

// LevelFitter(h).Fit(k, iterations).
LevelFit FitLevels(const ResidualHistogram& h, size_t k, int iterations = 16);

// Decision thresholds: value v maps to level i where bounds[i-1] <= v < bounds[i].
std::vector<double> LevelBounds(std::span<const double> levels);

// Index of the level nearest `v` (by the bounds). Inline: a call in the
// per-element passes would make them keep their running sums in memory.
inline size_t NearestLevel(std::span<const double> bounds, double v) {
  return static_cast<size_t>(std::upper_bound(bounds.begin(), bounds.end(), v) - bounds.begin());
}

// NearestLevel by table, for passes over every element: a uniform grid
// over the bounds' span gives a first guess, which a short walk over the
// bounds corrects, so the answer is always exactly NearestLevel's.
class LevelLookup {
 public:
  explicit LevelLookup(std::span<const double> bounds);
  size_t operator()(double v) const {
    if (bounds_.size() <= kCountedBounds) {
      // Few levels (most pieces of a delta have 2-4): the bounds at or
      // below v, counted without a branch on v; NearestLevel's binary
      // search mispredicts about every other step.
      size_t i = 0;
      for (double b : bounds_) i += !(v < b);
      return i;
    }
    if (guess_.empty()) return NearestLevel(bounds_, v);
    const double u = (v - lo_) * inv_width_;
    size_t i = u > 0 ? guess_[u < static_cast<double>(guess_.size() - 1) ? static_cast<size_t>(u) : guess_.size() - 1]
                     : guess_[0];
    const size_t n = bounds_.size();
    while (i < n && !(v < bounds_[i])) ++i;
    while (i > 0 && v < bounds_[i - 1]) --i;
    return i;
  }

 private:
  std::vector<double> bounds_;
  double lo_ = 0, inv_width_ = 0;
  std::vector<uint16_t> guess_;  // NearestLevel at each cell's middle
  // Up to this many bounds (ascending, as LevelBounds gives them), their
  // count gives NearestLevel's index: upper_bound's, NaN included.
  static constexpr size_t kCountedBounds = 7;
};

}  // namespace ckptfs::lossy
