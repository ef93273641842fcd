#include "codec/lossy/levels.h"

#include <algorithm>
#include <cstdint>
#include <cmath>

namespace ckptfs::lossy {

ResidualHistogram::ResidualHistogram(double lo, double hi, double scale, size_t bins)
    : scale_(scale > 0 ? scale : 1.0), bins_(std::max<size_t>(bins, 1)) {
  ulo_ = std::asinh(lo / scale_);
  const double uhi = std::asinh(hi / scale_);
  inv_width_ = uhi > ulo_ ? static_cast<double>(bins_.size()) / (uhi - ulo_) : 0.0;
  widths_.assign(bins_.size(), 1.0);
  if (inv_width_ <= 0) return;
  double prev = scale_ * std::sinh(ulo_);
  for (size_t i = 0; i < bins_.size(); ++i) {
    const double next = scale_ * std::sinh(ulo_ + static_cast<double>(i + 1) / inv_width_);
    widths_[i] = next - prev;
    prev = next;
  }
}

void ResidualHistogram::Scale(double f) {
  count_ = 0;
  for (Bin& b : bins_) {
    if (b.count == 0) continue;
    b.w *= f, b.wr *= f, b.wrr *= f;
    b.count = std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(static_cast<double>(b.count) * f)));
    count_ += b.count;
  }
}

void ResidualHistogram::Merge(const ResidualHistogram& other) {
  for (size_t i = 0; i < bins_.size() && i < other.bins_.size(); ++i) {
    const Bin& o = other.bins_[i];
    if (o.count == 0) continue;
    Bin& b = bins_[i];
    b.w += o.w, b.wr += o.wr, b.wrr += o.wrr, b.count += o.count;
  }
  count_ += other.count_;
}

namespace {

// A bin's representative value: its weighted mean (or the plain mean of a
// bin whose elements all weigh zero).
double BinValue(const Bin& b, double fallback) { return b.w > 0 ? b.wr / b.w : fallback; }

// Levels at equal shares of density^(1/3): where Lloyd-Max levels end up
// for many levels (Panter-Dite), so the tails get their share from the
// start instead of after many slow iterations. `mass` is each bin's share.
std::vector<double> InitialLevels(const std::vector<Bin>& bins, const std::vector<double>& mass, double total,
                                  size_t k) {
  std::vector<double> levels;
  double acc = 0, wsum = 0, wrsum = 0;
  size_t next = 1;
  for (size_t i = 0; i < bins.size(); ++i) {
    acc += mass[i], wsum += bins[i].w, wrsum += bins[i].wr;
    if (acc >= total * static_cast<double>(next) / static_cast<double>(k) && wsum > 0) {
      levels.push_back(wrsum / wsum);
      wsum = wrsum = 0;
      while (acc >= total * static_cast<double>(next) / static_cast<double>(k)) ++next;
    }
  }
  if (wsum > 0) levels.push_back(wrsum / wsum);
  std::sort(levels.begin(), levels.end());
  levels.erase(std::unique(levels.begin(), levels.end()), levels.end());
  return levels;
}

// The weighted squared error of the values summed in `s`, all at level c.
double ErrorAt(const Bin& s, double c) { return s.wrr - 2 * c * s.wr + c * c * s.w; }

// The end of a Lloyd step, given each level's sums: the counts and error of
// the levels as they are, then each level moved to its values' mean.
double MoveLevels(std::span<const Bin> sums, std::vector<double>* levels, std::vector<uint64_t>* counts) {
  counts->assign(levels->size(), 0);
  double err = 0;
  for (size_t i = 0; i < levels->size(); ++i) {
    (*counts)[i] = sums[i].count;
    err += ErrorAt(sums[i], (*levels)[i]);
    if (sums[i].w > 0) (*levels)[i] = sums[i].wr / sums[i].w;
  }
  std::sort(levels->begin(), levels->end());
  return std::max(0.0, err);
}

// One Lloyd step by a pass over every bin; returns the estimated error.
double LloydStep(const std::vector<Bin>& bins, const std::vector<double>& means, std::vector<double>* levels,
                 std::vector<uint64_t>* counts) {
  const std::vector<double> bounds = LevelBounds(*levels);
  std::vector<Bin> sums(levels->size());
  // The sums of the current level stay in registers while consecutive
  // bins fall to it (they mostly do: the means ascend), and go back to the
  // array when the level changes. The additions and their order are the
  // same as adding into the array bin by bin.
  size_t j = 0;
  double sw = 0, swr = 0, swrr = 0;
  uint64_t sc = 0;
  for (size_t bi = 0; bi < bins.size(); ++bi) {
    const Bin& b = bins[bi];
    const double v = means[bi];
    size_t nj = j;
    while (nj + 1 < levels->size() && v >= bounds[nj]) ++nj;
    while (nj > 0 && v < bounds[nj - 1]) --nj;
    if (nj != j) {
      sums[j] = Bin{sw, swr, swrr, sc};
      j = nj;
      sw = sums[j].w, swr = sums[j].wr, swrr = sums[j].wrr, sc = sums[j].count;
    }
    sw += b.w, swr += b.wr, swrr += b.wrr;
    sc += b.count;
  }
  if (!levels->empty()) sums[j] = Bin{sw, swr, swrr, sc};
  return MoveLevels(sums, levels, counts);
}

}  // namespace

LevelFitter::LevelFitter(const ResidualHistogram& h) {
  // Only occupied bins matter; Lloyd steps then run over far fewer.
  for (size_t i = 0; i < h.bins().size(); ++i) {
    const Bin& b = h.bins()[i];
    if (b.count == 0) continue;
    bins_.push_back(b);
    means_.push_back(BinValue(b, 0));
    const double w = std::max(h.BinWidth(i), 1e-300);
    mass_.push_back(std::cbrt(std::max(b.w, 0.0) / w) * w + 1e-300);
    total_ += mass_.back();
  }
  ascending_ = std::is_sorted(means_.begin(), means_.end());
  if (!ascending_) return;
  prefix_.assign(bins_.size() + 1, Bin{});
  for (size_t i = 0; i < bins_.size(); ++i) {
    const Bin& b = bins_[i];
    Bin& p = prefix_[i + 1];
    p = prefix_[i];
    p.w += b.w, p.wr += b.wr, p.wrr += b.wrr, p.count += b.count;
  }
}

Bin LevelFitter::RunSums(size_t lo, size_t hi) const {
  const Bin &a = prefix_[lo], &b = prefix_[hi];
  return Bin{b.w - a.w, b.wr - a.wr, b.wrr - a.wrr, b.count - a.count};
}

double LevelFitter::Step(std::vector<double>* levels, std::vector<uint64_t>* counts) const {
  if (!ascending_) return LloydStep(bins_, means_, levels, counts);
  // Each level takes a run of bins (the means ascend): its sums are two
  // prefix sums apart, and its run ends where a binary search finds the
  // next bound, so a step costs a search per level, not a pass over the bins.
  const std::vector<double> bounds = LevelBounds(*levels);
  const size_t k = levels->size();
  std::vector<Bin> sums(k);
  size_t lo = 0;
  for (size_t j = 0; j < k; ++j) {
    const auto from = means_.begin() + static_cast<std::ptrdiff_t>(lo);
    const size_t hi = j + 1 < k ? static_cast<size_t>(std::lower_bound(from, means_.end(), bounds[j]) - means_.begin())
                                : means_.size();
    sums[j] = RunSums(lo, hi);
    lo = hi;
  }
  return MoveLevels(sums, levels, counts);
}

LevelFit LevelFitter::Fit(size_t k, int iterations) const {
  LevelFit fit;
  fit.levels = InitialLevels(bins_, mass_, total_, std::max<size_t>(k, 1));
  if (fit.levels.empty()) return fit;
  double prev = -1;
  for (int it = 0; it < iterations; ++it) {
    fit.error = Step(&fit.levels, &fit.counts);
    if (prev >= 0 && prev - fit.error <= 1e-4 * prev) break;
    prev = fit.error;
  }
  // The counts and error of the final levels.
  std::vector<double> final_levels = fit.levels;
  fit.error = Step(&final_levels, &fit.counts);
  return fit;
}

LevelFit LevelFitter::FitUniform(double step) const {
  LevelFit fit;
  if (bins_.empty() || !(step > 0)) return fit;
  if (!(std::max(std::abs(means_.front()), std::abs(means_.back())) / step < 0x1p52)) return fit;
  if (!ascending_) return FitUniformByBins(step);
  // Each multiple takes a run of bins: its end is found by galloping from
  // its start (a probe per bin for runs of one, as a pass would make; far
  // fewer for long runs), its sums are two prefix sums apart.
  const size_t n = means_.size();
  const auto multiple = [&](size_t i) { return std::llround(means_[i] / step); };
  int64_t j = multiple(0);
  for (size_t lo = 0; lo < n;) {
    size_t in = lo, out = n;  // multiple(in) == j; out: n, or a bin past the run
    int64_t next = j;
    for (size_t gap = 1; in + gap < n; gap *= 2) {
      next = multiple(in + gap);
      if (next != j) {
        out = in + gap;
        break;
      }
      in += gap;
    }
    while (out - in > 1) {
      const size_t mid = in + (out - in) / 2;
      const int64_t m = multiple(mid);
      if (m == j) {
        in = mid;
      } else {
        out = mid, next = m;
      }
    }
    const Bin run = RunSums(lo, out);
    const double c = static_cast<double>(j) * step;
    fit.error += ErrorAt(run, c);
    fit.levels.push_back(c);
    fit.counts.push_back(run.count);
    lo = out, j = next;
  }
  fit.error = std::max(0.0, fit.error);
  return fit;
}

LevelFit LevelFitter::FitUniformByBins(double step) const {
  LevelFit fit;
  // Each bin's multiple is the last one or a new one (equal multiples are
  // adjacent where the means ascend; elsewhere this may repeat a level).
  int64_t last = 0;
  for (size_t bi = 0; bi < bins_.size(); ++bi) {
    const int64_t j = std::llround(means_[bi] / step);
    const double c = static_cast<double>(j) * step;
    const Bin& b = bins_[bi];
    fit.error += ErrorAt(b, c);
    if (fit.levels.empty() || j != last) {
      fit.levels.push_back(c);
      fit.counts.push_back(0);
      last = j;
    }
    fit.counts.back() += b.count;
  }
  fit.error = std::max(0.0, fit.error);
  return fit;
}

double LevelFitter::CodedEnergy(std::span<const double> levels) const {
  const std::vector<double> bounds = LevelBounds(levels);
  double out = 0;
  for (size_t bi = 0; bi < bins_.size(); ++bi) {
    const double c = levels[NearestLevel(bounds, means_[bi])];
    out += c * c * bins_[bi].w;
  }
  return out;
}

void LevelFitter::PreserveEnergy(LevelFit* fit) const {
  if (fit->levels.empty()) return;
  double in = 0;
  for (const Bin& b : bins_) in += b.wrr;
  if (!std::isfinite(in)) return;
  // Scaling the levels scales their bounds too, so values near a bound fall
  // to the inner level and one scaling leaves part of the shrinkage: repeat
  // until the coded energy is within 1% of the values' (a few rounds).
  for (int round = 0; round < kEnergyRounds; ++round) {
    const double out = CodedEnergy(fit->levels);
    if (!(out > 0) || !(in > out * 1.01)) break;
    const double g = std::sqrt(in / out);
    for (double& l : fit->levels) l *= g;
  }
  const std::vector<double> bounds = LevelBounds(fit->levels);
  fit->counts.assign(fit->levels.size(), 0);
  double err = 0;
  for (size_t bi = 0; bi < bins_.size(); ++bi) {
    const size_t j = NearestLevel(bounds, means_[bi]);
    const double c = fit->levels[j];
    err += ErrorAt(bins_[bi], c);
    fit->counts[j] += bins_[bi].count;
  }
  fit->error = std::max(0.0, err);
}

LevelFit FitLevels(const ResidualHistogram& h, size_t k, int iterations) { return LevelFitter(h).Fit(k, iterations); }

std::vector<double> LevelBounds(std::span<const double> levels) {
  std::vector<double> b;
  for (size_t i = 1; i < levels.size(); ++i) b.push_back(0.5 * (levels[i - 1] + levels[i]));
  return b;
}

LevelLookup::LevelLookup(std::span<const double> bounds) : bounds_(bounds.begin(), bounds.end()) {
  if (bounds_.size() <= kCountedBounds) return;
  lo_ = bounds_.front();
  const double span = bounds_.back() - lo_;
  if (!(span > 0) || !std::isfinite(span)) return;
  const size_t cells = 8 * bounds_.size();
  inv_width_ = static_cast<double>(cells) / span;
  if (!std::isfinite(inv_width_)) return;
  guess_.resize(cells);
  for (size_t k = 0; k < cells; ++k) {
    guess_[k] = static_cast<uint16_t>(NearestLevel(bounds_, lo_ + (static_cast<double>(k) + 0.5) / inv_width_));
  }
}

}  // namespace ckptfs::lossy
