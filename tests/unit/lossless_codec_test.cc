#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "codec/cpu_features.h"
#include "codec/dtype.h"
#include "codec/lossless/entropy.h"
#include "codec/lossless/lanes.h"
#include "codec/lossless/plane_codec.h"
#include "codec/lossless/rans.h"
#include "tests/unit/test_util.h"

namespace ckptfs::lossless {
namespace {

using test::RandomBytes;

constexpr DType kAllDTypes[] = {DType::kUnknown, DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3,
                                DType::kF8E5M2,  DType::kI64, DType::kI32, DType::kI16, DType::kI8,   DType::kU8,
                                DType::kBool,    DType::kU16, DType::kU32, DType::kU64, DType::kC64,  DType::kC128};

// ---- test data -----------------------------------------------------------

std::vector<float> NormalFloats(size_t n, float stddev, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

uint16_t FloatToBf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // keep NaN a NaN
  return static_cast<uint16_t>((x + 0x7fff + ((x >> 16) & 1)) >> 16);                 // round to nearest even
}

uint16_t FloatToF16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t a = x & 0x7fffffff;
  if (a >= 0x7f800000) return static_cast<uint16_t>(sign | (a > 0x7f800000 ? 0x7e00 : 0x7c00));
  if (a >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // >= 65520 rounds to inf
  if (a < 0x38800000) {                                              // half subnormal: exact scale, RNE
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(std::bit_cast<float>(a) * 16777216.0f)));
  }
  return static_cast<uint16_t>(sign | ((a + 0xc8000fff + ((a >> 13) & 1)) >> 13));
}

template <typename T>
std::vector<uint8_t> AsBytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<uint8_t> NormalTensor(DType t, size_t n, float stddev, uint64_t seed) {
  std::vector<float> f = NormalFloats(n, stddev, seed);
  if (t == DType::kF32) return AsBytes(f);
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = t == DType::kBF16 ? FloatToBf16(f[i]) : FloatToF16(f[i]);
  return AsBytes(h);
}

// Geometric-ish bytes: a skewed order-0 source with a long tail.
std::vector<uint8_t> SkewedBytes(size_t n, double p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::geometric_distribution<int> dist(p);
  std::vector<uint8_t> b(n);
  for (uint8_t& x : b) x = static_cast<uint8_t>(std::min(dist(rng), 255));
  return b;
}

// ---- helpers ---------------------------------------------------------------

std::vector<uint8_t> RansRoundTrip(const std::vector<uint8_t>& in) {
  std::vector<uint8_t> blob;
  RansEncode(in, &blob);
  std::vector<uint8_t> back(in.size(), 0xAA);
  Status s = RansDecode(blob, back);
  EXPECT_TRUE(s.ok()) << "size " << in.size() << ": " << s.ToString();
  EXPECT_EQ(back, in) << "size " << in.size();
  return blob;
}

std::vector<uint8_t> Encode(DType t, const std::vector<uint8_t>& raw, EncodeStats* stats = nullptr,
                            PlaneCodecOptions opts = {}) {
  std::vector<uint8_t> blob;
  Status s = EncodeTensorBytes(t, raw, opts, &blob, stats);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return blob;
}

void ExpectTensorRoundTrip(DType t, const std::vector<uint8_t>& raw, PlaneCodecOptions opts = {}) {
  std::vector<uint8_t> blob = Encode(t, raw, nullptr, opts);
  std::vector<uint8_t> back(raw.size(), 0xAA);
  Status s = DecodeTensorBytes(blob, back);
  ASSERT_TRUE(s.ok()) << DTypeName(t) << " size " << raw.size() << ": " << s.ToString();
  EXPECT_EQ(back, raw) << DTypeName(t) << " size " << raw.size();
}

// A decode of damaged input must fail cleanly or, if the damage is in a
// payload and still decodes, produce some output; it must never crash
// (ASan builds turn any out-of-bounds access into a failure).
void DecodeMustNotCrash(std::span<const uint8_t> blob, size_t raw_size) {
  std::vector<uint8_t> out(raw_size);
  (void)DecodeTensorBytes(blob, out);
}

// ---- entropy ----------------------------------------------------------------

TEST(EntropyTest, KnownValues) {
  EXPECT_EQ(Order0EntropyBits({}), 0.0);
  EXPECT_EQ(Order0EntropyBits(std::vector<uint8_t>(1000, 7)), 0.0);
  std::vector<uint8_t> two(1000);
  for (size_t i = 0; i < two.size(); ++i) two[i] = i & 1;
  EXPECT_NEAR(Order0EntropyBits(two), 1000.0, 1e-6);
  std::vector<uint8_t> all(256 * 16);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint8_t>(i);
  EXPECT_NEAR(Order0EntropyBits(all), 8.0 * all.size(), 1e-6);
  EXPECT_EQ(DistinctSymbols(ByteHistogram(all)), 256u);
}

// ---- rANS -------------------------------------------------------------------

TEST(RansTest, NormalizationNeverDropsASymbol) {
  // One dominant symbol and 255 singletons: naive rounding gives them 0.
  Histogram h{};
  h[0] = 10'000'000;
  for (int s = 1; s < 256; ++s) h[s] = 1;
  uint64_t total = 10'000'255;
  for (unsigned scale = kRansMinScaleBits; scale <= kRansMaxScaleBits; ++scale) {
    auto f = NormalizeFrequencies(h, total, scale);
    uint64_t sum = 0;
    for (int s = 0; s < 256; ++s) {
      EXPECT_GE(f[s], 1u) << "symbol " << s << " scale " << scale;
      sum += f[s];
    }
    EXPECT_EQ(sum, 1u << scale);
  }
}

TEST(RansTest, EdgeCases) {
  RansRoundTrip({});
  RansRoundTrip({42});
  RansRoundTrip({1, 2});
  RansRoundTrip({1, 2, 3});
  RansRoundTrip({0, 255, 0, 255, 0});
  // A single distinct symbol is a run: size independent of length.
  EXPECT_LE(RansRoundTrip(std::vector<uint8_t>(1 << 20, 9)).size(), 6u);
  // All 256 symbols, uniform: costs at most a table over raw.
  std::vector<uint8_t> all = RandomBytes(1 << 16, 3);
  EXPECT_EQ(DistinctSymbols(ByteHistogram(all)), 256u);
  EXPECT_LE(RansRoundTrip(all).size(), all.size() + all.size() / 100 + 600);
}

TEST(RansTest, RoundTripsManySizesAndShapes) {
  std::mt19937_64 rng(11);
  for (size_t n = 0; n < 70; ++n) RansRoundTrip(SkewedBytes(n, 0.3, n));
  for (int iter = 0; iter < 60; ++iter) {
    size_t n = rng() % 20000;
    double p = 0.01 + (rng() % 98) / 100.0;
    RansRoundTrip(SkewedBytes(n, p, iter));
    RansRoundTrip(RandomBytes(n, iter));
  }
  // Two symbols, one of them very rare: exercises freq == 1 paths.
  std::vector<uint8_t> rare(300000, 5);
  rare[12345] = 6;
  rare[299999] = 200;
  RansRoundTrip(rare);
}

// Long inputs decode with AVX2 where the CPU has it: each pass runs until a
// stream is within two words of its end, then the scalar rounds and the
// checked tail finish. Every entropy from a near-run to random bytes, and
// lengths around a multiple of the eight states, round-trip; damage to a
// long blob fails cleanly.
TEST(RansTest, LongInputsRoundTripAtEveryEntropy) {
  for (double p : {0.95, 0.6, 0.2, 0.05, 0.01}) {
    for (size_t n : {size_t{1} << 16, (size_t{1} << 16) + 1, (size_t{1} << 16) + 7, size_t{200003}}) {
      RansRoundTrip(SkewedBytes(n, p, n));
    }
  }
  RansRoundTrip(RandomBytes(1 << 18, 3));
  const std::vector<uint8_t> in = SkewedBytes(40000, 0.1, 4);
  std::vector<uint8_t> blob;
  RansEncode(in, &blob);
  std::vector<uint8_t> out(in.size());
  std::mt19937_64 rng(5);
  for (int i = 0; i < 300; ++i) {
    EXPECT_FALSE(RansDecode(std::span<const uint8_t>(blob).first(rng() % blob.size()), out).ok());
    std::vector<uint8_t> bad = blob;
    bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
    if (RansDecode(bad, out).ok()) {
      EXPECT_NE(out, in);
    }
  }
}

// The AVX2 rounds and the portable ones read the same blobs alike: the
// same symbols from sound blobs, the same verdict (and output) on damaged
// ones.
TEST(RansTest, PortableAndVectorRoundsDecodeAlike) {
  std::mt19937_64 rng(21);
  for (double p : {0.9, 0.3, 0.05}) {
    const std::vector<uint8_t> in = SkewedBytes(100003, p, 22);
    std::vector<uint8_t> blob;
    RansEncode(in, &blob);
    for (int i = 0; i < 40; ++i) {
      std::vector<uint8_t> bad = blob;
      if (i > 0) bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
      std::vector<uint8_t> vector_out(in.size()), portable_out(in.size());
      const Status vector_st = RansDecode(bad, vector_out);
      Status portable_st;
      {
        ScopedPortableLoops portable;
        portable_st = RansDecode(bad, portable_out);
      }
      ASSERT_EQ(vector_st.ok(), portable_st.ok()) << "p " << p << " flip " << i;
      if (vector_st.ok()) {
        EXPECT_EQ(vector_out, portable_out) << "p " << p << " flip " << i;
      }
      if (i == 0) {
        EXPECT_EQ(vector_out, in);
      }
    }
  }
}

// Byte planes split and merged by the SSSE3/AVX2 loops and by the SSE2
// ones give the same blob and the same bytes back.
TEST(PlaneCodecTest, PortableAndVectorPlanesCodeAlike) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    const std::vector<uint8_t> raw = NormalTensor(t, 70001, 0.02f, 23);
    const std::vector<uint8_t> vector_blob = Encode(t, raw);
    std::vector<uint8_t> portable_blob;
    {
      ScopedPortableLoops portable;
      portable_blob = Encode(t, raw);
      ExpectTensorRoundTrip(t, raw);
    }
    EXPECT_EQ(vector_blob, portable_blob) << DTypeName(t);
    ExpectTensorRoundTrip(t, raw);
  }
}

TEST(RansTest, WithinTwoPercentOfEntropy) {
  for (double p : {0.02, 0.1, 0.3, 0.6, 0.9}) {
    std::vector<uint8_t> in = SkewedBytes(1 << 17, p, 5);
    double bytes = Order0EntropyBits(in) / 8.0;
    std::vector<uint8_t> blob = RansRoundTrip(in);
    EXPECT_LE(static_cast<double>(blob.size()), 1.02 * std::ceil(bytes) + 300) << "p=" << p << " entropy " << bytes;
  }
}

// Every truncation of `blob` (n symbols) fails, and nearly every flipped
// byte: the final-state check catches nearly all payload damage.
void ExpectRansDamageDetected(const std::vector<uint8_t>& blob, size_t n, uint64_t seed) {
  std::vector<uint8_t> out(n);
  for (size_t len = 0; len < blob.size(); ++len) {
    EXPECT_FALSE(RansDecode(std::span<const uint8_t>(blob).first(len), out).ok()) << "len " << len;
  }
  std::mt19937_64 rng(seed);
  int detected = 0;
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> bad = blob;
    bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
    detected += !RansDecode(bad, out).ok();
  }
  EXPECT_GT(detected, 1900);
}

TEST(RansTest, TruncatedAndFlippedBlobsFailSafely) {
  std::vector<uint8_t> in = SkewedBytes(3000, 0.2, 8);
  std::vector<uint8_t> blob;
  RansEncode(in, &blob);
  ExpectRansDamageDetected(blob, in.size(), 9);
  std::vector<uint8_t> wrong_size(in.size() + 1);
  EXPECT_FALSE(RansDecode(blob, wrong_size).ok());
}

// RansEncodeCompact: one state (mode 2) up to kRansOneStateMax symbols,
// then the eight-state blob; every size round-trips through RansDecode,
// and a short input costs no more than RansEncode's blob.
TEST(RansTest, CompactBlobsRoundTripAndAreNoLarger) {
  std::mt19937_64 rng(13);
  for (int iter = 0; iter < 80; ++iter) {
    const size_t n = iter < 40 ? static_cast<size_t>(iter) : rng() % (2 * kRansOneStateMax);
    const std::vector<uint8_t> in = iter % 3 == 0 ? RandomBytes(n, iter) : SkewedBytes(n, 0.05 + iter % 9 / 10.0, iter);
    std::vector<uint8_t> compact, plain, out(n, 0xAA);
    RansEncodeCompact(in, &compact);
    RansEncode(in, &plain);
    ASSERT_TRUE(RansDecode(compact, out).ok()) << "n " << n;
    EXPECT_EQ(out, in) << "n " << n;
    if (n > kRansOneStateMax) {
      EXPECT_EQ(compact, plain) << "n " << n;
    } else if (n > 64) {
      EXPECT_LE(compact.size() + 20, plain.size()) << "n " << n;  // seven states and their lengths fewer
    }
  }
}

TEST(RansTest, TruncatedAndFlippedOneStateBlobsFailSafely) {
  const std::vector<uint8_t> in = SkewedBytes(3000, 0.2, 8);
  std::vector<uint8_t> blob;
  RansEncodeCompact(in, &blob);
  ASSERT_EQ(blob[2], 2) << "mode";  // after the two-byte symbol count
  ExpectRansDamageDetected(blob, in.size(), 10);
  std::vector<uint8_t> longer = blob, out(in.size());
  longer.push_back(0);
  EXPECT_FALSE(RansDecode(longer, out).ok());
}

// ---- plane codec ------------------------------------------------------------

TEST(PlaneCodecTest, RoundTripsEveryDTypeAndOddSizes) {
  for (DType t : kAllDTypes) {
    for (size_t n : {0u, 1u, 2u, 3u, 7u, 15u, 16u, 17u, 33u, 1000u, 4099u, 65537u}) {
      ExpectTensorRoundTrip(t, RandomBytes(n, n + static_cast<uint64_t>(t)));
      ExpectTensorRoundTrip(t, SkewedBytes(n, 0.5, n));
      ExpectTensorRoundTrip(t, std::vector<uint8_t>(n, 0));
      ExpectTensorRoundTrip(t, SkewedBytes(n, 0.5, n), {.allow_zstd = false});
    }
  }
}

TEST(PlaneCodecTest, RoundTripsStructuredFloats) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (size_t n : {1u, 5u, 1000u, 100003u}) {
      std::vector<uint8_t> raw = NormalTensor(t, n, 0.02f, n);
      ExpectTensorRoundTrip(t, raw);
      raw.push_back(0x5a);  // trailing partial element
      ExpectTensorRoundTrip(t, raw);
    }
  }
  std::vector<double> d(50000);
  std::mt19937_64 rng(4);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (double& x : d) x = nd(rng);
  ExpectTensorRoundTrip(DType::kF64, AsBytes(d));
  ExpectTensorRoundTrip(DType::kC128, AsBytes(d));
  ExpectTensorRoundTrip(DType::kC64, NormalTensor(DType::kF32, 50000, 1.0f, 6));
  std::vector<int64_t> ids(40000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i % 512) - 100;
  ExpectTensorRoundTrip(DType::kI64, AsBytes(ids));
}

TEST(PlaneCodecTest, SpecialFloatValuesAreBitExact) {
  std::vector<float> f32 = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::max()};
  for (uint32_t nan : {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0xffbfffffu}) f32.push_back(std::bit_cast<float>(nan));
  std::vector<float> normal = NormalFloats(5000, 0.02f, 1);
  for (size_t i = 0; i < normal.size(); i += 97) normal[i] = f32[i % f32.size()];
  ExpectTensorRoundTrip(DType::kF32, AsBytes(f32));
  ExpectTensorRoundTrip(DType::kF32, AsBytes(normal));
  std::vector<uint16_t> h;
  for (uint32_t v = 0; v < 65536; ++v) h.push_back(static_cast<uint16_t>(v));  // every 16-bit pattern
  ExpectTensorRoundTrip(DType::kBF16, AsBytes(h));
  ExpectTensorRoundTrip(DType::kF16, AsBytes(h));
  std::vector<uint64_t> d = {0x0000000000000000ull, 0x8000000000000000ull, 0x7ff0000000000000ull,
                             0xfff8000000000001ull, 0x0000000000000001ull, 0x7ff4000000000000ull};
  ExpectTensorRoundTrip(DType::kF64, AsBytes(d));
}

TEST(PlaneCodecTest, SingleSymbolPlanesCostOneByte) {
  std::vector<float> ones(100000, 1.0f);
  EncodeStats stats;
  std::vector<uint8_t> blob = Encode(DType::kF32, AsBytes(ones), &stats);
  EXPECT_LE(blob.size(), 20u);
  for (const PlaneStats& p : stats.planes) EXPECT_EQ(p.method, PlaneMethod::kConst);
  ExpectTensorRoundTrip(DType::kF32, AsBytes(ones));
}

TEST(PlaneCodecTest, ZstdFallbackOnRepetitiveData) {
  std::vector<int32_t> pattern(200000);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<int32_t>((i * 7919) % 1000);
  EncodeStats stats;
  std::vector<uint8_t> with = Encode(DType::kI32, AsBytes(pattern), &stats);
  bool used_zstd = false;
  for (const PlaneStats& p : stats.planes) used_zstd |= p.method == PlaneMethod::kZstd;
  EXPECT_TRUE(used_zstd);
  std::vector<uint8_t> without = Encode(DType::kI32, AsBytes(pattern), &stats, {.allow_zstd = false});
  for (const PlaneStats& p : stats.planes) EXPECT_NE(p.method, PlaneMethod::kZstd);
  EXPECT_LT(with.size(), without.size());
  ExpectTensorRoundTrip(DType::kI32, AsBytes(pattern), {.allow_zstd = false});
}

// The entropy coder lands within 2% of each plane's order-0 entropy (rANS,
// forced here), and the default mix, which takes zstd's faster Huffman
// coder where rANS would save under 4%, stays within 2% of the whole bound.
// Whole-tensor ratios stay above ZipNN's (~1.2 fp32, ~1.5 bf16).
TEST(PlaneCodecTest, NormalWeightsMeetEntropyBoundAndRatio) {
  struct Case {
    DType t;
    double min_ratio;
  };
  // Measured (1M elements, std 0.02): F32 1.2030, BF16 1.5095, F16 1.1859 by
  // default; floors sit just below.
  for (Case c : {Case{DType::kF32, 1.20}, Case{DType::kBF16, 1.50}, Case{DType::kF16, 1.18}}) {
    const size_t n = 1 << 20;
    std::vector<uint8_t> raw = NormalTensor(c.t, n, 0.02f, 77);
    EncodeStats rans_stats;
    std::vector<uint8_t> rans_blob = Encode(c.t, raw, &rans_stats, {.allow_zstd = false, .allow_split = false});
    for (size_t k = 0; k < rans_stats.planes.size(); ++k) {
      const PlaneStats& p = rans_stats.planes[k];
      double bound = 1.02 * std::ceil(p.entropy_bits / 8) + 300;
      EXPECT_LE(static_cast<double>(p.stored_bytes), bound)
          << DTypeName(c.t) << " plane " << k << " (" << PlaneMethodName(p.method) << ")";
    }
    EncodeStats stats;
    std::vector<uint8_t> blob = Encode(c.t, raw, &stats);
    double entropy_total = 0;
    for (const PlaneStats& p : stats.planes) entropy_total += p.entropy_bits / 8;
    EXPECT_LE(static_cast<double>(blob.size()), 1.02 * entropy_total + 300) << DTypeName(c.t);
    double ratio = static_cast<double>(raw.size()) / static_cast<double>(blob.size());
    std::printf("  %-5s transform %d: ratio %.4f (rANS only %.4f), entropy bound ratio %.4f\n",
                std::string(DTypeName(c.t)).c_str(), static_cast<int>(stats.transform), ratio,
                static_cast<double>(raw.size()) / static_cast<double>(rans_blob.size()),
                static_cast<double>(raw.size()) / entropy_total);
    EXPECT_GE(ratio, c.min_ratio) << DTypeName(c.t);
    for (const auto* b : {&blob, &rans_blob}) {
      std::vector<uint8_t> back(raw.size());
      ASSERT_TRUE(DecodeTensorBytes(*b, back).ok());
      EXPECT_EQ(back, raw);
    }
  }
}

TEST(PlaneCodecTest, MalformedBlobsFailWithoutCrashing) {
  for (DType t : {DType::kBF16, DType::kF32, DType::kU8}) {
    std::vector<uint8_t> raw = NormalTensor(DType::kBF16, 300, 0.02f, 3);
    raw.push_back(1);  // odd size: a tail for every lane width
    std::vector<uint8_t> blob = Encode(t, raw);
    std::vector<uint8_t> out(raw.size());
    for (size_t len = 0; len < blob.size(); ++len) {
      EXPECT_FALSE(DecodeTensorBytes(std::span<const uint8_t>(blob).first(len), out).ok())
          << DTypeName(t) << " truncated to " << len;
    }
    std::vector<uint8_t> longer = blob;
    longer.push_back(0);
    EXPECT_FALSE(DecodeTensorBytes(longer, out).ok());
    std::vector<uint8_t> wrong(raw.size() - 1);
    EXPECT_FALSE(DecodeTensorBytes(blob, wrong).ok());

    std::mt19937_64 rng(static_cast<uint64_t>(t));
    for (int i = 0; i < 3000; ++i) {
      std::vector<uint8_t> bad = blob;
      int flips = 1 + static_cast<int>(rng() % 3);
      for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
      DecodeMustNotCrash(bad, raw.size());
    }
    // Header fields pointing far past the end: lengths, counts, dtypes.
    for (size_t pos = 0; pos < std::min<size_t>(blob.size(), 24); ++pos) {
      for (uint8_t v : {0x00, 0x01, 0x7f, 0x80, 0xff}) {
        std::vector<uint8_t> bad = blob;
        bad[pos] = v;
        DecodeMustNotCrash(bad, raw.size());
      }
    }
  }
  std::vector<uint8_t> out(10);
  EXPECT_FALSE(DecodeTensorBytes({}, out).ok());
  std::vector<uint8_t> garbage = RandomBytes(1000, 5);
  EXPECT_FALSE(DecodeTensorBytes(garbage, out).ok());
}

TEST(PlaneCodecTest, AppendsToExistingOutput) {
  std::vector<uint8_t> raw = NormalTensor(DType::kBF16, 1000, 0.02f, 2);
  std::vector<uint8_t> out = {1, 2, 3};
  ASSERT_TRUE(EncodeTensorBytes(DType::kBF16, raw, {}, &out).ok());
  EXPECT_EQ(out[0], 1);
  std::vector<uint8_t> back(raw.size());
  ASSERT_TRUE(DecodeTensorBytes(std::span<const uint8_t>(out).subspan(3), back).ok());
  EXPECT_EQ(back, raw);
}

// Plane k, lane i = byte k of lane i rotated left by one bit (or not):
// every SIMD path (SSSE3, AVX2, whichever this CPU runs) and its scalar
// tail must agree with that, at sizes around every vector width.
void ExpectSplitAndMergeMatchTheDefinition() {
  for (unsigned w : {2u, 4u, 8u}) {
    for (bool rotate : {false, true}) {
      for (size_t lanes : {0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 95, 96, 97, 1000, 4099}) {
        SCOPED_TRACE("w " + std::to_string(w) + (rotate ? " rotated" : "") + " lanes " + std::to_string(lanes));
        std::vector<uint8_t> src = RandomBytes(w * lanes, w * 1000 + lanes);
        std::vector<uint8_t> planes(w * lanes + 1, 0xEE);
        uint8_t* p[8] = {};
        for (unsigned k = 0; k < w; ++k) p[k] = planes.data() + k * lanes;
        SplitLanes(w, rotate, src.data(), lanes, p);
        for (size_t i = 0; i < lanes; ++i) {
          uint64_t v = 0;
          for (unsigned k = 0; k < w; ++k) v |= uint64_t{src[i * w + k]} << (8 * k);
          if (rotate) v = ((v << 1) | (v >> (8 * w - 1))) & (w == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * w)) - 1);
          for (unsigned k = 0; k < w; ++k) ASSERT_EQ(p[k][i], static_cast<uint8_t>(v >> (8 * k))) << "lane " << i;
        }
        EXPECT_EQ(planes.back(), 0xEE) << "wrote past the planes";
        std::vector<uint8_t> back(w * lanes + 1, 0xEE);
        const uint8_t* cp[8] = {};
        for (unsigned k = 0; k < w; ++k) cp[k] = p[k];
        MergeLanes(w, rotate, cp, lanes, back.data());
        EXPECT_TRUE(std::equal(src.begin(), src.end(), back.begin()));
        EXPECT_EQ(back.back(), 0xEE);
      }
    }
  }
}

TEST(LanesTest, SimdSplitAndMergeMatchTheDefinition) {
  ExpectSplitAndMergeMatchTheDefinition();
  ScopedPortableLoops portable;  // and the SSE2 and scalar loops on a CPU with more
  ExpectSplitAndMergeMatchTheDefinition();
}

TEST(DTypeTest, NamesAreDistinct) {
  std::set<std::string_view> names;
  for (DType t : kAllDTypes) EXPECT_TRUE(names.insert(DTypeName(t)).second) << DTypeName(t);
  EXPECT_EQ(DTypeName(DType::kBF16), "BF16");
}

}  // namespace
}  // namespace ckptfs::lossless
