#include "codec/lossless/grid.h"

#include <algorithm>
#include <cmath>

#include "codec/lossless/entropy.h"
#include "codec/lossless/grid_format.h"

namespace ckptfs::lossless {
namespace {

using grid::Fold;
using grid::kBias;
using grid::kTermShift;
using grid::Scaled;

// Each row term comes from this many lanes: enough to pin a mean to a small
// share of the residual's spread (the entropy cost is about 0.7/n bit for n
// samples), for a small share of the coding time.
constexpr uint64_t kSamplesPerRow = 256;
// The estimate reads one lane in this many: of all lanes, or of the
// sampled rows.
constexpr uint64_t kEstimateStride = 16;
constexpr uint64_t kEstimateStrideInRows = 4;

inline uint16_t FieldAt(const uint8_t* hi, const uint8_t* lo, size_t i) {
  return static_cast<uint16_t>((hi[i] << 8) | lo[i]);
}

// Lanes of row r: [begin, end) and the column of `begin`.
struct RowSpan {
  uint64_t begin, end, col;
};
RowSpan RowOf(uint64_t r, uint64_t L, uint64_t c0, uint64_t lanes) {
  const uint64_t begin = r == 0 ? 0 : r * L - c0;
  return {begin, std::min(lanes, (r + 1) * L - c0), r == 0 ? c0 : 0};
}

uint32_t Term(double mean) {
  return static_cast<uint32_t>(static_cast<int32_t>(std::lround(mean / (1 << kTermShift))));
}

void PutZigzag(std::vector<uint8_t>* out, uint32_t prev, uint32_t v) {
  const int64_t d = static_cast<int32_t>(v - prev);
  PutVarint(out, (static_cast<uint64_t>(d) << 1) ^ static_cast<uint64_t>(d >> 63));
}

// Mean over the non-zero fields of a row, read `step` lanes apart, of the
// field less its column's term (none when col is null); zeros (untouched
// state) carry no magnitude and would drag it down. `fallback` for a row
// of zeros.
double RowMean(const uint8_t* hi, const uint8_t* lo, const uint16_t* col, const RowSpan& s, uint64_t step,
               double fallback) {
  // 32-bit partial sums vectorise; a block of 2^15 lanes cannot overflow them.
  constexpr uint64_t kBlock = 1u << 15;
  int64_t sum = 0;
  uint64_t count = 0;
  for (uint64_t b = s.begin, jb = s.col; b < s.end; b += kBlock * step, jb += kBlock * step) {
    const uint64_t e = std::min(s.end, b + kBlock * step);
    int32_t part = 0;
    uint32_t n = 0;
    for (uint64_t i = b, j = jb; i < e; i += step, j += step) {
      const uint16_t f = FieldAt(hi, lo, i);
      const int32_t d = col == nullptr ? f : static_cast<int32_t>(f) - static_cast<int16_t>(col[j]);
      part += f ? d : 0;
      n += f != 0;
    }
    sum += part;
    count += n;
  }
  return count ? static_cast<double>(sum) / static_cast<double>(count) : fallback;
}

}  // namespace

uint64_t GridSampleStep(uint64_t rows, uint64_t sampled_rows) {
  return std::max<uint64_t>(1, rows / std::max<uint64_t>(1, sampled_rows));
}

GridModel FitGridSample(std::span<const uint8_t> hi_s, std::span<const uint8_t> lo_s, GridHint hint,
                        uint64_t row_step) {
  GridModel m;
  m.row_length = hint.row_length;
  m.first_col = hint.first_col;
  const uint8_t* hi = hi_s.data();
  const uint8_t* lo = lo_s.data();
  const uint64_t L = hint.row_length, c0 = hint.first_col, n = hi_s.size();
  const uint64_t rows = GridRows(L, c0, n);
  m.row.assign(rows, 0);
  // 32-bit sums vectorise; they hold 2^15 rows of 16-bit differences.
  const uint64_t sampled = (rows + row_step - 1) / row_step;
  if (sampled > (1u << 15)) return FitGridSample(hi_s, lo_s, hint, (rows + (1u << 15) - 1) >> 15);
  std::vector<int32_t> col_sum(L, 0);
  std::vector<uint32_t> col_count(L, 0);
  for (uint64_t r = 0; r < rows; r += row_step) {
    const RowSpan s = RowOf(r, L, c0, n);
    const double mean = RowMean(hi, lo, nullptr, s, 1, 0);
    m.row[r] = Term(mean);
    const int32_t whole = static_cast<int32_t>(std::lround(mean));
    int32_t* sum = col_sum.data() + s.col;
    uint32_t* count = col_count.data() + s.col;
    for (uint64_t i = s.begin, k = 0; i < s.end; ++i, ++k) {
      const uint16_t f = FieldAt(hi, lo, i);
      sum[k] += f ? static_cast<int32_t>(f) - whole : 0;
      count[k] += f != 0;
    }
  }
  m.col.resize(L);
  for (uint64_t j = 0; j < L; ++j) {
    m.col[j] = col_count[j] ? Term(static_cast<double>(col_sum[j]) / col_count[j]) : 0;
  }
  return m;
}

void FitGridRows(GridModel* m, std::span<const uint8_t> hi, std::span<const uint8_t> lo) {
  const uint64_t L = m->row_length, n = hi.size();
  std::vector<uint16_t> col(L);
  for (uint64_t j = 0; j < L; ++j) col[j] = Scaled(m->col[j]);
  const uint64_t step = std::max<uint64_t>(1, L / kSamplesPerRow);
  double prev = 0;
  for (uint64_t r = 0; r < m->row.size(); ++r) {
    prev = RowMean(hi.data(), lo.data(), col.data(), RowOf(r, L, m->first_col, n), step, prev);
    m->row[r] = Term(prev);
  }
}

GridModel FitGrid(std::span<const uint8_t> hi, std::span<const uint8_t> lo, GridHint hint) {
  GridModel m = FitGridSample(hi, lo, hint, 1);
  FitGridRows(&m, hi, lo);
  return m;
}

GridEstimate EstimateGrid(const GridModel& m, std::span<const uint8_t> hi_s, std::span<const uint8_t> lo_s,
                          uint64_t row_step) {
  Histogram plain_hi{}, plain_lo{}, bias_hi{}, bias_lo{}, fold_hi{}, fold_lo{};
  const uint8_t* hi = hi_s.data();
  const uint8_t* lo = lo_s.data();
  const uint64_t L = m.row_length, n = hi_s.size();
  // Walks rows so that no lane needs a division to find its column; the
  // sample position carries over from row to row.
  const uint64_t stride = row_step > 1 ? kEstimateStrideInRows : kEstimateStride;
  uint64_t samples = 0, skip = 0;
  for (uint64_t r = 0; r < m.row.size(); r += row_step) {
    const RowSpan s = RowOf(r, L, m.first_col, n);
    const uint16_t base = Scaled(m.row[r]);
    uint64_t i = s.begin + skip;
    for (; i < s.end; i += stride, ++samples) {
      const uint16_t f = FieldAt(hi, lo, i);
      const uint16_t d = static_cast<uint16_t>(f - static_cast<uint16_t>(base + Scaled(m.col[s.col + i - s.begin])));
      const uint16_t b = static_cast<uint16_t>(d + kBias), z = Fold(d);
      ++plain_hi[f >> 8], ++plain_lo[f & 0xFF];
      ++bias_hi[b >> 8], ++bias_lo[b & 0xFF];
      ++fold_hi[z >> 8], ++fold_lo[z & 0xFF];
    }
    skip = row_step > 1 ? 0 : i - s.end;
  }
  GridEstimate e;
  if (samples == 0) return e;
  const double n_s = static_cast<double>(samples);
  e.plain_bits = (HistogramEntropyBits(plain_hi) + HistogramEntropyBits(plain_lo)) / n_s;
  e.biased_bits = (HistogramEntropyBits(bias_hi) + HistogramEntropyBits(bias_lo)) / n_s;
  e.folded_bits = (HistogramEntropyBits(fold_hi) + HistogramEntropyBits(fold_lo)) / n_s;
  return e;
}

void PutGrid(const GridModel& m, std::vector<uint8_t>* out) {
  PutVarint(out, m.row_length);
  PutVarint(out, m.first_col);
  PutByte(out, m.fold ? 1 : 0);
  uint32_t prev = 0;
  for (uint32_t t : m.row) PutZigzag(out, prev, t), prev = t;
  prev = 0;
  for (uint32_t t : m.col) PutZigzag(out, prev, t), prev = t;
}

}  // namespace ckptfs::lossless
