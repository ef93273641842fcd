// The lossy piece coder (codec/lossy/quantizer_encode.cc, quantizer_decode.cc):
// error targets honoured, reconstruction deterministic and equal to what
// decoding gives, exact where it must be, the blob's versions and grids as
// docs/FORMAT.md writes them, and malformed blobs rejected without crashing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "base/le.h"
#include "codec/cpu_features.h"
#include "codec/lossless/byte_io.h"
#include "codec/lossless/rans.h"
#include "codec/lossy/float_bits.h"
#include "codec/lossy/piece_format.h"
#include "codec/lossy/quantizer.h"
#include "tests/unit/lossy_test_util.h"

namespace ckptfs::lossy {
namespace {

struct Coded {
  std::vector<uint8_t> blob, recon;
  PieceOutcome outcome;
};

Coded Encode(const PieceSpec& spec, const std::vector<uint8_t>& x, const std::vector<uint8_t>& base = {},
             const std::vector<float>& w = {}) {
  Coded c;
  c.recon.resize(x.size());
  Result<PieceOutcome> r = EncodePiece(spec, PieceInput{x, base, w}, &c.blob, c.recon);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (r.ok()) c.outcome = *r;
  return c;
}

// Decoding gives exactly the reconstruction the encoder reported.
void ExpectDecodesToRecon(const Coded& c, const std::vector<uint8_t>& base = {}) {
  std::vector<uint8_t> out(c.recon.size());
  ASSERT_TRUE(DecodePiece(c.blob, base, out).ok());
  EXPECT_EQ(out, c.recon);
}

TEST(LossyPiece, WeightsMeetTheTargetAndCompress) {
  const std::vector<uint8_t> x = Floats(Normal(1 << 16, 0.02f, 1));
  for (double target : {0.01, 0.05, 0.2}) {
    const PieceSpec spec{DType::kF32, Domain::kValue, target};
    Coded c = Encode(spec, x);
    ExpectDecodesToRecon(c);
    EXPECT_LE(MeasureError(spec, x, c.recon), target);
    EXPECT_NEAR(c.outcome.error, MeasureError(spec, x, c.recon), 1e-12);
    EXPECT_LT(c.blob.size(), x.size() / 3) << "target " << target;
  }
}

// Coarse levels at conditional means shrink what they code by about
// 1 - error^2 in energy (m's momentum, in the one-step measure), and a
// coarse uniform grid, which the search may choose without the flag,
// inflates it; preserve_energy scales Lloyd levels out until the energy
// is kept, at a small cost in error, and the target still holds. Tested
// as the coder uses it for m, without pruning. On this Gaussian at 0.5:
// Lloyd levels kept 0.81 of the energy; one scaling kept 0.92 (the scaled
// bounds move out too, so elements near a bound fall to the inner level),
// the repeated scaling 0.99; the uniform grid chosen without the flag 1.23.
TEST(LossyPiece, PreserveEnergyKeepsTheCodedEnergy) {
  const std::vector<float> v = Normal(1 << 15, 1.0f, 21);
  const std::vector<uint8_t> x = Floats(v);
  auto energy = [](const std::vector<uint8_t>& b) {
    double e = 0;
    for (size_t i = 0; i < b.size() / 4; ++i) {
      const double f = BitsToFloat(DType::kF32, LoadBits(DType::kF32, b.data(), i));
      e += f * f;
    }
    return e;
  };
  PieceSpec spec{DType::kF32, Domain::kValue, 0.5};
  spec.prune = false;
  const Coded plain = Encode(spec, x);
  spec.preserve_energy = true;
  const Coded kept = Encode(spec, x);
  ExpectDecodesToRecon(kept);
  EXPECT_LE(MeasureError(spec, x, plain.recon), 0.5);
  EXPECT_LE(MeasureError(spec, x, kept.recon), 0.5);
  const double e = energy(x);
  EXPECT_GT(std::abs(energy(plain.recon) / e - 1.0), 0.1);  // shrunk or inflated
  EXPECT_NEAR(energy(kept.recon) / e, 1.0, 0.02);
}

TEST(LossyPiece, LooserTargetsCostLess) {
  const std::vector<uint8_t> x = Floats(Normal(1 << 15, 1.0f, 2));
  size_t prev = SIZE_MAX;
  for (double target : {0.01, 0.03, 0.1, 0.25}) {
    Coded c = Encode(PieceSpec{DType::kF32, Domain::kValue, target}, x);
    EXPECT_LT(c.blob.size(), prev) << "target " << target;
    prev = c.blob.size();
  }
}

TEST(LossyPiece, UnchangedAgainstTheBaseCostsAlmostNothing) {
  const std::vector<uint8_t> x = Floats(Normal(1 << 16, 0.02f, 3));
  const PieceSpec spec{DType::kF32, Domain::kValue, 0.01};
  Coded c = Encode(spec, x, x);
  EXPECT_TRUE(c.outcome.against_base);
  EXPECT_EQ(c.recon, x);
  EXPECT_LT(c.blob.size(), 64u);
  ExpectDecodesToRecon(c, x);
}

TEST(LossyPiece, ClosedLoopDeltaIsCheaperThanAKeyframe) {
  std::vector<float> w = Normal(1 << 16, 0.02f, 4), step = Normal(1 << 16, 0.0005f, 5), next(w.size());
  for (size_t i = 0; i < w.size(); ++i) next[i] = w[i] + step[i];
  const PieceSpec spec{DType::kF32, Domain::kValue, 0.01};
  Coded key = Encode(spec, Floats(w));
  Coded delta = Encode(spec, Floats(next), key.recon);
  EXPECT_TRUE(delta.outcome.against_base);
  EXPECT_LT(delta.blob.size() * 2, key.blob.size());
  EXPECT_LE(MeasureError(spec, Floats(next), delta.recon), 0.01);
  ExpectDecodesToRecon(delta, key.recon);
  // Without a base the decoder refuses, rather than guessing.
  std::vector<uint8_t> out(delta.recon.size());
  EXPECT_FALSE(DecodePiece(delta.blob, {}, out).ok());
}

// A weight's delta at a tight target is coded on a uniform grid (levels at
// multiples of one step): entropy-coded, the grid costs fewer bits than
// k-means levels at the same error. Without pruning, zero is among the
// levels, and elements there are sent as "unchanged" and decode to their
// base's exact bits; with it, the pruned elements are those.
TEST(LossyPiece, WeightDeltasTakeAUniformGrid) {
  std::vector<float> w = Normal(1 << 16, 0.02f, 31), step = Normal(1 << 16, 0.0005f, 32), next(w.size());
  for (size_t i = 0; i < w.size(); ++i) next[i] = w[i] + step[i];
  const std::vector<uint8_t> base = Floats(w), x = Floats(next);
  for (bool prune : {true, false}) {
    PieceSpec spec{DType::kF32, Domain::kValue, 0.003};
    spec.prune = prune;
    const Coded c = Encode(spec, x, base);
    ASSERT_TRUE(c.outcome.against_base);
    ExpectDecodesToRecon(c, base);
    EXPECT_LE(MeasureError(spec, x, c.recon), 0.003);
    const std::vector<double>& levels = c.outcome.choice.levels;
    ASSERT_GE(levels.size(), 8u);
    // Every multiple of the step from the first level on, as the blob stores them.
    ASSERT_TRUE(c.outcome.choice.grid.has_value());
    const UniformGrid g = *c.outcome.choice.grid;
    for (unsigned i = 0; i < levels.size(); ++i) EXPECT_EQ(levels[i], piece::GridLevel(g, i)) << i;
    EXPECT_EQ(c.blob[3] & piece::kFlagUniformGrid, piece::kFlagUniformGrid);
    // Unpruned, the elements near zero keep the base through the grid's zero.
    if (!prune) {
      EXPECT_NE(std::find(levels.begin(), levels.end(), 0.0), levels.end());
    }
    size_t unchanged = 0;
    for (size_t i = 0; i < x.size(); i += 4) unchanged += std::memcmp(&c.recon[i], &base[i], 4) == 0;
    EXPECT_GT(unchanged, x.size() / 4 / 20) << "prune " << prune;
  }
}

// Piece version 2 differs from version 1 only where the grid flag is set:
// a listed-levels piece written as version 1 still decodes, to the same
// bits. A grid in a version 1 piece, on log-domain levels, or with a step
// or first multiple no encoder writes is corrupt, not a crash.
TEST(LossyPiece, VersionOnePiecesDecodeAndBadGridsAreCorrupt) {
  const std::vector<uint8_t> x = Floats(Normal(1 << 12, 1.0f, 35));
  PieceSpec m{DType::kF32, Domain::kValue, 0.2};
  m.preserve_energy = true;  // k-means levels, listed
  Coded listed = Encode(m, x);
  ASSERT_EQ(listed.blob[0], kPieceVersion);
  ASSERT_EQ(listed.blob[3] & piece::kFlagUniformGrid, 0);
  listed.blob[0] = 1;
  ExpectDecodesToRecon(listed);

  std::vector<float> w = Normal(1 << 12, 0.02f, 36), next(w.size());
  for (size_t i = 0; i < w.size(); ++i) next[i] = w[i] + 0.001f * static_cast<float>(i % 7);
  const std::vector<uint8_t> base = Floats(w);
  const Coded grid = Encode(PieceSpec{DType::kF32, Domain::kValue, 0.01}, Floats(next), base);
  ASSERT_TRUE(grid.outcome.choice.grid.has_value());
  ExpectDecodesToRecon(grid, base);
  const size_t step_at = 4 + 2 + 1;  // version, dtype, domain, flags | varint n (4096: 2 bytes) | K
  auto corrupt = [&](const std::string& what, const std::function<void(std::vector<uint8_t>&)>& edit) {
    std::vector<uint8_t> b = grid.blob, out(x.size());
    edit(b);
    const Status st = DecodePiece(b, base, out);
    EXPECT_EQ(st.code(), Status::Corruption("").code()) << what << ": " << st.ToString();
  };
  corrupt("version 1 with a grid", [](auto& b) { b[0] = 1; });
  corrupt("grid of log-domain levels", [](auto& b) { b[2] = 1; });
  corrupt("zero step", [&](auto& b) { std::fill_n(b.begin() + step_at, 4, 0); });
  corrupt("NaN step", [&](auto& b) { le::Put32(b, step_at, 0x7FC00000u); });
  // The last multiple may reach the limit, not pass it.
  const int64_t k = grid.blob[step_at - 1];
  auto with_first = [&](int64_t first) {
    std::vector<uint8_t> b = grid.blob, far;
    lossless::PutVarint(&far, piece::ZigZag(first));
    size_t len = 1;
    while (b[step_at + 4 + len - 1] & 0x80) ++len;
    b.erase(b.begin() + step_at + 4, b.begin() + step_at + 4 + len);
    b.insert(b.begin() + step_at + 4, far.begin(), far.end());
    return b;
  };
  std::vector<uint8_t> out(x.size());
  EXPECT_TRUE(DecodePiece(with_first(piece::kMaxGridMultiple - (k - 1)), base, out).ok());
  EXPECT_TRUE(DecodePiece(with_first(-piece::kMaxGridMultiple), base, out).ok());
  corrupt("last multiple past the limit", [&](auto& b) { b = with_first(piece::kMaxGridMultiple - (k - 1) + 1); });
  corrupt("first multiple past the limit", [&](auto& b) { b = with_first(-piece::kMaxGridMultiple - 1); });
}

// A piece of no elements (found by fuzz_lossy_chunk: an empty span's
// data() is null, which the all-unchanged fast path must not copy from).
TEST(LossyPiece, EmptyPieceDecodesToNothing) {
  // version, f32, value domain, no flags, n 0, K 0, no escapes, rANS blob of 0 symbols
  const std::vector<uint8_t> blob = {kPieceVersion, 2, 0, 0, 0, 0, 0, 1, 0};
  std::vector<uint8_t> out;
  EXPECT_TRUE(DecodePiece(blob, {}, out).ok());
}

// A version 2 f32 piece in the log domain, against the base, written by
// hand: levels `steps`, `symbols`, escapes `escapes`.
std::vector<uint8_t> LogBitsPiece(const std::vector<int64_t>& steps, const std::vector<uint8_t>& symbols,
                                  const std::vector<uint32_t>& escapes) {
  std::vector<uint8_t> b = {kPieceVersion, 2, 1, piece::kFlagAgainstBase};
  lossless::PutVarint(&b, symbols.size());
  b.push_back(static_cast<uint8_t>(steps.size()));
  for (int64_t s : steps) lossless::PutVarint(&b, piece::ZigZag(s));
  lossless::PutVarint(&b, escapes.size());
  std::vector<uint8_t> rans;
  lossless::RansEncodeCompact(symbols, &rans);
  lossless::PutVarint(&b, rans.size());
  b.insert(b.end(), rans.begin(), rans.end());
  for (uint32_t e : escapes) lossless::PutU32(&b, e);
  return b;
}

// Log-domain pieces decode eight elements at a time where the CPU has
// AVX2: every step is clamped to [0, largest finite] as documented,
// whatever the base's bits (negative floats and NaNs included), escapes
// break the runs, and a step past ±2^32 is corrupt.
TEST(LossyPiece, LogBitsStepsClampLikeTheFormatSays) {
  const std::vector<int64_t> steps = {-5, 7, -(int64_t{1} << 32), int64_t{1} << 32, 1 << 20};
  const uint32_t bases[] = {0, 3, 0x3F800000u, 0x7F7FFFF0u, 0x7F800000u, 0x80000000u, 0xFFFFFFFFu, 0x00012345u};
  for (size_t n : {5u, 8u, 37u, 20000u}) {
    std::vector<uint8_t> base(4 * n), symbols(n);
    std::vector<uint32_t> want(n), escapes;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t p = bases[(i * 7 + i / 8) % std::size(bases)];
      le::Put32(base, 4 * i, p);
      symbols[i] = static_cast<uint8_t>((i * 5 + i / 3) % (steps.size() + 2));
      if (symbols[i] == 0) {
        want[i] = p;
      } else if (symbols[i] <= steps.size()) {
        const int64_t moved = static_cast<int64_t>(p) + steps[symbols[i] - 1];
        want[i] = static_cast<uint32_t>(std::clamp<int64_t>(moved, 0, 0x7F7FFFFF));
      } else {
        want[i] = 0x40000000u + static_cast<uint32_t>(i);
        escapes.push_back(want[i]);
      }
    }
    std::vector<uint8_t> out(4 * n);
    ASSERT_TRUE(DecodePiece(LogBitsPiece(steps, symbols, escapes), base, out).ok()) << n;
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(LoadBits(DType::kF32, out.data(), i), want[i]) << "n " << n << " i " << i;
  }
  std::vector<uint8_t> base(4 * 16), out(4 * 16), symbols(16, 1);
  EXPECT_TRUE(DecodePiece(LogBitsPiece({int64_t{1} << 32}, symbols, {}), base, out).ok());
  const Status past = DecodePiece(LogBitsPiece({(int64_t{1} << 32) + 1}, symbols, {}), base, out);
  EXPECT_EQ(past.code(), Status::Corruption("").code()) << past.ToString();
  const Status below = DecodePiece(LogBitsPiece({-(int64_t{1} << 32) - 1}, symbols, {}), base, out);
  EXPECT_EQ(below.code(), Status::Corruption("").code()) << below.ToString();
}

// The AVX2 rebuild and the portable one decode every kind of f32 piece
// alike: values with and without a base, log-domain bits with escapes.
TEST(LossyPiece, PortableAndVectorRebuildsDecodeAlike) {
  std::vector<float> w = Normal(20011, 0.02f, 41), next = w;
  for (size_t i = 0; i < next.size(); i += 3) next[i] += 0.002f * static_cast<float>(i % 5);
  const std::vector<uint8_t> base = Floats(w);
  std::vector<uint8_t> v_base(4 * 20011), symbols(20011);
  std::vector<uint32_t> escapes;
  for (size_t i = 0; i < symbols.size(); ++i) {
    le::Put32(v_base, 4 * i, 0x3A000000u + static_cast<uint32_t>(i * 977));
    symbols[i] = static_cast<uint8_t>(i % 9 == 0 ? 4 : i % 4);
    if (symbols[i] == 4) escapes.push_back(0x3B000000u + static_cast<uint32_t>(i));
  }
  struct Case {
    std::vector<uint8_t> blob, base;
  };
  const std::vector<Case> cases = {
      {Encode(PieceSpec{DType::kF32, Domain::kValue, 0.05}, Floats(next)).blob, {}},
      {Encode(PieceSpec{DType::kF32, Domain::kValue, 0.05}, Floats(next), base).blob, base},
      {LogBitsPiece({-3, 9, 1 << 20}, symbols, escapes), v_base},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    std::vector<uint8_t> vector_out(4 * 20011), portable_out(4 * 20011);
    ASSERT_TRUE(DecodePiece(cases[c].blob, cases[c].base, vector_out).ok()) << c;
    {
      ScopedPortableLoops portable;
      ASSERT_TRUE(DecodePiece(cases[c].blob, cases[c].base, portable_out).ok()) << c;
    }
    EXPECT_EQ(vector_out, portable_out) << "case " << c;
  }
}

// A checkpoint that moved less than its budget since its base codes every
// element as "keep the base's bits": decoding copies the base (a fast path)
// and still gives exactly the encoder's reconstruction; one tiny move among
// them takes the element loop again, for every element type.
TEST(LossyPiece, UnmovedPiecesDecodeToTheirBase) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    const std::vector<float> w = Normal((1 << 14) + 3, 0.02f, 11);
    const std::vector<uint8_t> base = Floats(w, t);
    const PieceSpec spec{t, Domain::kValue, 0.05};
    Coded same = Encode(spec, base, base);
    EXPECT_TRUE(same.outcome.against_base) << DTypeName(t);
    EXPECT_EQ(same.recon, base) << DTypeName(t);
    ExpectDecodesToRecon(same, base);
    std::vector<float> moved = w;
    moved[7] += 1.0f;  // far beyond the budget: coded, not kept
    Coded one = Encode(spec, Floats(moved, t), base);
    EXPECT_NE(one.recon, base) << DTypeName(t);
    ExpectDecodesToRecon(one, base);
  }
}

// Decoding f32 values goes eight elements at a time where the CPU has
// AVX2, the rest one by one: every length around those steps, a base that
// holds signed zeros, subnormals and values near the largest float, and a
// base and output at odd addresses (a piece starts wherever its tensor
// does in the chunk) decode to the encoder's reconstruction.
TEST(LossyPiece, EveryLengthAndAnyBaseDecodesToTheReconstruction) {
  const PieceSpec spec{DType::kF32, Domain::kValue, 0.05};
  for (size_t n : {1u, 2u, 7u, 8u, 9u, 15u, 16u, 17u, 31u, 33u, 1000u, 4099u}) {
    std::vector<float> base = Normal(n, 0.02f, static_cast<uint32_t>(n));
    for (size_t i = 0; i < n; i += 5) base[i] = (i / 5) % 3 == 0 ? -0.0f : (i / 5) % 3 == 1 ? 1e-40f : 3.0e38f;
    std::vector<float> next = base;
    for (size_t i = 0; i < n; i += 2) next[i] += 0.001f * static_cast<float>(i % 7);
    const std::vector<uint8_t> base_bytes = Floats(base);
    Coded keyframe = Encode(spec, Floats(next));
    ExpectDecodesToRecon(keyframe);
    Coded delta = Encode(spec, Floats(next), base_bytes);
    ExpectDecodesToRecon(delta, base_bytes);
    // The same bytes one byte past an aligned address.
    std::vector<uint8_t> shifted_base(base_bytes.size() + 1), shifted_out(delta.recon.size() + 1);
    std::copy(base_bytes.begin(), base_bytes.end(), shifted_base.begin() + 1);
    const std::span<const uint8_t> odd_base = std::span<const uint8_t>(shifted_base).subspan(1);
    ASSERT_TRUE(DecodePiece(delta.blob, odd_base, std::span<uint8_t>(shifted_out).subspan(1)).ok()) << n;
    EXPECT_TRUE(std::equal(delta.recon.begin(), delta.recon.end(), shifted_out.begin() + 1)) << n;
  }
}

TEST(LossyPiece, SensitivityWeightsDecideWhatIsPruned) {
  const size_t n = 1 << 14;
  const std::vector<float> v = Normal(n, 1.0f, 6);
  std::vector<float> w(n, 1e-6f);
  for (size_t i = 0; i < n; i += 2) w[i] = 1.0f;  // even elements matter
  const std::vector<uint8_t> x = Floats(v);
  const PieceSpec spec{DType::kF32, Domain::kValue, 0.05};
  Coded c = Encode(spec, x, {}, w);
  EXPECT_LE(MeasureError(spec, x, c.recon, w), 0.05);
  double err_even = 0, err_odd = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = BitsToFloat(DType::kF32, LoadBits(DType::kF32, c.recon.data(), i)) - v[i];
    (i % 2 ? err_odd : err_even) += d * d;
  }
  EXPECT_LT(err_even * 10, err_odd);
}

TEST(LossyPiece, SecondMomentsInTheLogDomainKeepZerosAndSigns) {
  std::mt19937 g(7);
  std::exponential_distribution<float> d(1.0f);
  std::vector<float> v(1 << 15);
  for (size_t i = 0; i < v.size(); ++i) v[i] = i % 17 == 0 ? 0.0f : 1e-8f * std::exp(4 * d(g));
  const std::vector<uint8_t> x = Floats(v);
  const PieceSpec spec{DType::kF32, Domain::kLogBits, 0.1};
  Coded c = Encode(spec, x);
  ExpectDecodesToRecon(c);
  EXPECT_LE(MeasureError(spec, x, c.recon), 0.1);
  for (size_t i = 0; i < v.size(); ++i) {
    const float r = BitsToFloat(DType::kF32, LoadBits(DType::kF32, c.recon.data(), i));
    ASSERT_GE(r, 0.0f);
    if (v[i] == 0.0f) {
      ASSERT_EQ(r, 0.0f) << i;
    }
  }
}

// A second moment whose "base" is another array's bytes (weights, half of
// them negative: the predecessor's bytes at this place of an Orbax data
// file whose arrays moved) is coded without it: against it, every element
// over a negative base was an escape at full width, twice a keyframe's size.
// A base of a few such elements among many is still used.
TEST(LossyPiece, ABaseThatWouldEscapeManyElementsIsNotUsed) {
  std::mt19937 g(9);
  std::exponential_distribution<float> d(1.0f);
  std::vector<float> v(1 << 15), near(v.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1e-8f * std::exp(4 * d(g));
  for (size_t i = 0; i < v.size(); ++i) near[i] = v[i] * (i % 1024 == 0 ? -1.0f : 1.001f);
  const std::vector<uint8_t> x = Floats(v), weights = Floats(Normal(v.size(), 0.02f, 10));
  const PieceSpec spec{DType::kF32, Domain::kLogBits, 0.5};
  Coded key = Encode(spec, x);
  Coded wrong = Encode(spec, x, weights);
  EXPECT_FALSE(wrong.outcome.against_base);
  EXPECT_LE(wrong.blob.size(), key.blob.size() + 16);
  EXPECT_LE(MeasureError(spec, x, wrong.recon), 0.5);
  ExpectDecodesToRecon(wrong, weights);
  Coded close = Encode(spec, x, Floats(near));
  EXPECT_TRUE(close.outcome.against_base);
  EXPECT_LT(close.blob.size(), key.blob.size());
  ExpectDecodesToRecon(close, Floats(near));
  // The same in the value domain, for a base of NaNs.
  std::vector<float> nan(v.size(), std::numeric_limits<float>::quiet_NaN());
  Coded value = Encode(PieceSpec{DType::kF32, Domain::kValue, 0.05}, weights, Floats(nan));
  EXPECT_FALSE(value.outcome.against_base);
}

TEST(LossyPiece, NonFiniteValuesStayExact) {
  std::vector<float> v = Normal(8192, 1.0f, 8);
  v[10] = std::numeric_limits<float>::quiet_NaN();
  v[20] = std::numeric_limits<float>::infinity();
  v[30] = -std::numeric_limits<float>::infinity();
  const std::vector<uint8_t> x = Floats(v);
  Coded c = Encode(PieceSpec{DType::kF32, Domain::kValue, 0.05}, x);
  ExpectDecodesToRecon(c);
  for (size_t i : {10u, 20u, 30u}) EXPECT_EQ(LoadBits(DType::kF32, c.recon.data(), i), LoadBits(DType::kF32, x.data(), i));
}

TEST(LossyPiece, HalfAndBfloat16) {
  for (DType t : {DType::kF16, DType::kBF16}) {
    const std::vector<uint8_t> x = Floats(Normal(1 << 15, 0.05f, 9), t);
    const PieceSpec spec{t, Domain::kValue, 0.02};
    Coded c = Encode(spec, x);
    ExpectDecodesToRecon(c);
    EXPECT_LE(MeasureError(spec, x, c.recon), 0.02);
    EXPECT_LT(c.blob.size(), x.size() / 2);
  }
}

// The error the encoder reports (summed while it assigns levels) is
// MeasureError's on its reconstruction, to the bit, for every element type
// and domain, weighted or not, with and without a base.
TEST(LossyPiece, ReportedErrorIsMeasureErrorExactly) {
  const size_t n = 1 << 13;
  std::vector<float> w(n);
  for (size_t i = 0; i < n; ++i) w[i] = 1e-3f + static_cast<float>(i % 7);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<float> v = Normal(n, 0.05f, 21), moved = v;
    for (size_t i = 0; i < n; i += 3) moved[i] += 0.01f;
    v[5] = std::numeric_limits<float>::infinity();
    const std::vector<uint8_t> x = Floats(moved, t), base = Floats(v, t);
    for (const std::vector<uint8_t>* b : {&base, static_cast<const std::vector<uint8_t>*>(nullptr)}) {
      const std::vector<uint8_t> none;
      const PieceSpec value{t, Domain::kValue, 0.05};
      Coded c = Encode(value, x, b != nullptr ? *b : none, w);
      EXPECT_EQ(c.outcome.error, MeasureError(value, x, c.recon, w));
      c = Encode(value, x, b != nullptr ? *b : none);
      EXPECT_EQ(c.outcome.error, MeasureError(value, x, c.recon));
    }
    std::vector<float> sq = Normal(n, 1e-3f, 22);
    for (float& f : sq) f *= f;
    const std::vector<uint8_t> vx = Floats(sq, t);
    const PieceSpec logbits{t, Domain::kLogBits, 0.3};
    const Coded c = Encode(logbits, vx);
    EXPECT_EQ(c.outcome.error, MeasureError(logbits, vx, c.recon));
  }
}

TEST(LossyPiece, DeterministicAcrossRuns) {
  const std::vector<uint8_t> x = Floats(Normal(1 << 15, 0.02f, 10));
  const std::vector<uint8_t> base = Floats(Normal(1 << 15, 0.02f, 11));
  const PieceSpec spec{DType::kF32, Domain::kValue, 0.01};
  Coded a = Encode(spec, x, base), b = Encode(spec, x, base);
  EXPECT_EQ(a.blob, b.blob);
  EXPECT_EQ(a.recon, b.recon);
}

TEST(LossyPiece, ImpossibleTargetAsksForLosslessCoding) {
  const std::vector<uint8_t> x = Floats(Normal(4096, 1.0f, 12));
  std::vector<uint8_t> blob, recon(x.size());
  Result<PieceOutcome> r = EncodePiece(PieceSpec{DType::kF32, Domain::kValue, 0.0}, PieceInput{x, {}, {}}, &blob, recon);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), EFBIG);
}

TEST(LossyPiece, BadArgumentsAreRejected) {
  const std::vector<uint8_t> x = Floats(Normal(4096, 1.0f, 13));
  std::vector<uint8_t> blob, recon(x.size());
  EXPECT_EQ(EncodePiece(PieceSpec{DType::kI32, Domain::kValue, 0.1}, PieceInput{x, {}, {}}, &blob, recon).status().code(),
            EINVAL);
  std::vector<uint8_t> short_base(8);
  EXPECT_EQ(
      EncodePiece(PieceSpec{DType::kF32, Domain::kValue, 0.1}, PieceInput{x, short_base, {}}, &blob, recon).status().code(),
      EINVAL);
}

TEST(LossyPiece, MalformedBlobsAreCorruptionNotCrashes) {
  const std::vector<uint8_t> x = Floats(Normal(4096, 1.0f, 14));
  Coded c = Encode(PieceSpec{DType::kF32, Domain::kValue, 0.05}, x);
  std::vector<uint8_t> out(x.size());
  for (size_t cut = 0; cut < c.blob.size(); cut += 7) {
    EXPECT_FALSE(DecodePiece(std::span<const uint8_t>(c.blob).first(cut), {}, out).ok()) << cut;
  }
  std::mt19937 g(15);
  for (int i = 0; i < 300; ++i) {
    std::vector<uint8_t> bad = c.blob;
    bad[g() % bad.size()] ^= static_cast<uint8_t>(1u << (g() % 8));
    (void)DecodePiece(bad, {}, out);  // any status; must not crash
  }
  std::vector<uint8_t> wrong_size(x.size() + 4);
  EXPECT_FALSE(DecodePiece(c.blob, {}, wrong_size).ok());
}

// Trained weights are heavy-tailed; they must still be quantized at the
// default fidelity, not fall back to exact storage.
TEST(LossyPiece, HeavyTailedWeightsAtTheDefaultFidelity) {
  std::mt19937 g(17);
  std::exponential_distribution<float> e(1.0f);
  std::vector<float> v(128 * 96);
  for (size_t i = 0; i < v.size(); ++i) v[i] = (g() & 1 ? 0.02f : -0.02f) * e(g);
  const std::vector<uint8_t> x = Floats(v);
  const PieceSpec spec{DType::kF32, Domain::kValue, 0.01};
  Coded c = Encode(spec, x);
  ExpectDecodesToRecon(c);
  EXPECT_LE(MeasureError(spec, x, c.recon), 0.01);
  EXPECT_LT(c.blob.size(), x.size() / 2);
}

// A small update must not vanish just because it is small next to the
// weights: with a residual cap the error stays within that share of it.
TEST(LossyPiece, ResidualCapKeepsSmallUpdates) {
  std::vector<float> w = Normal(1 << 14, 0.02f, 18), step = Normal(1 << 14, 1e-5f, 19), next(w.size());
  for (size_t i = 0; i < w.size(); ++i) next[i] = w[i] + step[i];
  const std::vector<uint8_t> base = Floats(w), x = Floats(next);
  PieceSpec spec{DType::kF32, Domain::kValue, 0.01};
  Coded lazy = Encode(spec, x, base);
  EXPECT_EQ(lazy.recon, base);  // the whole update fits in 1% of the weights: dropped
  spec.residual_cap = 0.1;
  Coded kept = Encode(spec, x, base);
  ExpectDecodesToRecon(kept, base);
  double err = 0, upd = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double r = BitsToFloat(DType::kF32, LoadBits(DType::kF32, kept.recon.data(), i));
    err += (r - next[i]) * (r - next[i]);
    upd += double(next[i] - w[i]) * double(next[i] - w[i]);
  }
  EXPECT_LE(std::sqrt(err / upd), 0.1 * 1.01);  // f32 rounding of next - w
  EXPECT_LE(MeasureError(spec, x, kept.recon), 0.01);
}

}  // namespace
}  // namespace ckptfs::lossy
