// The row/column predictor of the lossless plane codec (kRotl1Grid): exact
// round trips wherever a matrix is cut, gains only where rows and columns
// carry magnitude, and clean failures on damaged terms.
#include "codec/lossless/grid.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "codec/formats/layout.h"
#include "codec/lossless/plane_codec.h"
#include "codec/tensor_chunk.h"

namespace ckptfs::lossless {
namespace {

using Bytes = std::vector<uint8_t>;

// Like Adam's second moment: positive, log-magnitude = row term + column
// term + noise of `noise` octaves, with a share of exact zeros.
Bytes SecondMoment(size_t rows, size_t cols, double noise, double zeros, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01(0, 1);
  std::uniform_real_distribution<double> u01(0, 1);
  std::vector<double> row(rows), col(cols);
  for (double& r : row) r = -20 + 4 * n01(rng);
  for (double& c : col) c = 3 * n01(rng);
  std::vector<float> v(rows * cols);
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) {
      v[i * cols + j] = u01(rng) < zeros ? 0.0f : static_cast<float>(std::exp2(row[i] + col[j] + noise * n01(rng)));
    }
  }
  Bytes b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Weights with no row or column structure.
Bytes PlainWeights(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0, 0.02f);
  std::vector<float> v(n);
  for (float& f : v) f = d(rng);
  Bytes b(n * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

Bytes EncodeWith(DType t, std::span<const uint8_t> raw, GridHint hint, EncodeStats* stats = nullptr,
                 PlaneCodecOptions opts = {}) {
  Bytes blob;
  Status s = EncodeTensorBytes(t, raw, hint, opts, &blob, stats);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return blob;
}

void ExpectRoundTrip(std::span<const uint8_t> raw, const Bytes& blob) {
  Bytes back(raw.size(), 0xAA);
  Status s = DecodeTensorBytes(blob, back);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(std::equal(back.begin(), back.end(), raw.begin(), raw.end()));
}

TEST(GridTest, SecondMomentUsesTheGridAndCodesSmaller) {
  const Bytes raw = SecondMoment(512, 256, 0.3, 0.0, 1);
  EncodeStats with, without;
  const Bytes a = EncodeWith(DType::kF32, raw, {256, 0}, &with);
  const Bytes b = EncodeWith(DType::kF32, raw, {}, &without);
  EXPECT_EQ(with.transform, PlaneTransform::kRotl1Grid);
  EXPECT_EQ(without.transform, PlaneTransform::kRotl1Planes);
  // The row and column terms explain most of an 8-octave spread: the two
  // top planes drop from about 12 bits to about 7 per element.
  EXPECT_LT(static_cast<double>(a.size()), 0.88 * static_cast<double>(b.size()));
  ExpectRoundTrip(raw, a);
}

TEST(GridTest, AnyCutOfTheMatrixRoundTrips) {
  const size_t rows = 300, cols = 100;
  const Bytes raw = SecondMoment(rows, cols, 0.5, 0.05, 2);
  // Pieces as chunk boundaries cut them: starting mid-row, ending mid-row.
  for (size_t first : {size_t{0}, size_t{1}, size_t{37}, size_t{99}, size_t{100}, size_t{12345}}) {
    for (size_t count : {size_t{20000}, size_t{9999}, rows * cols - 12345}) {
      if (first + count > rows * cols) continue;
      SCOPED_TRACE("first " + std::to_string(first) + " count " + std::to_string(count));
      std::span<const uint8_t> piece(raw.data() + 4 * first, 4 * count);
      EncodeStats st;
      const Bytes blob = EncodeWith(DType::kF32, piece, {cols, first % cols}, &st);
      EXPECT_EQ(st.transform, PlaneTransform::kRotl1Grid);
      ExpectRoundTrip(piece, blob);
    }
  }
}

TEST(GridTest, ForwardThenInverseIsIdentityForEveryField) {
  // Every 16-bit value of the two planes, in both residual forms and with
  // terms that wrap: the transform is a bijection whatever the model says.
  const size_t n = 1 << 16;
  Bytes hi(n), lo(n);
  for (size_t i = 0; i < n; ++i) hi[i] = static_cast<uint8_t>(i >> 8), lo[i] = static_cast<uint8_t>(i);
  std::mt19937 rng(3);
  for (bool fold : {false, true}) {
    GridModel m;
    m.row_length = 97;
    m.first_col = 41;
    m.fold = fold;
    m.row.resize(GridRows(m.row_length, m.first_col, n));
    m.col.resize(m.row_length);
    for (uint32_t& t : m.row) t = rng();
    for (uint32_t& t : m.col) t = rng();
    Bytes h = hi, l = lo;
    ApplyGrid(m, h, l, true);
    EXPECT_NE(h, hi);
    ApplyGrid(m, h, l, false);
    EXPECT_EQ(h, hi);
    EXPECT_EQ(l, lo);
  }
}

TEST(GridTest, NarrowResidualsFoldWideOnesDoNot) {
  // Fold is chosen by the estimate; both must beat the plain planes here.
  for (double noise : {0.05, 4.0}) {
    const Bytes raw = SecondMoment(400, 128, noise, 0.0, 4);
    Bytes hi(raw.size() / 4), lo(raw.size() / 4);
    for (size_t i = 0; i < hi.size(); ++i) {
      uint32_t x;
      std::memcpy(&x, raw.data() + 4 * i, 4);
      x = (x << 1) | (x >> 31);
      hi[i] = static_cast<uint8_t>(x >> 24), lo[i] = static_cast<uint8_t>(x >> 16);
    }
    GridModel m = FitGrid(hi, lo, {128, 0});
    GridEstimate e = EstimateGrid(m, hi, lo);
    SCOPED_TRACE("noise " + std::to_string(noise));
    if (noise < 1) {
      EXPECT_LT(e.folded_bits, e.biased_bits);
    } else {
      EXPECT_LT(e.biased_bits, e.folded_bits + 0.05);
    }
    EXPECT_LT(std::min(e.folded_bits, e.biased_bits), e.plain_bits);
  }
}

TEST(GridTest, NotUsedWhereItCannotPay) {
  struct Case {
    const char* what;
    DType t;
    Bytes raw;
    GridHint hint;
  };
  const Bytes v = SecondMoment(256, 256, 0.3, 0, 5);
  Bytes v16(v.size() / 2);  // the same bytes read as bf16: no grid for 16-bit types
  std::memcpy(v16.data(), v.data(), v16.size());
  const Case cases[] = {
      {"unstructured weights", DType::kF32, PlainWeights(65536, 6), {256, 0}},
      {"no hint", DType::kF32, v, {}},
      {"rows too short", DType::kF32, v, {8, 0}},
      {"too few rows", DType::kF32, v, {65536 / 4, 0}},
      {"first column past the row", DType::kF32, v, {256, 256}},
      {"bf16", DType::kBF16, v16, {256, 0}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EncodeStats st;
    const Bytes blob = EncodeWith(c.t, c.raw, c.hint, &st);
    EXPECT_NE(st.transform, PlaneTransform::kRotl1Grid);
    ExpectRoundTrip(c.raw, blob);
  }
  PlaneCodecOptions off;
  off.allow_grid = false;
  EncodeStats st;
  EncodeWith(DType::kF32, v, {256, 0}, &st, off);
  EXPECT_NE(st.transform, PlaneTransform::kRotl1Grid);
}

TEST(GridTest, SpecialValuesStayExact) {
  Bytes raw = SecondMoment(128, 64, 0.3, 0.1, 7);
  const float specials[] = {INFINITY, -INFINITY, NAN, -0.0f, 1e-45f, -3.4e38f, 1.0f};
  for (size_t k = 0; k < 7; ++k) std::memcpy(raw.data() + 4 * (k * 997), &specials[k], 4);
  const Bytes blob = EncodeWith(DType::kF32, raw, {64, 0});
  ExpectRoundTrip(raw, blob);
}

TEST(GridTest, DamagedTermsFailCleanly) {
  const Bytes raw = SecondMoment(64, 64, 0.3, 0, 8);
  EncodeStats st;
  const Bytes blob = EncodeWith(DType::kF32, raw, {64, 0}, &st);
  ASSERT_EQ(st.transform, PlaneTransform::kRotl1Grid);
  Bytes out(raw.size());
  for (size_t len = 0; len < blob.size(); ++len) {
    EXPECT_FALSE(DecodeTensorBytes(std::span<const uint8_t>(blob).first(len), out).ok()) << "truncated to " << len;
  }
  // Every byte of the header and terms flipped in turn: a clean error or
  // some output, never a crash (ASan builds check the bounds).
  for (size_t pos = 0; pos < std::min<size_t>(blob.size(), 400); ++pos) {
    for (uint8_t v : {0x00, 0x01, 0x7f, 0x80, 0xff}) {
      Bytes bad = blob;
      bad[pos] = v;
      (void)DecodeTensorBytes(bad, out);
    }
  }
}

TEST(GridTest, ReadGridRejectsImpossibleModels) {
  auto read = [](const Bytes& b, uint64_t lanes) {
    ByteReader r(b);
    GridModel m;
    return ReadGrid(&r, lanes, &m);
  };
  EXPECT_FALSE(read({0, 0, 0}, 10).ok());                             // row length 0
  EXPECT_FALSE(read({4, 4, 0, 0, 0, 0, 0, 0, 0, 0}, 10).ok());        // first column == row length
  EXPECT_FALSE(read({4, 0, 2, 0, 0, 0, 0, 0, 0}, 10).ok());           // fold byte 2
  EXPECT_FALSE(read({4, 0, 0, 0, 0}, 10).ok());                       // 3 rows + 4 columns need 7 terms
  EXPECT_FALSE(read({0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0}, 10).ok());  // row length beyond the blob
  Bytes huge = {1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};         // a delta wider than 32 bits
  EXPECT_FALSE(read(huge, 1).ok());
  Bytes good = {4, 1, 1, 2, 3, 4, 5, 6, 7};  // 2 row terms, 4 column terms for 5 lanes from column 1
  EXPECT_TRUE(read(good, 5).ok());
}

// ---- where the hint comes from -----------------------------------------------

TEST(GridHintTest, RangesCarryRowLengthFromTheShape) {
  FileLayout l;
  l.tensors.push_back({"w", DType::kF32, {64, 3, 3, 32}, 0, 64 * 288 * 4, "", 0});
  l.tensors.push_back({"flat", DType::kF32, {20000}, 100000, 80000, "", 0});
  l.tensors.push_back({"lying", DType::kF32, {100, 100}, 200000, 80000, "", 0});  // shape disagrees with length
  l.tensors.push_back({"one row", DType::kF32, {1, 20000}, 300000, 80000, "", 0});
  std::vector<TensorRange> r = TensorRangesOf(l);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].row_length, 288u);
  EXPECT_EQ(r[1].row_length, 0u);
  EXPECT_EQ(r[2].row_length, 0u);
  EXPECT_EQ(r[3].row_length, 0u);
}

TEST(GridHintTest, PiecesKnowTheirFirstColumn) {
  // A 1000-column f32 matrix starting 10 bytes before the chunk: the piece
  // starts at the next whole element, element 3, column 3.
  const uint64_t off = 1 << 20;
  std::vector<TensorRange> r = {{off - 10, 4 * 1000 * 50, DType::kF32, 1000}};
  std::vector<ChunkPiece> p = CutChunk(off, 65536, r);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[1].row_length, 1000u);
  EXPECT_EQ(p[1].first_col, 3u);
  // A chunk far into the matrix.
  const uint64_t later = off - 10 + 4 * 2500;  // element 2500: column 500
  p = CutChunk(later, 65536, r);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].first_col, 500u);
}

TEST(GridHintTest, ChunkWithZeroRunsRoundTripsThroughTheGrid) {
  // Untouched rows of an optimizer state: long zero runs cut the piece, and
  // each part must keep its own column.
  const size_t rows = 2048, cols = 256;
  Bytes raw = SecondMoment(rows, cols, 0.3, 0.0, 9);
  std::fill(raw.begin() + 4 * (cols * 300 + 17), raw.begin() + 4 * (cols * 500 + 5), 0);
  const std::vector<TensorRange> ranges = {{0, raw.size(), DType::kF32, cols}};
  Bytes with, without;
  ASSERT_TRUE(EncodeTensorChunk(raw, 0, ranges, {}, &with).ok());
  std::vector<TensorRange> flat = ranges;
  flat[0].row_length = 0;
  ASSERT_TRUE(EncodeTensorChunk(raw, 0, flat, {}, &without).ok());
  EXPECT_LT(with.size(), without.size());
  Bytes back(raw.size());
  ASSERT_TRUE(DecodeTensorChunk(with, back).ok());
  EXPECT_EQ(back, raw);
}

}  // namespace
}  // namespace ckptfs::lossless
