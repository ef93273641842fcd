// Lossy piece and chunk codecs: error targets honoured, reconstruction
// deterministic and equal to what decoding gives, exact where it must be,
// and malformed payloads rejected without crashing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "codec/lossy/float_bits.h"
#include "codec/lossy/lossy_chunk.h"
#include "codec/lossy/quantizer.h"
#include "store/lossy_policy.h"

namespace ckptfs::lossy {
namespace {

std::vector<uint8_t> Floats(const std::vector<float>& v, DType t = DType::kF32) {
  std::vector<uint8_t> b(v.size() * DTypeSize(t));
  for (size_t i = 0; i < v.size(); ++i) StoreBits(t, b.data(), i, FloatToBits(t, v[i]));
  return b;
}

std::vector<float> Normal(size_t n, float sigma, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

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
    if (v[i] == 0.0f) ASSERT_EQ(r, 0.0f) << i;
  }
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

TEST(FloatBits, HalfRoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfBitsToFloat(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalfBits(f), h) << std::hex << h;
  }
  EXPECT_EQ(FloatToHalfBits(1.0f + 1.0f / 2048), 0x3C00u);        // tie to even, down
  EXPECT_EQ(FloatToHalfBits(1.0f + 3.0f / 2048), 0x3C02u);        // tie to even, up
  EXPECT_EQ(FloatToHalfBits(70000.0f), 0x7C00u);                  // overflow
  EXPECT_EQ(FloatToBits(DType::kBF16, 1.0f + 1.0f / 256), 0x3F80u);  // tie to even
}

TEST(LossyChunk, MetadataStaysExactAndTensorsMeetTheTarget) {
  const std::vector<uint8_t> tensor = Floats(Normal(1 << 14, 0.02f, 16));
  std::vector<uint8_t> raw(100, 0xAB);
  raw.insert(raw.end(), tensor.begin(), tensor.end());
  raw.resize(raw.size() + 50, 0xCD);
  const std::vector<uint8_t> original = raw;
  std::vector<ChunkSegment> segs(3);
  segs[0].begin = 0, segs[0].end = 100;
  segs[1].begin = 100, segs[1].end = 100 + tensor.size(), segs[1].lossy = true;
  segs[1].spec = PieceSpec{DType::kF32, Domain::kValue, 0.01};
  segs[1].role = TensorRole::kWeight;
  segs[2].begin = segs[1].end, segs[2].end = raw.size();
  const std::vector<TensorRange> ranges = {{1000 + 100, tensor.size(), DType::kF32}};
  std::vector<uint8_t> payload;
  ASSERT_TRUE(EncodeLossyChunk(raw, {}, 1000, ranges, segs, TensorChunkOptions{}, &payload).ok());
  EXPECT_TRUE(segs[1].coded_lossy);
  EXPECT_GT(segs[1].stored, 0u);
  EXPECT_TRUE(std::equal(raw.begin(), raw.begin() + 100, original.begin()));
  EXPECT_TRUE(std::equal(raw.end() - 50, raw.end(), original.end() - 50));
  EXPECT_LE(MeasureError(segs[1].spec, tensor, std::span<const uint8_t>(raw).subspan(100, tensor.size())), 0.01);
  std::vector<uint8_t> out(raw.size());
  ASSERT_TRUE(DecodeLossyChunk(payload, {}, out).ok());
  EXPECT_EQ(out, raw);
  std::vector<uint8_t> short_out(raw.size() - 1);
  EXPECT_FALSE(DecodeLossyChunk(payload, {}, short_out).ok());
}

TEST(LossyPolicy, ParsesTheAcceptedFormsOnly) {
  EXPECT_EQ(*ParseLossyPolicy("lossless"), 0.0);
  EXPECT_EQ(*ParseLossyPolicy("lossy"), kDefaultFidelity);
  EXPECT_EQ(*ParseLossyPolicy("lossy=0.05"), 0.05);
  EXPECT_EQ(*ParseLossyPolicy("lossy=0.05\n"), 0.05);
  for (const char* bad : {"", "lossy=", "lossy=0", "lossy=-1", "lossy=0.6", "lossy=nan", "banana", "lossy=0.1x"}) {
    EXPECT_EQ(ParseLossyPolicy(bad).status().code(), EINVAL) << bad;
  }
  EXPECT_EQ(FormatLossyPolicy(0), "lossless");
  EXPECT_EQ(FormatLossyPolicy(0.02), "lossy=0.02");
}

}  // namespace
}  // namespace ckptfs::lossy

namespace ckptfs::lossy {
namespace {

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

}  // namespace
}  // namespace ckptfs::lossy

namespace ckptfs::lossy {
namespace {

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
