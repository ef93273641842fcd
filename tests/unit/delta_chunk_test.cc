// Delta chunk codec (codec/delta_chunk.h): bit-exact round trips against a
// perturbed, identical or unrelated base, the kind the encoder picks, the
// payload checked byte for byte against a residual built here from the
// format's definition, and malformed payloads.
#include "codec/delta_chunk.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "codec/lossless/byte_io.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using Bytes = std::vector<uint8_t>;
using test::CompressibleBytes;
using test::F32ToF16Bits;
using test::PutLE;
using test::RandomBytes;

// ---- test data -----------------------------------------------------------------

uint64_t GetLE(const uint8_t* p, unsigned width) {
  uint64_t v = 0;
  for (unsigned i = 0; i < width; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

uint16_t F32ToBF16Bits(float f) {  // round to nearest even, as torch does
  uint32_t x = std::bit_cast<uint32_t>(f);
  return static_cast<uint16_t>((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

// Element bytes of `t` for the values `v` (complex types take pairs).
Bytes ToBytes(DType t, const std::vector<double>& v) {
  Bytes b;
  for (double x : v) {
    switch (t) {
      case DType::kF64:
      case DType::kC128:
        PutLE(&b, std::bit_cast<uint64_t>(x), 8);
        break;
      case DType::kF32:
      case DType::kC64:
        PutLE(&b, std::bit_cast<uint32_t>(static_cast<float>(x)), 4);
        break;
      case DType::kBF16:
        PutLE(&b, F32ToBF16Bits(static_cast<float>(x)), 2);
        break;
      case DType::kF16:
        PutLE(&b, F32ToF16Bits(static_cast<float>(x)), 2);
        break;
      default:  // integers: the value itself
        PutLE(&b, static_cast<uint64_t>(static_cast<int64_t>(x)), DTypeSize(t));
        break;
    }
  }
  return b;
}

// A tensor before and after a training step: weights from a normal
// distribution moved by a relative step of about `rel`; integer tensors
// (steps, counts) moved by a few units, some of them.
struct TensorPair {
  Bytes base;
  Bytes raw;
};

TensorPair MakeTensor(DType t, size_t n, uint64_t seed, double rel) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const size_t values = n * (t == DType::kC64 || t == DType::kC128 ? 2 : 1);
  std::vector<double> before(values), after(values);
  const bool is_float = DTypeIsFloat(t);
  for (size_t i = 0; i < values; ++i) {
    if (is_float) {
      before[i] = 0.02 * normal(rng);
      after[i] = before[i] * (1 + rel * normal(rng));
    } else {
      const bool byte = DTypeSize(t) == 1;
      before[i] = std::floor((byte ? 100 : 1e6) * std::abs(normal(rng)) / 3);
      after[i] = before[i] + (rng() % 4 == 0 ? static_cast<double>(rng() % 7) - 3 : 0);
      if (byte) after[i] = std::clamp(after[i], 0.0, 255.0);
    }
  }
  return {ToBytes(t, before), ToBytes(t, after)};
}

// Two versions of one checkpoint file, with the ranges the sealer would pass.
struct FilePair {
  Bytes base;
  Bytes raw;
  std::vector<TensorRange> ranges;

  // Metadata that mostly stays (a pickle, a header) with a few bytes changed.
  void Meta(size_t n, uint64_t seed) {
    Bytes m = CompressibleBytes(n, seed);
    base.insert(base.end(), m.begin(), m.end());
    std::mt19937_64 rng(seed);
    for (size_t i = 0; i < n / 100 + 1; ++i) m[rng() % n] ^= static_cast<uint8_t>(1 + rng() % 255);
    raw.insert(raw.end(), m.begin(), m.end());
  }
  void Tensor(DType t, size_t n, uint64_t seed, double rel = 1e-3) {
    TensorPair p = MakeTensor(t, n, seed, rel);
    ranges.push_back({raw.size(), p.raw.size(), t});
    base.insert(base.end(), p.base.begin(), p.base.end());
    raw.insert(raw.end(), p.raw.begin(), p.raw.end());
  }
};

// Odd sizes and offsets (chunk boundaries cut elements), every dtype.
FilePair MixedFile() {
  FilePair f;
  f.Meta(777, 1);
  f.Tensor(DType::kF32, 30001, 2);
  f.Meta(3, 3);
  f.Tensor(DType::kBF16, 20001, 4);
  f.Tensor(DType::kF16, 5003, 5);
  f.Meta(101, 6);
  f.Tensor(DType::kF64, 3001, 7);
  f.Tensor(DType::kI64, 1001, 8);
  f.Tensor(DType::kU8, 5000, 9);
  f.Tensor(DType::kC64, 1200, 10);
  f.Tensor(DType::kI32, 3000, 11);
  f.Tensor(DType::kI16, 2500, 12);
  f.Meta(5, 13);
  f.Tensor(DType::kC128, 700, 14);
  f.Tensor(DType::kF32, 80000, 15);
  f.Meta(50, 16);
  return f;
}

// ---- the format, built here from its definition ----------------------------------

struct Piece {
  uint64_t begin, end;
  unsigned width;
};

DType Retyped(DType t) {
  const unsigned lane = t == DType::kC64 ? 4 : t == DType::kC128 ? 8 : DTypeSize(t);
  switch (lane) {
    case 1:
      return DType::kU8;
    case 2:
      return DType::kU16;
    case 4:
      return DType::kU32;
    case 8:
      return DType::kU64;
  }
  return DType::kUnknown;
}

std::vector<TensorRange> RetypedRanges(std::span<const TensorRange> ranges) {
  std::vector<TensorRange> out(ranges.begin(), ranges.end());
  for (TensorRange& r : out) r.dtype = Retyped(r.dtype);
  return out;
}

// The residual of `kind`, element by element, and the int-diff pieces.
Bytes Residual(DeltaKind kind, std::span<const uint8_t> raw, std::span<const uint8_t> base, uint64_t off,
               std::span<const TensorRange> ranges, std::vector<Piece>* pieces) {
  Bytes res(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) res[i] = raw[i] ^ base[i];
  pieces->clear();
  if (kind == DeltaKind::kXor) return res;
  for (const ChunkPiece& p : CutChunk(off, raw.size(), RetypedRanges(ranges))) {
    const unsigned w = DTypeSize(p.dtype);
    if (w < 2) continue;
    const uint64_t end = p.begin + (p.end - p.begin) / w * w;
    const uint64_t mask = w == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * w)) - 1;
    for (uint64_t e = p.begin; e < end; e += w) {
      const uint64_t d = (GetLE(&raw[e], w) - GetLE(&base[e], w)) & mask;
      const uint64_t sign = (d >> (8 * w - 1)) ? mask : 0;
      const uint64_t z = ((d << 1) ^ sign) & mask;
      for (unsigned k = 0; k < w; ++k) res[e + k] = static_cast<uint8_t>(z >> (8 * k));
    }
    if (end > p.begin) pieces->push_back({p.begin, end, w});
  }
  return res;
}

Bytes Header(DeltaKind kind, const std::vector<Piece>& pieces) {
  Bytes h = {kDeltaChunkVersion, static_cast<uint8_t>(kind)};
  if (kind == DeltaKind::kXor) return h;
  lossless::PutVarint(&h, pieces.size());
  for (const Piece& p : pieces) {
    lossless::PutVarint(&h, p.begin);
    lossless::PutVarint(&h, p.end);
    h.push_back(static_cast<uint8_t>(p.width));
  }
  return h;
}

// The payload the format defines for `kind`.
Bytes Reference(DeltaKind kind, std::span<const uint8_t> raw, std::span<const uint8_t> base, uint64_t off,
                std::span<const TensorRange> ranges) {
  std::vector<Piece> pieces;
  Bytes res = Residual(kind, raw, base, off, ranges, &pieces);
  Bytes out = Header(kind, pieces);
  EXPECT_TRUE(EncodeTensorChunk(res, off, RetypedRanges(ranges), {}, &out).ok());
  return out;
}

Bytes EncodeDelta(std::span<const uint8_t> raw, std::span<const uint8_t> base, uint64_t off,
                  std::span<const TensorRange> ranges) {
  Bytes out;
  Status s = EncodeDeltaChunk(raw, base, off, ranges, {}, &out);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

DeltaKind KindOf(const Bytes& payload) { return static_cast<DeltaKind>(payload.at(1)); }

// Encodes, checks the payload against the format's definition, decodes.
Bytes ExpectRoundTrip(std::span<const uint8_t> raw, std::span<const uint8_t> base, uint64_t off,
                      std::span<const TensorRange> ranges, const std::string& what) {
  Bytes payload = EncodeDelta(raw, base, off, ranges);
  if (payload.size() < 2) {
    ADD_FAILURE() << what << ": payload of " << payload.size() << " bytes";
    return payload;
  }
  EXPECT_EQ(payload[0], kDeltaChunkVersion) << what;
  EXPECT_EQ(payload, Reference(KindOf(payload), raw, base, off, ranges)) << what << ": not the defined payload";
  Bytes back(raw.size(), 0xAA);
  Status s = DecodeDeltaChunk(payload, base, back);
  EXPECT_TRUE(s.ok()) << what << ": " << s.ToString();
  EXPECT_TRUE(std::equal(back.begin(), back.end(), raw.begin(), raw.end())) << what << ": bytes differ";
  return payload;
}

// ---- round trips ------------------------------------------------------------------

TEST(DeltaChunkTest, PerturbedFloatsPickIntDiff) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64}) {
    // bf16 and f16 keep few mantissa bits: a bigger step still moves them.
    const double rel = DTypeSize(t) == 2 ? 2e-2 : 1e-3;
    // A small chunk is coded both ways; a big one is judged on the sample.
    for (size_t bytes : {size_t{60000}, size_t{600000}}) {
      const size_t n = bytes / DTypeSize(t);
      TensorPair p = MakeTensor(t, n, 20 + bytes, rel);
      const std::vector<TensorRange> r = {{0, p.raw.size(), t}};
      const std::string what = std::string(DTypeName(t)) + " " + std::to_string(bytes);
      Bytes payload = ExpectRoundTrip(p.raw, p.base, 0, r, what);
      EXPECT_EQ(KindOf(payload), DeltaKind::kIntDiff) << what;
      Bytes plain;
      ASSERT_OK(EncodeTensorChunk(p.raw, 0, r, {}, &plain));
      EXPECT_LT(payload.size(), plain.size()) << what;
    }
  }
}

TEST(DeltaChunkTest, NegatedTensorPicksXor) {
  // Every sign flipped: XOR leaves one constant bit, the difference is as
  // wide as the values.
  TensorPair p = MakeTensor(DType::kF32, 100000, 30, 0);
  for (size_t i = 3; i < p.raw.size(); i += 4) p.raw[i] ^= 0x80;
  const std::vector<TensorRange> r = {{0, p.raw.size(), DType::kF32}};
  Bytes payload = ExpectRoundTrip(p.raw, p.base, 0, r, "negated");
  EXPECT_EQ(KindOf(payload), DeltaKind::kXor);
  EXPECT_LT(payload.size(), 1000u);
}

TEST(DeltaChunkTest, IdenticalBaseIsNearlyFree) {
  FilePair f = MixedFile();
  for (uint64_t chunk : {uint64_t{100000}, uint64_t{f.raw.size()}}) {
    for (uint64_t off = 0; off < f.raw.size(); off += chunk) {
      const uint64_t len = std::min<uint64_t>(chunk, f.raw.size() - off);
      std::span<const uint8_t> raw(f.raw.data() + off, len);
      auto ranges = RangesOverlapping(f.ranges, off, off + len);
      Bytes payload = ExpectRoundTrip(raw, raw, off, ranges, "identical at " + std::to_string(off));
      EXPECT_LT(payload.size(), len / 100) << "chunk at " << off;
    }
  }
}

TEST(DeltaChunkTest, UnrelatedBaseStillRoundTrips) {
  FilePair f = MixedFile();
  Bytes noise = RandomBytes(f.raw.size(), 40);
  for (uint64_t chunk : {uint64_t{65536}, uint64_t{f.raw.size()}}) {
    for (uint64_t off = 0; off < f.raw.size(); off += chunk) {
      const uint64_t len = std::min<uint64_t>(chunk, f.raw.size() - off);
      auto ranges = RangesOverlapping(f.ranges, off, off + len);
      ExpectRoundTrip(std::span<const uint8_t>(f.raw).subspan(off, len),
                      std::span<const uint8_t>(noise).subspan(off, len), off, ranges,
                      "noise base at " + std::to_string(off));
    }
  }
  // And the other way round: a zero base is the plain chunk, XOR'ed with nothing.
  Bytes zeros(f.raw.size(), 0);
  ExpectRoundTrip(f.raw, zeros, 0, f.ranges, "zero base");
}

TEST(DeltaChunkTest, MixedChunksCutInsideTensors) {
  FilePair f = MixedFile();
  bool cut_start = false, cut_end = false, int_diff = false, xor_kind = false;
  for (uint64_t chunk : {uint64_t{4099}, uint64_t{65536}, uint64_t{100003}, uint64_t{300007}}) {
    for (uint64_t off = 0; off < f.raw.size(); off += chunk) {
      const uint64_t len = std::min<uint64_t>(chunk, f.raw.size() - off);
      auto ranges = RangesOverlapping(f.ranges, off, off + len);
      const std::string what = "chunk " + std::to_string(chunk) + " at " + std::to_string(off);
      Bytes payload = ExpectRoundTrip(std::span<const uint8_t>(f.raw).subspan(off, len),
                                      std::span<const uint8_t>(f.base).subspan(off, len), off, ranges, what);
      int_diff |= KindOf(payload) == DeltaKind::kIntDiff;
      xor_kind |= KindOf(payload) == DeltaKind::kXor;
      for (const TensorRange& r : ranges) {
        const uint64_t w = DTypeSize(r.dtype);
        cut_start |= r.offset < off && (off - r.offset) % w != 0;
        cut_end |= r.offset + r.length > off + len && (off + len - r.offset) % w != 0;
      }
    }
  }
  EXPECT_TRUE(cut_start) << "no chunk started inside an element";
  EXPECT_TRUE(cut_end) << "no chunk ended inside an element";
  EXPECT_TRUE(int_diff);
  EXPECT_TRUE(xor_kind);  // chunks of metadata and 1-byte elements only
}

TEST(DeltaChunkTest, OddSizesAndPartialElements) {
  // A tensor whose recorded length is not whole elements, chunks of odd
  // sizes at odd offsets, and chunks shorter than one element.
  TensorPair p = MakeTensor(DType::kF64, 20000, 50, 1e-3);
  p.raw.resize(p.raw.size() - 3);
  p.base.resize(p.raw.size());
  const std::vector<TensorRange> r = {{0, p.raw.size(), DType::kF64}};
  for (uint64_t len : {uint64_t{1}, uint64_t{7}, uint64_t{4095}, uint64_t{4097}, uint64_t{12291}, uint64_t{159997}}) {
    for (uint64_t off : {uint64_t{0}, uint64_t{5}, p.raw.size() - len}) {
      auto ranges = RangesOverlapping(r, off, off + len);
      ExpectRoundTrip(std::span<const uint8_t>(p.raw).subspan(off, len),
                      std::span<const uint8_t>(p.base).subspan(off, len), off, ranges,
                      "len " + std::to_string(len) + " at " + std::to_string(off));
    }
  }
}

TEST(DeltaChunkTest, EmptyChunk) {
  Bytes payload = EncodeDelta({}, {}, 123, {});
  EXPECT_EQ(payload, (Bytes{kDeltaChunkVersion, static_cast<uint8_t>(DeltaKind::kXor), kTensorChunkVersion, 0}));
  EXPECT_OK(DecodeDeltaChunk(payload, {}, {}));
}

TEST(DeltaChunkTest, EncoderRejectsBaseOfAnotherSize) {
  Bytes raw(100, 1), base(99, 1), out = {7};
  Status s = EncodeDeltaChunk(raw, base, 0, {}, {}, &out);
  EXPECT_EQ(s.code(), EINVAL) << s.ToString();
  EXPECT_EQ(out, Bytes{7});
}

TEST(DeltaChunkTest, AppendsToOut) {
  TensorPair p = MakeTensor(DType::kF32, 5000, 60, 1e-3);
  const std::vector<TensorRange> r = {{0, p.raw.size(), DType::kF32}};
  Bytes alone = EncodeDelta(p.raw, p.base, 0, r);
  Bytes out = {1, 2, 3};
  ASSERT_OK(EncodeDeltaChunk(p.raw, p.base, 0, r, {}, &out));
  ASSERT_EQ(out.size(), alone.size() + 3);
  EXPECT_TRUE(std::equal(alone.begin(), alone.end(), out.begin() + 3));
}

// Payload sizes on a 4 MiB chunk of perturbed f32 weights, for the record.
TEST(DeltaChunkTest, PerturbedF32Sizes) {
  const size_t n = (4 << 20) / 4;
  for (double rel : {1e-4, 1e-3, 1e-2}) {
    TensorPair p = MakeTensor(DType::kF32, n, 70, rel);
    const std::vector<TensorRange> r = {{0, p.raw.size(), DType::kF32}};
    Bytes plain, payload;
    ASSERT_OK(EncodeTensorChunk(p.raw, 0, r, {}, &plain));
    ASSERT_OK(EncodeDeltaChunk(p.raw, p.base, 0, r, {}, &payload));
    const size_t x = Reference(DeltaKind::kXor, p.raw, p.base, 0, r).size();
    const size_t d = Reference(DeltaKind::kIntDiff, p.raw, p.base, 0, r).size();
    EXPECT_EQ(payload.size(), std::min(x, d));
    EXPECT_EQ(KindOf(payload), DeltaKind::kIntDiff);
    std::printf("  f32 4 MiB, step %g: tensor %zu (%.3f)  xor %zu (%.3f)  int-diff %zu (%.3f)  chosen %s\n", rel,
                plain.size(), plain.size() / double(p.raw.size()), x, x / double(p.raw.size()), d,
                d / double(p.raw.size()), KindOf(payload) == DeltaKind::kIntDiff ? "int-diff" : "xor");
  }
}

// ---- the limit ----------------------------------------------------------------------

// A 1 MiB chunk of f32 weights nudged by `rel`, and what it codes to alone.
struct LimitCase {
  TensorPair p;
  std::vector<TensorRange> r;
  size_t alone = 0;
  int asked = 0;  // calls of `standalone`
  std::function<size_t()> standalone = [this] {
    ++asked;
    return alone;
  };
  explicit LimitCase(double rel) : p(MakeTensor(DType::kF32, (1 << 20) / 4, 71, rel)) {
    r = {{0, p.raw.size(), DType::kF32}};
    Bytes coded;
    EXPECT_OK(EncodeTensorChunk(p.raw, 0, r, {}, &coded));
    alone = coded.size();
  }
  LimitCase(const LimitCase&) = delete;
  Status Encode(double share, Bytes* out) {
    return EncodeDeltaChunk(p.raw, p.base, 0, r, {}, out, {share, &standalone});
  }
};

// Coding the chunk alone costs as much as the delta: a delta the sample puts
// far under the limit is kept without it, and is the payload it would be
// without a limit.
TEST(DeltaChunkTest, DeltaFarUnderTheLimitNeverCodesTheChunkAlone) {
  LimitCase c(1e-4);
  Bytes out;
  ASSERT_OK(c.Encode(0.8, &out));
  EXPECT_EQ(c.asked, 0);
  EXPECT_LT(out.size() * 2, c.alone);
  EXPECT_EQ(out, EncodeDelta(c.p.raw, c.p.base, 0, c.r));
}

// Near the limit the exact size decides: kept under it, EFBIG at or above
// it, with `out` as it was.
TEST(DeltaChunkTest, DeltaNearTheLimitIsJudgedByTheExactSize) {
  LimitCase c(1e-4);
  const size_t delta = EncodeDelta(c.p.raw, c.p.base, 0, c.r).size();
  const double at = static_cast<double>(delta) / static_cast<double>(c.alone);
  Bytes out = {9};
  ASSERT_OK(c.Encode(at * 1.05, &out));
  EXPECT_EQ(c.asked, 1);
  EXPECT_EQ(out.size(), delta + 1);
  out = {9};
  Status s = c.Encode(at * 0.95, &out);
  EXPECT_EQ(s.code(), EFBIG) << s.ToString();
  EXPECT_EQ(out, Bytes{9});
}

// A delta the sample puts clearly above the limit is not coded at all.
TEST(DeltaChunkTest, DeltaFarAboveTheLimitGivesUpEarly) {
  LimitCase c(1e-4);
  Bytes out;
  Status s = c.Encode(0.05, &out);
  EXPECT_EQ(s.code(), EFBIG) << s.ToString();
  EXPECT_NE(s.message().find("predicted"), std::string::npos) << s.ToString();
  EXPECT_EQ(c.asked, 1);
  EXPECT_TRUE(out.empty());
}

// Without a sample (a chunk no bigger than it) the exact size decides.
TEST(DeltaChunkTest, SmallChunkAsksForTheExactSize) {
  TensorPair p = MakeTensor(DType::kF32, 4096, 72, 1e-4);
  const std::vector<TensorRange> r = {{0, p.raw.size(), DType::kF32}};
  int asked = 0;
  const std::function<size_t()> alone = [&] {
    ++asked;
    return p.raw.size();
  };
  Bytes out;
  ASSERT_OK(EncodeDeltaChunk(p.raw, p.base, 0, r, {}, &out, {0.8, &alone}));
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(out, EncodeDelta(p.raw, p.base, 0, r));
}

// ---- malformed payloads --------------------------------------------------------------

// A small int-diff payload: metadata, an f32 and a bf16 tensor.
struct SmallPayload {
  FilePair f;
  Bytes payload;
  SmallPayload() {
    f.Meta(700, 1);
    f.Tensor(DType::kF32, 1500, 2);
    f.Meta(40, 3);
    f.Tensor(DType::kBF16, 2100, 4, 2e-2);
    f.Meta(33, 5);
    payload = EncodeDelta(f.raw, f.base, 0, f.ranges);
  }
  Status Decode(std::span<const uint8_t> p) const {
    Bytes out(f.raw.size());
    return DecodeDeltaChunk(p, f.base, out);
  }
  // The tensor chunk payload after the header.
  Bytes ResidualPayload() const {
    std::vector<Piece> pieces;
    Bytes res = Residual(DeltaKind::kIntDiff, f.raw, f.base, 0, f.ranges, &pieces);
    Bytes out;
    EXPECT_TRUE(EncodeTensorChunk(res, 0, RetypedRanges(f.ranges), {}, &out).ok());
    return out;
  }
};

void ExpectCorrupt(const Status& s, const std::string& needle, const std::string& what) {
  EXPECT_EQ(s.code(), EIO) << what << ": " << s.ToString();
  EXPECT_NE(s.message().find(needle), std::string::npos) << what << ": " << s.message();
}

TEST(DeltaChunkMalformedTest, EveryTruncationIsCorruption) {
  SmallPayload p;
  ASSERT_EQ(KindOf(p.payload), DeltaKind::kIntDiff);
  ASSERT_OK(p.Decode(p.payload));
  for (size_t len = 0; len < p.payload.size(); ++len) {
    Status s = p.Decode(std::span<const uint8_t>(p.payload).first(len));
    ASSERT_EQ(s.code(), EIO) << "truncated to " << len << ": " << s.ToString();
  }
  Bytes longer = p.payload;
  longer.push_back(0);
  ExpectCorrupt(p.Decode(longer), "bytes left", "one byte appended");
}

TEST(DeltaChunkMalformedTest, FlippedBytesFailCleanly) {
  SmallPayload p;
  size_t detected = 0, total = 0;
  for (size_t pos = 0; pos < p.payload.size(); ++pos) {
    for (uint8_t mask : {0x01, 0x10, 0x80, 0xff}) {
      Bytes bad = p.payload;
      bad[pos] ^= mask;
      Status s = p.Decode(bad);
      ++total;
      if (!s.ok()) {
        ++detected;
        ASSERT_EQ(s.code(), EIO) << "flip at " << pos << ": " << s.ToString();
      }
    }
  }
  EXPECT_GT(detected, 0u);
  std::printf("  %zu of %zu single-byte flips detected by the decoder\n", detected, total);
  std::mt19937_64 rng(9);
  for (int i = 0; i < 300; ++i) {
    Bytes bad = p.payload;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
    Status s = p.Decode(bad);
    if (!s.ok()) {
      ASSERT_EQ(s.code(), EIO) << s.ToString();
    }
  }
}

TEST(DeltaChunkMalformedTest, BadVersionAndKind) {
  SmallPayload p;
  for (uint8_t v : {0, 2, 255}) {
    Bytes bad = p.payload;
    bad[0] = v;
    ExpectCorrupt(p.Decode(bad), "delta chunk version", "version " + std::to_string(v));
  }
  for (uint8_t k : {0, 3, 255}) {
    Bytes bad = p.payload;
    bad[1] = k;
    ExpectCorrupt(p.Decode(bad), "delta kind", "kind " + std::to_string(k));
  }
  // The int-diff table read as a tensor chunk payload.
  Bytes as_xor = p.payload;
  as_xor[1] = static_cast<uint8_t>(DeltaKind::kXor);
  EXPECT_EQ(p.Decode(as_xor).code(), EIO);
}

TEST(DeltaChunkMalformedTest, BadPieceTables) {
  SmallPayload p;
  const Bytes residual = p.ResidualPayload();
  const uint64_t len = p.f.raw.size();
  auto with_table = [&](const Bytes& table) {
    Bytes b = table;
    b.insert(b.begin(), {kDeltaChunkVersion, static_cast<uint8_t>(DeltaKind::kIntDiff)});
    b.insert(b.end(), residual.begin(), residual.end());
    return b;
  };
  auto table = [](std::vector<Piece> pieces) {
    Bytes t = Header(DeltaKind::kIntDiff, pieces);
    return Bytes(t.begin() + 2, t.end());
  };
  // A valid table other than the encoder's still decodes: the decoder
  // trusts the table, not the ranges (the residual just means other bytes).
  EXPECT_OK(p.Decode(with_table(table({}))));
  EXPECT_OK(p.Decode(with_table(table({{0, 8, 4}, {8, 16, 8}, {20, 22, 2}}))));
  struct Case {
    std::vector<Piece> pieces;
    const char* needle;
  };
  const Case cases[] = {
      {{{0, 6, 3}}, "lane size 3"},
      {{{0, 6, 1}}, "lane size 1"},
      {{{0, 16, 16}}, "lane size 16"},
      {{{0, 0, 4}}, "outside the chunk"},
      {{{8, 4, 4}}, "outside the chunk"},
      {{{0, len + 4, 4}}, "outside the chunk"},
      {{{len, len + 4, 4}}, "outside the chunk"},
      {{{8, 16, 4}, {0, 4, 4}}, "out of order"},
      {{{0, 16, 4}, {12, 20, 4}}, "out of order"},
      {{{0, 6, 4}}, "not whole lanes"},
      {{{2, 14, 8}}, "not whole lanes"},
  };
  for (const Case& c : cases) {
    ExpectCorrupt(p.Decode(with_table(table(c.pieces))), c.needle, c.needle);
  }
  // Counts past what the payload or the chunk can hold; a varint overflow.
  Bytes big;
  lossless::PutVarint(&big, uint64_t{1} << 40);
  ExpectCorrupt(p.Decode(with_table(big)), "piece count", "huge count");
  Bytes more = table({{0, 4, 4}});
  more[0] = 2;
  ExpectCorrupt(p.Decode(with_table(more)), "int-diff", "count past the table");
  ExpectCorrupt(p.Decode(with_table(Bytes(11, 0xff))), "varint overflow", "overflowing count");
  Bytes tiny = EncodeDelta(Bytes(3, 1), Bytes(3, 2), 0, {});
  Bytes tiny_table = {kDeltaChunkVersion, static_cast<uint8_t>(DeltaKind::kIntDiff), 2, 0, 2, 2, 2, 2, 2};
  tiny_table.insert(tiny_table.end(), tiny.begin() + 2, tiny.end());
  Bytes out(3);
  ExpectCorrupt(DecodeDeltaChunk(tiny_table, Bytes(3, 2), out), "piece count", "count past the chunk");
}

TEST(DeltaChunkMalformedTest, BaseOfAnotherSize) {
  SmallPayload p;
  Bytes out(p.f.raw.size());
  Bytes shorter(p.f.base.begin(), p.f.base.end() - 1), longer = p.f.base;
  longer.push_back(0);
  ExpectCorrupt(DecodeDeltaChunk(p.payload, shorter, out), "base", "short base");
  ExpectCorrupt(DecodeDeltaChunk(p.payload, longer, out), "base", "long base");
  // A payload for another chunk size.
  Bytes small(out.size() - 1);
  EXPECT_EQ(DecodeDeltaChunk(p.payload, shorter, small).code(), EIO);
}

}  // namespace
}  // namespace ckptfs
