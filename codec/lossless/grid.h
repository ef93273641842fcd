// Row/column magnitude predictor for 2-D float tensors (plane transform
// kRotl1Grid). Adam's second moment, and less so its first, factor by row
// and column: an output neuron with large gradients and an input feature
// with large activations scale a whole row and a whole column. The top 16
// bits of a rotated fp32 lane (exponent and 8 mantissa bits) are about
// 256·log2|x|, so a row term plus a column term predicts them, and the
// residual is coded where the exponent and top mantissa planes were. The
// remaining 15 bits are noise that no predictor helps.
//
// Wire form (inside a plane blob, docs/FORMAT.md):
//   varint row_length L (>= 1), varint first_col c0 (< L), u8 fold (0 or 1)
//   rows = ceil((c0 + lanes) / L) row terms, then L column terms; each a
//   zigzag varint delta from the previous term of its kind (first from 0),
//   accumulated modulo 2^32.
// Lane i sits in row r = (c0 + i) / L, column j = (c0 + i) % L, and its
// prediction is P = uint16((row[r] + col[j]) * 8). With F = (top plane << 8)
// | plane below it and D = (F - P) mod 2^16, the stored value is
// (D + 0x8000) mod 2^16, or with fold the zigzag of D read as an int16,
// (D << 1) ^ (D >> 15): a narrow residual (Adam's v) then puts its small
// magnitudes in small low bytes, which order-0 coding of the low plane
// catches; a wide one (m, whose log-magnitude has a long tail) codes better
// biased.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "codec/lossless/byte_io.h"

namespace ckptfs::lossless {

// Where a run of lanes sits in its tensor's row-major matrix.
struct GridHint {
  uint64_t row_length = 0;  // elements per row; 0 = not a matrix
  uint64_t first_col = 0;   // column of the first lane
};

struct GridModel {
  uint64_t row_length = 0;
  uint64_t first_col = 0;
  bool fold = false;
  std::vector<uint32_t> row;  // one per row the lanes touch
  std::vector<uint32_t> col;  // row_length entries
};

// Rows the lanes [0, lanes) touch.
uint64_t GridRows(uint64_t row_length, uint64_t first_col, uint64_t lanes);

// The fit, in two stages: means of F = (hi << 8) | lo over the non-zero
// fields. The hint must have row_length >= 1 and first_col < row_length.
//
// The row step that samples about `sampled_rows` of `rows` rows.
uint64_t GridSampleStep(uint64_t rows, uint64_t sampled_rows);
// Column terms from the rows r with r % row_step == 0, and those rows' terms.
GridModel FitGridSample(std::span<const uint8_t> hi, std::span<const uint8_t> lo, GridHint hint, uint64_t row_step);
// Every row's term, given the column terms.
void FitGridRows(GridModel* m, std::span<const uint8_t> hi, std::span<const uint8_t> lo);
// Both stages over every row.
GridModel FitGrid(std::span<const uint8_t> hi, std::span<const uint8_t> lo, GridHint hint);

// Replaces (hi, lo) by the residual (forward) or restores them (inverse).
void ApplyGrid(const GridModel& m, std::span<uint8_t> hi, std::span<uint8_t> lo, bool forward);

// Order-0 bits per lane of the two planes as they are, and as residuals
// of either form: from every lane of the rows r % row_step == 0 when
// row_step > 1, else from a sample of all lanes.
struct GridEstimate {
  double plain_bits = 0;
  double biased_bits = 0;
  double folded_bits = 0;
};
GridEstimate EstimateGrid(const GridModel& m, std::span<const uint8_t> hi, std::span<const uint8_t> lo,
                          uint64_t row_step = 1);

void PutGrid(const GridModel& m, std::vector<uint8_t>* out);
// Reads a model for `lanes` lanes; malformed or oversized input is Corruption.
Status ReadGrid(ByteReader* r, uint64_t lanes, GridModel* m);

}  // namespace ckptfs::lossless
