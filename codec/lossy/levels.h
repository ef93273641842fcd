// Non-uniform quantization levels fitted to a residual distribution:
// weighted 1-D k-means (Lloyd-Max) run on a fine histogram rather than on
// the elements, so that trying many level counts stays cheap. Encoder only:
// the chosen levels are stored in the stream, so the decoder never fits.
#pragma once

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
  size_t BinOf(double value) const;
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

// k levels minimising the weighted squared error of the histogram's values.
LevelFit FitLevels(const ResidualHistogram& h, size_t k, int iterations = 16);

// Decision thresholds: value v maps to level i where bounds[i-1] <= v < bounds[i].
std::vector<double> LevelBounds(std::span<const double> levels);

// Index of the level nearest `v` (by the bounds).
size_t NearestLevel(std::span<const double> bounds, double v);

}  // namespace ckptfs::lossy
