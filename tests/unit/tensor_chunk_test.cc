// Chunk codec kTensor (codec/tensor_chunk.h): how a chunk is cut into
// metadata and tensor pieces, bit-exact round trips of mixed chunks, the
// choice EncodeChunk makes, malformed payloads, and a safetensors file
// sealed into a pack end to end.
#include "codec/tensor_chunk.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "codec/chunk_codec.h"
#include "codec/formats/layout.h"
#include "codec/lossless/byte_io.h"
#include "codec/lossless/plane_codec.h"
#include "base/env.h"
#include "store/pack.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using Bytes = std::vector<uint8_t>;
using test::BuildSafetensors;
using test::CompressibleBytes;
using test::F32ToF16Bits;
using test::PutLE;
using test::RandomBytes;

// Mirrors kMinTensorPiece in codec/tensor_chunk_encode.cc: shorter tensor pieces
// are left with the metadata.
constexpr uint64_t kMinPiece = 4096;

// ---- test data ---------------------------------------------------------------

// `n` elements of `t` that look like checkpoint contents: weights drawn from
// a normal distribution for floats, small counts and ids for integers.
Bytes TensorBytes(DType t, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 0.02);
  Bytes b;
  b.reserve(n * DTypeSize(t));
  for (size_t i = 0; i < n; ++i) {
    switch (t) {
      case DType::kF64:
        PutLE(&b, std::bit_cast<uint64_t>(normal(rng)), 8);
        break;
      case DType::kF32:
        PutLE(&b, std::bit_cast<uint32_t>(static_cast<float>(normal(rng))), 4);
        break;
      case DType::kBF16:
        PutLE(&b, std::bit_cast<uint32_t>(static_cast<float>(normal(rng))) >> 16, 2);
        break;
      case DType::kF16:
        PutLE(&b, F32ToF16Bits(static_cast<float>(normal(rng))), 2);
        break;
      case DType::kC64:
        PutLE(&b, std::bit_cast<uint32_t>(static_cast<float>(normal(rng))), 4);
        PutLE(&b, std::bit_cast<uint32_t>(static_cast<float>(normal(rng))), 4);
        break;
      case DType::kC128:
        PutLE(&b, std::bit_cast<uint64_t>(normal(rng)), 8);
        PutLE(&b, std::bit_cast<uint64_t>(normal(rng)), 8);
        break;
      case DType::kBool:
        b.push_back(static_cast<uint8_t>(rng() % 7 == 0));
        break;
      case DType::kF8E4M3:
      case DType::kF8E5M2: {
        std::geometric_distribution<int> g(0.3);
        b.push_back(static_cast<uint8_t>(std::min(g(rng), 127) | ((rng() & 1) << 7)));
        break;
      }
      case DType::kI64:
      case DType::kU64:
        PutLE(&b, rng() % 50000, 8);  // token ids, steps
        break;
      case DType::kI32:
      case DType::kU32:
        PutLE(&b, static_cast<uint64_t>(static_cast<int64_t>(rng() % 2001) - 1000), 4);
        break;
      case DType::kI16:
      case DType::kU16:
        PutLE(&b, rng() % 300, 2);
        break;
      case DType::kI8:
      case DType::kU8: {
        std::geometric_distribution<int> g(0.1);
        b.push_back(static_cast<uint8_t>(std::min(g(rng), 255)));
        break;
      }
      case DType::kUnknown:
        b.push_back(static_cast<uint8_t>(rng()));
        break;
    }
  }
  return b;
}

// A file assembled from metadata runs and tensors, with the ranges the
// sealer would pass to the chunk codec.
struct FileBuilder {
  Bytes bytes;
  std::vector<TensorRange> ranges;

  void Meta(size_t n, uint64_t seed) {
    Bytes m = CompressibleBytes(n, seed);
    bytes.insert(bytes.end(), m.begin(), m.end());
  }
  void Raw(const Bytes& m) { bytes.insert(bytes.end(), m.begin(), m.end()); }
  void Tensor(DType t, size_t elements, uint64_t seed) {
    Bytes v = TensorBytes(t, elements, seed);
    ranges.push_back({bytes.size(), v.size(), t});
    bytes.insert(bytes.end(), v.begin(), v.end());
  }
};

// Metadata, every dtype, odd sizes and offsets (so chunk boundaries cut
// elements), and tensors large enough for the exponent split.
FileBuilder MixedFile() {
  FileBuilder f;
  f.Meta(777, 1);
  f.Tensor(DType::kF32, 10000, 2);
  f.Meta(3, 3);
  f.Tensor(DType::kBF16, 9001, 4);
  f.Tensor(DType::kF16, 5003, 5);
  f.Raw(RandomBytes(101, 6));
  f.Tensor(DType::kF64, 1500, 7);
  f.Tensor(DType::kI64, 1001, 8);
  f.Tensor(DType::kU8, 5000, 9);
  f.Raw(Bytes(64, 0));
  f.Tensor(DType::kBF16, 70001, 10);  // > 32K lanes: exponent split candidate
  f.Meta(5, 11);
  f.Tensor(DType::kF32, 40000, 12);
  f.Tensor(DType::kC64, 1200, 13);
  f.Tensor(DType::kI32, 3000, 14);
  f.Tensor(DType::kU16, 2500, 15);
  f.Tensor(DType::kBool, 6000, 16);
  f.Tensor(DType::kF8E4M3, 6000, 17);
  f.Tensor(DType::kC128, 700, 18);
  f.Meta(50, 19);
  return f;
}

// ---- payload inspection ------------------------------------------------------

struct Segment {
  SegmentKind kind;
  uint64_t raw_len;
  uint64_t stored_len;
  size_t payload_offset;  // in the chunk payload
};

// Reads the segment table of a kTensor payload (format in tensor_chunk.h).
std::vector<Segment> ParseSegments(std::span<const uint8_t> payload) {
  lossless::ByteReader r(payload);
  uint8_t version = 0;
  uint64_t count = 0;
  EXPECT_TRUE(r.Byte(&version, "version").ok());
  EXPECT_EQ(version, kTensorChunkVersion);
  EXPECT_TRUE(r.Varint(&count, "count").ok());
  std::vector<Segment> segs;
  for (uint64_t i = 0; i < count && r.remaining() > 0; ++i) {
    uint8_t k = 0;
    Segment s{};
    EXPECT_TRUE(r.Byte(&k, "kind").ok());
    EXPECT_TRUE(r.Varint(&s.raw_len, "raw").ok());
    EXPECT_TRUE(r.Varint(&s.stored_len, "stored").ok());
    s.kind = static_cast<SegmentKind>(k);
    segs.push_back(s);
  }
  size_t pos = r.pos();
  for (Segment& s : segs) {
    s.payload_offset = pos;
    pos += s.stored_len;
  }
  EXPECT_EQ(pos, payload.size());
  return segs;
}

Bytes Encode(std::span<const uint8_t> raw, uint64_t chunk_offset, std::span<const TensorRange> ranges,
             TensorChunkOptions opts = {}) {
  Bytes out;
  Status s = EncodeTensorChunk(raw, chunk_offset, ranges, opts, &out);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

void ExpectRoundTrip(std::span<const uint8_t> raw, uint64_t chunk_offset, std::span<const TensorRange> ranges,
                     const std::string& what) {
  Bytes payload = Encode(raw, chunk_offset, ranges);
  Bytes back(raw.size(), 0xAA);
  Status s = DecodeTensorChunk(payload, back);
  ASSERT_TRUE(s.ok()) << what << ": " << s.ToString();
  ASSERT_TRUE(std::equal(back.begin(), back.end(), raw.begin(), raw.end())) << what << ": bytes differ";
}

// Pieces tile [0, len) in order, none empty, and two metadata pieces are
// never adjacent (the encoder would have merged them).
void ExpectCover(const std::vector<ChunkPiece>& pieces, uint64_t len) {
  uint64_t pos = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_EQ(pieces[i].begin, pos) << "piece " << i;
    EXPECT_LT(pieces[i].begin, pieces[i].end) << "piece " << i;
    if (i > 0) {
      EXPECT_FALSE(pieces[i].dtype == DType::kUnknown && pieces[i - 1].dtype == DType::kUnknown) << "piece " << i;
    }
    pos = pieces[i].end;
  }
  EXPECT_EQ(pos, len);
}

// ---- CutChunk ----------------------------------------------------------------

TEST(CutChunkTest, PiecesCoverTheChunkInOrder) {
  FileBuilder f = MixedFile();
  for (uint64_t chunk : {uint64_t{4099}, uint64_t{65536}, uint64_t{100003}, uint64_t{f.bytes.size()}}) {
    for (uint64_t off = 0; off < f.bytes.size(); off += chunk) {
      const uint64_t len = std::min<uint64_t>(chunk, f.bytes.size() - off);
      auto ranges = RangesOverlapping(f.ranges, off, off + len);
      std::vector<ChunkPiece> pieces = CutChunk(off, len, ranges);
      SCOPED_TRACE("chunk size " + std::to_string(chunk) + " at " + std::to_string(off));
      ExpectCover(pieces, len);
      for (const ChunkPiece& p : pieces) {
        if (p.dtype == DType::kUnknown) continue;
        EXPECT_GE(p.end - p.begin, kMinPiece);
        // The piece lies inside a range of its dtype and starts on an element.
        bool found = false;
        for (const TensorRange& r : f.ranges) {
          if (r.offset <= off + p.begin && off + p.end <= r.offset + r.length) {
            found = true;
            EXPECT_EQ(r.dtype, p.dtype);
            EXPECT_EQ((off + p.begin - r.offset) % DTypeSize(r.dtype), 0u);
          }
        }
        EXPECT_TRUE(found) << "piece [" << p.begin << ", " << p.end << ")";
      }
    }
  }
  EXPECT_TRUE(CutChunk(0, 0, f.ranges).empty());
  std::vector<ChunkPiece> none = CutChunk(0, 1000, {});
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0].dtype, DType::kUnknown);
  EXPECT_EQ(none[0].end, 1000u);
}

TEST(CutChunkTest, TensorStartingBeforeTheChunkIsCutOnAnElement) {
  const uint64_t off = 1 << 20, len = 65536;
  struct Case {
    DType t;
    uint64_t starts_before;  // bytes of the tensor before the chunk
    uint64_t want_begin;     // chunk-relative start of the tensor piece
  };
  for (Case c : {Case{DType::kF32, 6, 2}, Case{DType::kF32, 8, 0}, Case{DType::kF32, 1, 3}, Case{DType::kF64, 3, 5},
                 Case{DType::kF64, 9, 7}, Case{DType::kBF16, 1, 1}, Case{DType::kF16, 2, 0}, Case{DType::kC64, 12, 4},
                 Case{DType::kC128, 17, 15}, Case{DType::kU8, 5, 0}}) {
    SCOPED_TRACE(std::string(DTypeName(c.t)) + " starting " + std::to_string(c.starts_before) + " bytes early");
    std::vector<TensorRange> r = {{off - c.starts_before, 100000, c.t}};
    std::vector<ChunkPiece> p = CutChunk(off, len, r);
    ExpectCover(p, len);
    if (c.want_begin == 0) {
      ASSERT_EQ(p.size(), 1u);
    } else {
      ASSERT_EQ(p.size(), 2u);
      EXPECT_EQ(p[0].dtype, DType::kUnknown);
      EXPECT_EQ(p[0].end, c.want_begin);
    }
    EXPECT_EQ(p.back().dtype, c.t);
    EXPECT_EQ(p.back().begin, c.want_begin);
    EXPECT_EQ(p.back().end, len);
    EXPECT_EQ((off + p.back().begin - r[0].offset) % DTypeSize(c.t), 0u);
  }
  // A tensor starting inside the chunk at an odd offset needs no adjustment.
  std::vector<TensorRange> r = {{off + 7, 20000, DType::kF32}};
  std::vector<ChunkPiece> p = CutChunk(off, len, r);
  ExpectCover(p, len);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[1].begin, 7u);
  EXPECT_EQ(p[1].end, 20007u);
  EXPECT_EQ(p[1].dtype, DType::kF32);
}

TEST(CutChunkTest, TensorEndingPastTheChunkKeepsAPartialElement) {
  // The chunk ends 3 bytes into an f32 element: the piece runs to the end of
  // the chunk, and the element codec stores the 3 bytes as its tail.
  std::vector<TensorRange> r = {{10, 100000, DType::kF32}};
  std::vector<ChunkPiece> p = CutChunk(0, 50001, r);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[1].begin, 10u);
  EXPECT_EQ(p[1].end, 50001u);
  EXPECT_EQ((p[1].end - p[1].begin) % 4, 3u);
  // The next chunk starts with the element's last byte as metadata.
  p = CutChunk(50001, 60000, r);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].dtype, DType::kUnknown);
  EXPECT_EQ(p[0].end, 1u);
  EXPECT_EQ(p[1].begin, 1u);
  EXPECT_EQ(p[1].end, 100010u - 50001u);
  EXPECT_EQ(p[2].dtype, DType::kUnknown);
}

TEST(CutChunkTest, TinyTensorPiecesStayMetadata) {
  const uint64_t len = 65536;
  auto only_meta = [&](uint64_t off, std::vector<TensorRange> r) {
    std::vector<ChunkPiece> p = CutChunk(off, len, r);
    return p.size() == 1 && p[0].dtype == DType::kUnknown && p[0].end == len;
  };
  EXPECT_TRUE(only_meta(0, {{100, kMinPiece - 1, DType::kF32}}));
  EXPECT_FALSE(only_meta(0, {{100, kMinPiece, DType::kF32}}));
  // A big tensor that only overlaps the chunk a little.
  EXPECT_TRUE(only_meta(1 << 20, {{0, (1 << 20) + 100, DType::kBF16}}));
  EXPECT_TRUE(only_meta(1 << 20, {{(1 << 20) + len - 100, 1 << 20, DType::kBF16}}));
  // Alignment can push a piece under the minimum: 4100 bytes overlap, the
  // first whole f64 element is 7 bytes in.
  EXPECT_TRUE(only_meta(1 << 20, {{(1 << 20) - 1, 4101, DType::kF64}}));
  EXPECT_FALSE(only_meta(1 << 20, {{(1 << 20) - 1, 4111, DType::kF64}}));
  // Ranges entirely outside the chunk, and empty ones.
  EXPECT_TRUE(only_meta(1 << 20, {{0, 1 << 20, DType::kF32}, {(1 << 20) + len, 1 << 20, DType::kF32}}));
  EXPECT_TRUE(only_meta(0, {{500, 0, DType::kF32}}));
  // Several small tensors in a row stay one metadata piece.
  std::vector<TensorRange> small;
  for (uint64_t o = 0; o < len; o += 4000) small.push_back({o, 3000, DType::kF16});
  EXPECT_TRUE(only_meta(0, small));
}

TEST(CutChunkTest, OverlappingRangesKeepTheFirst) {
  std::vector<TensorRange> r = {{0, 20000, DType::kF32}, {10000, 30000, DType::kBF16}};
  std::vector<ChunkPiece> p = CutChunk(0, 65536, r);
  ExpectCover(p, 65536);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].dtype, DType::kF32);
  EXPECT_EQ(p[0].end, 20000u);
  EXPECT_EQ(p[1].dtype, DType::kUnknown);
  // The same start twice: the first wins, the second is dropped.
  r = {{1000, 8000, DType::kF16}, {1000, 8000, DType::kF64}, {20000, 8000, DType::kI64}};
  p = CutChunk(0, 65536, r);
  ExpectCover(p, 65536);
  ASSERT_EQ(p.size(), 5u);
  EXPECT_EQ(p[1].dtype, DType::kF16);
  EXPECT_EQ(p[3].dtype, DType::kI64);
  Bytes raw = TensorBytes(DType::kF32, 65536 / 4, 1);
  ExpectRoundTrip(raw, 0, r, "overlapping ranges");
}

// ---- RangesOverlapping -------------------------------------------------------

TEST(RangesOverlappingTest, BinarySearchEdges) {
  const std::vector<TensorRange> r = {
      {100, 100, DType::kF32}, {200, 100, DType::kF16}, {400, 100, DType::kBF16}, {1000, 1, DType::kU8}};
  auto span = [&](uint64_t b, uint64_t e) {
    std::span<const TensorRange> s = RangesOverlapping(r, b, e);
    if (!s.empty()) {
      EXPECT_TRUE(s.data() >= r.data() && s.data() + s.size() <= r.data() + r.size());
    }
    return std::make_pair(s.empty() ? -1 : static_cast<int>(s.data() - r.data()), static_cast<int>(s.size()));
  };
  using P = std::pair<int, int>;
  EXPECT_EQ(span(0, 100), P(-1, 0));  // ends where the first begins
  EXPECT_EQ(span(0, 101), P(0, 1));
  EXPECT_EQ(span(199, 200), P(0, 1));
  EXPECT_EQ(span(199, 201), P(0, 2));
  EXPECT_EQ(span(200, 201), P(1, 1));   // the first ends exactly at begin
  EXPECT_EQ(span(200, 400), P(1, 1));   // the third begins exactly at end
  EXPECT_EQ(span(300, 400), P(-1, 0));  // in the gap
  EXPECT_EQ(span(299, 401), P(1, 2));
  EXPECT_EQ(span(499, 1000), P(2, 1));
  EXPECT_EQ(span(500, 1000), P(-1, 0));
  EXPECT_EQ(span(1000, 1001), P(3, 1));
  EXPECT_EQ(span(1001, 5000), P(-1, 0));
  EXPECT_EQ(span(0, UINT64_MAX), P(0, 4));
  EXPECT_EQ(span(150, 450), P(0, 3));
  EXPECT_TRUE(RangesOverlapping({}, 0, UINT64_MAX).empty());
  const std::vector<TensorRange> one = {{0, 1, DType::kU8}};
  EXPECT_EQ(RangesOverlapping(one, 0, 1).size(), 1u);
  EXPECT_TRUE(RangesOverlapping(one, 1, 2).empty());
}

TEST(RangesOverlappingTest, MatchesALinearScan) {
  std::mt19937_64 rng(42);
  std::vector<TensorRange> r;
  uint64_t pos = 0;
  for (int i = 0; i < 200; ++i) {
    pos += rng() % 50;  // gaps, sometimes none
    uint64_t len = 1 + rng() % 100;
    r.push_back({pos, len, DType::kF32});
    pos += len;
  }
  for (int q = 0; q < 5000; ++q) {
    uint64_t b = rng() % (pos + 100), e = b + 1 + rng() % 300;
    std::span<const TensorRange> got = RangesOverlapping(r, b, e);
    std::vector<size_t> want;
    for (size_t i = 0; i < r.size(); ++i) {
      if (r[i].offset < e && b < r[i].offset + r[i].length) want.push_back(i);
    }
    ASSERT_EQ(got.size(), want.size()) << "[" << b << ", " << e << ")";
    if (!want.empty()) {
      ASSERT_EQ(static_cast<size_t>(got.data() - r.data()), want[0]);
    }
  }
}

TEST(TensorRangesOfTest, DropsUnknownAndSmallAndSorts) {
  FileLayout l;
  l.format = "test";
  l.tensors.push_back({"b", DType::kBF16, {}, 50000, 8192, "", 0});
  l.tensors.push_back({"a", DType::kF32, {}, 1000, kMinPiece, "", 0});
  l.tensors.push_back({"tiny", DType::kF32, {}, 6000, kMinPiece - 1, "", 0});
  l.tensors.push_back({"opaque", DType::kUnknown, {}, 70000, 100000, "", 0});
  std::vector<TensorRange> r = TensorRangesOf(l);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].offset, 1000u);
  EXPECT_EQ(r[0].dtype, DType::kF32);
  EXPECT_EQ(r[1].offset, 50000u);
  EXPECT_EQ(r[1].length, 8192u);
  EXPECT_EQ(r[1].dtype, DType::kBF16);
  EXPECT_TRUE(TensorRangesOf(FileLayout{}).empty());
}

// ---- round trips ---------------------------------------------------------------

TEST(TensorChunkTest, MixedChunksRoundTripBitExact) {
  FileBuilder f = MixedFile();
  std::set<DType> coded;  // dtypes that went through the plane codec
  bool cut_start = false, cut_end = false, split_seen = false;
  for (uint64_t chunk : {uint64_t{4099}, uint64_t{65536}, uint64_t{100003}, uint64_t{f.bytes.size()}}) {
    for (uint64_t off = 0; off < f.bytes.size(); off += chunk) {
      const uint64_t len = std::min<uint64_t>(chunk, f.bytes.size() - off);
      std::span<const uint8_t> raw(f.bytes.data() + off, len);
      auto ranges = RangesOverlapping(f.ranges, off, off + len);
      const std::string what = "chunk size " + std::to_string(chunk) + " at " + std::to_string(off);
      ExpectRoundTrip(raw, off, ranges, what);

      // What the chunk exercised.
      std::vector<ChunkPiece> pieces = CutChunk(off, len, ranges);
      Bytes payload = Encode(raw, off, ranges);
      std::vector<Segment> segs = ParseSegments(payload);
      ASSERT_EQ(segs.size(), pieces.size()) << what;
      for (size_t i = 0; i < pieces.size(); ++i) {
        const ChunkPiece& p = pieces[i];
        EXPECT_EQ(segs[i].raw_len, p.end - p.begin);
        if (p.dtype == DType::kUnknown) {
          EXPECT_NE(segs[i].kind, SegmentKind::kTensor) << what << " piece " << i;
          continue;
        }
        EXPECT_EQ(segs[i].kind, SegmentKind::kTensor) << what << " piece " << i;
        coded.insert(p.dtype);
        for (const TensorRange& r : ranges) {
          if (r.offset > off + p.begin || off + p.end > r.offset + r.length) continue;
          cut_start |= r.offset < off && (off - r.offset) % DTypeSize(r.dtype) != 0;
          cut_end |= p.end == len && (off + len - r.offset) % DTypeSize(r.dtype) != 0;
        }
        // The default thresholds keep the split for strong gains; a low one
        // exercises it (and its decoder) on this data too.
        lossless::EncodeStats stats;
        Bytes blob;
        auto bytes = raw.subspan(p.begin, p.end - p.begin);
        ASSERT_TRUE(lossless::EncodeTensorBytes(p.dtype, bytes, {.split_min_gain_bits = 0.02}, &blob, &stats).ok());
        for (const auto& ps : stats.planes) split_seen |= ps.method == lossless::PlaneMethod::kSplit;
        Bytes back(bytes.size());
        ASSERT_TRUE(lossless::DecodeTensorBytes(blob, back).ok()) << what;
        EXPECT_TRUE(std::equal(back.begin(), back.end(), bytes.begin())) << what << " piece " << i;
      }
    }
  }
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kI64, DType::kU8, DType::kC64,
                  DType::kI32, DType::kU16, DType::kBool, DType::kF8E4M3, DType::kC128}) {
    EXPECT_TRUE(coded.count(t)) << DTypeName(t) << " never coded as a tensor";
  }
  EXPECT_TRUE(cut_start) << "no chunk started inside an element";
  EXPECT_TRUE(cut_end) << "no chunk ended inside an element";
  EXPECT_TRUE(split_seen) << "no plane used the exponent split";
}

TEST(TensorChunkTest, TensorSpanningTheChunkBoundary) {
  // f32 tensor at file offset 10 cut by a chunk boundary at 50001: both
  // chunks decode, and together they give back the file.
  Bytes file = CompressibleBytes(10, 1);
  Bytes t = TensorBytes(DType::kF32, 25000, 2);
  file.insert(file.end(), t.begin(), t.end());
  Bytes tail = CompressibleBytes(1990, 3);
  file.insert(file.end(), tail.begin(), tail.end());
  const std::vector<TensorRange> r = {{10, t.size(), DType::kF32}};
  const uint64_t boundary = 50001;
  Bytes joined;
  for (uint64_t off : {uint64_t{0}, boundary}) {
    const uint64_t len = off == 0 ? boundary : file.size() - boundary;
    std::span<const uint8_t> raw(file.data() + off, len);
    auto ranges = RangesOverlapping(r, off, off + len);
    ASSERT_EQ(ranges.size(), 1u);
    Bytes payload = Encode(raw, off, ranges);
    std::vector<Segment> segs = ParseSegments(payload);
    size_t tensors = 0;
    for (const Segment& s : segs) tensors += s.kind == SegmentKind::kTensor;
    EXPECT_EQ(tensors, 1u);
    Bytes back(len);
    Status s = DecodeTensorChunk(payload, back);
    ASSERT_TRUE(s.ok()) << s.ToString();
    joined.insert(joined.end(), back.begin(), back.end());
  }
  EXPECT_EQ(joined, file);
}

TEST(TensorChunkTest, EdgeCases) {
  // Empty chunk.
  Bytes payload = Encode({}, 0, {});
  EXPECT_EQ(payload, (Bytes{kTensorChunkVersion, 0}));
  EXPECT_TRUE(DecodeTensorChunk(payload, {}).ok());
  // No ranges: one metadata segment.
  Bytes meta = CompressibleBytes(10000, 4);
  payload = Encode(meta, 0, {});
  std::vector<Segment> segs = ParseSegments(payload);
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].kind, SegmentKind::kZstdBytes);
  ExpectRoundTrip(meta, 0, {}, "metadata only");
  // Incompressible metadata is stored raw.
  Bytes rnd = RandomBytes(3000, 5);
  segs = ParseSegments(Encode(rnd, 0, {}));
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].kind, SegmentKind::kRawBytes);
  ExpectRoundTrip(rnd, 0, {}, "random metadata");
  // A chunk that is one tensor exactly; a tensor of zeros; a tensor of
  // random bytes (all planes raw); one element short of a whole chunk.
  for (DType t : {DType::kF32, DType::kBF16, DType::kF64, DType::kU8}) {
    Bytes v = TensorBytes(t, 20000, 6);
    std::vector<TensorRange> r = {{0, v.size(), t}};
    ExpectRoundTrip(v, 0, r, std::string(DTypeName(t)) + " whole chunk");
    Bytes zeros(v.size(), 0);
    ExpectRoundTrip(zeros, 0, r, std::string(DTypeName(t)) + " zeros");
    Bytes noise = RandomBytes(v.size(), 7);
    ExpectRoundTrip(noise, 0, r, std::string(DTypeName(t)) + " noise");
    v.pop_back();
    ExpectRoundTrip(v, 0, r, std::string(DTypeName(t)) + " short by a byte");
  }
  // Special float values are bit-exact.
  Bytes specials;
  const uint32_t kSpecial[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
                               0x7fa00001, 0xffffffff, 0x00000001, 0x807fffff, 0x3f800000};
  for (int i = 0; i < 2000; ++i) PutLE(&specials, kSpecial[i % 10], 4);
  ExpectRoundTrip(specials, 0, std::vector<TensorRange>{{0, specials.size(), DType::kF32}}, "special floats");
  // Wrong output size.
  Bytes v = TensorBytes(DType::kF32, 5000, 8);
  payload = Encode(v, 0, std::vector<TensorRange>{{0, v.size(), DType::kF32}});
  Bytes small(v.size() - 1), big(v.size() + 1);
  EXPECT_EQ(DecodeTensorChunk(payload, small).code(), EIO);
  EXPECT_EQ(DecodeTensorChunk(payload, big).code(), EIO);
}

TEST(TensorChunkTest, OptionsStillRoundTrip) {
  FileBuilder f = MixedFile();
  for (TensorChunkOptions opts :
       {TensorChunkOptions{1, {.allow_zstd = false}}, TensorChunkOptions{19, {.allow_rans = false}},
        TensorChunkOptions{3, {.allow_split = false}}, TensorChunkOptions{3, {.zstd_level = 3}}}) {
    Bytes payload = Encode(f.bytes, 0, f.ranges, opts);
    Bytes back(f.bytes.size());
    Status s = DecodeTensorChunk(payload, back);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(back, f.bytes);
  }
}

// ---- EncodeChunk -----------------------------------------------------------------

TEST(TensorChunkTest, EncodeChunkChoosesTensorForTensorChunks) {
  Bytes v = TensorBytes(DType::kF32, 65536, 9);
  const uint64_t off = 4 << 20;
  std::vector<TensorRange> r = {{off - 2, v.size() + 2, DType::kF32}};
  Bytes out, plain;
  ASSERT_EQ(EncodeChunk(v, {}, &out, off, r), ChunkCodec::kTensor);
  EXPECT_LT(out.size(), v.size());
  // Without ranges (or with the codec off) the chunk is plain zstd, and
  // larger: the point of the tensor codec.
  EXPECT_EQ(EncodeChunk(v, {}, &plain, off), ChunkCodec::kZstd);
  EXPECT_LT(out.size(), plain.size());
  Bytes off_out;
  ChunkEncoderOptions no_tensor;
  no_tensor.tensor_codec = false;
  EXPECT_EQ(EncodeChunk(v, no_tensor, &off_out, off, r), ChunkCodec::kZstd);
  EXPECT_EQ(off_out, plain);
  Bytes back(v.size());
  ASSERT_TRUE(DecodeChunk(ChunkCodec::kTensor, out, back).ok());
  EXPECT_EQ(back, v);
  // The stale contents of `out` are replaced, not appended to.
  Bytes reused(100, 0x55);
  ASSERT_EQ(EncodeChunk(v, {}, &reused, off, r), ChunkCodec::kTensor);
  EXPECT_EQ(reused, out);
}

TEST(TensorChunkTest, EncodeChunkKeepsZeroAndRawChoices) {
  std::vector<TensorRange> r = {{0, 1 << 20, DType::kBF16}};
  Bytes zeros(65536, 0), out(7, 1);
  EXPECT_EQ(EncodeChunk(zeros, {}, &out, 0, r), ChunkCodec::kZero);
  EXPECT_TRUE(out.empty());
  // A tensor of noise: the tensor payload is not smaller than the chunk, so
  // it is stored raw.
  Bytes noise = RandomBytes(65536, 10);
  EXPECT_EQ(EncodeChunk(noise, {}, &out, 0, r), ChunkCodec::kRaw);
  EXPECT_EQ(out, noise);
  // Mostly metadata: whatever is chosen decodes.
  Bytes meta = CompressibleBytes(65536, 11);
  ChunkCodec c = EncodeChunk(meta, {}, &out, 0, r);
  Bytes back(meta.size());
  ASSERT_TRUE(DecodeChunk(c, out, back).ok());
  EXPECT_EQ(back, meta);
  EXPECT_STREQ(ChunkCodecName(ChunkCodec::kTensor), "tensor");
}

// ---- malformed payloads ----------------------------------------------------------

// A small mixed chunk: zstd metadata, an f32 tensor, raw metadata.
struct SmallPayload {
  Bytes raw;
  Bytes payload;
  SmallPayload() {
    FileBuilder f;
    f.Meta(700, 1);
    f.Tensor(DType::kF32, 1500, 2);
    f.Raw(RandomBytes(40, 3));
    f.Tensor(DType::kBF16, 2100, 4);
    f.Meta(33, 5);
    raw = f.bytes;
    payload = Encode(raw, 0, f.ranges);
  }
};

Status Decode(std::span<const uint8_t> payload, size_t raw_size) {
  Bytes out(raw_size);
  return DecodeTensorChunk(payload, out);
}

void ExpectCorrupt(const Status& s, const std::string& needle, const std::string& what) {
  EXPECT_FALSE(s.ok()) << what;
  EXPECT_EQ(s.code(), EIO) << what << ": " << s.ToString();
  EXPECT_NE(s.message().find(needle), std::string::npos) << what << ": " << s.message();
}

TEST(TensorChunkMalformedTest, EveryTruncationIsCorruption) {
  SmallPayload p;
  std::vector<Segment> segs = ParseSegments(p.payload);
  ASSERT_EQ(segs.size(), 5u);
  EXPECT_EQ(segs[1].kind, SegmentKind::kTensor);
  EXPECT_EQ(segs[3].kind, SegmentKind::kTensor);
  for (size_t len = 0; len < p.payload.size(); ++len) {
    Status s = Decode(std::span<const uint8_t>(p.payload).first(len), p.raw.size());
    ASSERT_FALSE(s.ok()) << "truncated to " << len;
    ASSERT_EQ(s.code(), EIO) << "truncated to " << len << ": " << s.ToString();
  }
  Bytes longer = p.payload;
  longer.push_back(0);
  ExpectCorrupt(Decode(longer, p.raw.size()), "bytes left after the last segment", "one byte appended");
  ASSERT_TRUE(Decode(p.payload, p.raw.size()).ok());
}

TEST(TensorChunkMalformedTest, FlippedBytesFailCleanly) {
  SmallPayload p;
  size_t detected = 0, total = 0;
  for (size_t pos = 0; pos < p.payload.size(); ++pos) {
    for (uint8_t mask : {0x01, 0x10, 0x80, 0xff}) {
      Bytes bad = p.payload;
      bad[pos] ^= mask;
      Bytes out(p.raw.size());
      Status s = DecodeTensorChunk(bad, out);
      ++total;
      if (!s.ok()) {
        ++detected;
        ASSERT_EQ(s.code(), EIO) << "flip at " << pos << ": " << s.ToString();
      }
    }
  }
  // Raw bytes carry no checksum of their own (the pack's raw checksum catches
  // those); every flip in the segment table must be caught.
  EXPECT_GT(detected, 0u);
  std::vector<Segment> segs = ParseSegments(p.payload);
  for (size_t pos = 0; pos < segs[0].payload_offset; ++pos) {
    for (uint8_t mask : {0x01, 0x02, 0x40, 0x80}) {
      Bytes bad = p.payload;
      bad[pos] ^= mask;
      Bytes out(p.raw.size());
      Status s = DecodeTensorChunk(bad, out);
      if (s.ok()) {
        EXPECT_NE(out, p.raw) << "header flip at " << pos << " decoded to the original";
      }
    }
  }
  std::printf("  %zu of %zu single-byte flips detected by the decoder\n", detected, total);

  // A payload with big planes (rANS, zstd, exponent split): random damage.
  FileBuilder f;
  f.Meta(300, 6);
  f.Tensor(DType::kBF16, 40000, 7);
  f.Tensor(DType::kF32, 36000, 8);
  Bytes big = Encode(f.bytes, 0, f.ranges);
  std::mt19937_64 rng(9);
  for (int i = 0; i < 400; ++i) {
    Bytes bad = big;
    int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
    Status s = Decode(bad, f.bytes.size());
    if (!s.ok()) {
      ASSERT_EQ(s.code(), EIO) << s.ToString();
    }
  }
}

TEST(TensorChunkMalformedTest, BadVersion) {
  SmallPayload p;
  for (uint8_t v : {0, 2, 0xB2, 0xff}) {
    Bytes bad = p.payload;
    bad[0] = v;
    ExpectCorrupt(Decode(bad, p.raw.size()), "tensor chunk version " + std::to_string(v) + " is not supported",
                  "version " + std::to_string(v));
  }
  ExpectCorrupt(Decode({}, 10), "truncated", "empty payload");
  ExpectCorrupt(Decode({}, 0), "truncated", "empty payload, empty chunk");
}

TEST(TensorChunkMalformedTest, SegmentCountTooLarge) {
  // More segments than descriptor bytes.
  Bytes b = {kTensorChunkVersion};
  lossless::PutVarint(&b, 1000);
  for (int i = 0; i < 10; ++i) b.insert(b.end(), {0, 1, 1});
  b.insert(b.end(), 10, 'x');
  ExpectCorrupt(Decode(b, 1000), "segment count too large", "count 1000");
  // More segments than bytes in the chunk (every segment could be 1 byte).
  b = {kTensorChunkVersion, 3, 0, 1, 1, 0, 1, 1, 0, 1, 1, 'a', 'b', 'c'};
  ExpectCorrupt(Decode(b, 2), "segment count too large", "3 segments, 2 bytes");
  ASSERT_TRUE(Decode(b, 3).ok());
  // Absurd counts, and a count whose varint overflows.
  for (uint64_t n : {uint64_t{1} << 32, uint64_t{1} << 63, ~uint64_t{0}}) {
    b = {kTensorChunkVersion};
    lossless::PutVarint(&b, n);
    b.insert(b.end(), {0, 1, 1, 'a'});
    ExpectCorrupt(Decode(b, 1), "segment count too large", "count " + std::to_string(n));
  }
  b = {kTensorChunkVersion, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 1, 1, 'a'};
  ExpectCorrupt(Decode(b, 1), "varint overflow", "overflowing count");
}

TEST(TensorChunkMalformedTest, SegmentsMustCoverTheChunk) {
  // One raw segment of 9 bytes for a 10-byte chunk.
  Bytes b = {kTensorChunkVersion, 1, 0, 9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  ExpectCorrupt(Decode(b, 10), "segments do not cover the chunk", "short");
  ASSERT_TRUE(Decode(b, 9).ok());
  ExpectCorrupt(Decode(b, 8), "segments exceed the chunk", "long");
  // No segments at all.
  ExpectCorrupt(Decode(Bytes{kTensorChunkVersion, 0}, 10), "segments do not cover the chunk", "none");
  // Two segments whose raw lengths overflow when added.
  b = {kTensorChunkVersion, 2, 0, 5, 5};
  b.push_back(0);
  lossless::PutVarint(&b, ~uint64_t{0} - 2);
  b.push_back(1);
  b.insert(b.end(), 6, 'z');
  ExpectCorrupt(Decode(b, 10), "segments exceed the chunk", "overflowing lengths");
}

// Zero runs inside a tensor become zero segments that store nothing.
TEST(TensorChunkTest, ZeroRunsInsideTensorsAreFree) {
  Bytes raw = TensorBytes(DType::kF32, 256 * 1024, 21);  // 1 MiB of normal floats
  std::fill(raw.begin() + 100000, raw.begin() + 900000, 0);
  const std::vector<TensorRange> ranges = {{0, raw.size(), DType::kF32}};
  Bytes payload = Encode(raw, 0, ranges);
  bool saw_zero = false;
  for (const Segment& s : ParseSegments(payload)) saw_zero |= s.kind == SegmentKind::kZero && s.stored_len == 0;
  EXPECT_TRUE(saw_zero);
  EXPECT_LT(payload.size(), 240000u);  // ~230 KB of floats left, at ~1.2x
  Bytes back(raw.size());
  ASSERT_TRUE(DecodeTensorChunk(payload, back).ok());
  EXPECT_EQ(back, raw);
}

TEST(TensorChunkMalformedTest, BadSegments) {
  const Bytes data = {1, 2, 3, 4, 5, 6, 7, 8};
  // Unknown kind.
  Bytes b = {kTensorChunkVersion, 1, 4, 8, 8};
  b.insert(b.end(), data.begin(), data.end());
  ExpectCorrupt(Decode(b, 8), "segment kind 4", "kind 4");
  // Zero segment that stores bytes.
  b = {kTensorChunkVersion, 1, 3, 8, 8};
  b.insert(b.end(), data.begin(), data.end());
  ExpectCorrupt(Decode(b, 8), "zero segment stores bytes", "zero with payload");
  // Raw segment whose stored length differs from its raw length.
  b = {kTensorChunkVersion, 1, 0, 8, 7};
  b.insert(b.end(), data.begin(), data.end() - 1);
  ExpectCorrupt(Decode(b, 8), "raw segment length mismatch", "raw 8 stored 7");
  // Stored length past the end of the payload.
  b = {kTensorChunkVersion, 1, 0, 8, 9};
  b.insert(b.end(), data.begin(), data.end());
  ExpectCorrupt(Decode(b, 8), "truncated", "stored past the end");
  // A zstd segment that is not zstd: the error names the segment and offset.
  b = {kTensorChunkVersion, 2, 0, 4, 4, 1, 4, 4, 1, 2, 3, 4, 5, 6, 7, 8};
  ExpectCorrupt(Decode(b, 8), "segment 1 at chunk byte 4", "garbage zstd");
  // A tensor segment that is not a plane blob.
  b = {kTensorChunkVersion, 1, 2, 8, 8};
  b.insert(b.end(), data.begin(), data.end());
  ExpectCorrupt(Decode(b, 8), "not a lossless tensor blob", "garbage tensor blob");
  // A valid plane blob under the wrong raw length.
  Bytes v = TensorBytes(DType::kF32, 2000, 12);
  Bytes blob;
  ASSERT_TRUE(lossless::EncodeTensorBytes(DType::kF32, v, {}, &blob).ok());
  for (int delta : {-1, 1}) {
    b = {kTensorChunkVersion, 1, 2};
    lossless::PutVarint(&b, v.size() + delta);
    lossless::PutVarint(&b, blob.size());
    b.insert(b.end(), blob.begin(), blob.end());
    ExpectCorrupt(Decode(b, v.size() + delta), "segment 0", "blob under raw length " + std::to_string(delta));
  }
  // The same blob under the right length decodes (the hand-built framing is right).
  b = {kTensorChunkVersion, 1, 2};
  lossless::PutVarint(&b, v.size());
  lossless::PutVarint(&b, blob.size());
  b.insert(b.end(), blob.begin(), blob.end());
  Bytes out(v.size());
  ASSERT_TRUE(DecodeTensorChunk(b, out).ok());
  EXPECT_EQ(out, v);
}

// ---- end to end: safetensors -> layout -> pack -> read back ------------------------

class TensorPackTest : public ::testing::Test {
 protected:
  Result<PackStats> WritePackOf(const Bytes& content, uint32_t chunk_size, std::span<const TensorRange> tensors,
                                const ChunkEncoderOptions& opts = {}) {
    test::WriteFileBytes(dir_.Sub("src"), content);
    ASSIGN_OR_RETURN(UniqueFd src, env_->OpenAt(AT_FDCWD, dir_.Sub("src"), O_RDONLY));
    ASSIGN_OR_RETURN(UniqueFd dst, env_->OpenAt(AT_FDCWD, dir_.Sub("p"), O_CREAT | O_TRUNC | O_RDWR, 0644));
    return WritePack(env_, src.get(), content.size(), dst.get(), chunk_size, opts, nullptr, tensors);
  }
  Result<std::shared_ptr<PackReader>> Open() {
    ASSIGN_OR_RETURN(UniqueFd fd, env_->OpenAt(AT_FDCWD, dir_.Sub("p"), O_RDONLY));
    return PackReader::Open(env_, std::move(fd), "p");
  }
  Result<Bytes> ReadAll(const PackReader& r) {
    Bytes out, chunk;
    for (uint64_t i = 0; i < r.chunks().size(); ++i) {
      RETURN_IF_ERROR(r.ReadChunk(i, &chunk));
      out.insert(out.end(), chunk.begin(), chunk.end());
    }
    return out;
  }

  Env* env_ = Env::Default();
  test::TempDir dir_;
};

TEST_F(TensorPackTest, SafetensorsFileSealsWithTensorChunks) {
  // A small model: embeddings in bf16 (an odd count, so the next tensor
  // starts off its element alignment), f32 weights, a tiny bias (stays
  // metadata), an f16 tensor, and an i64 step counter.
  std::vector<test::SafetensorsTensor> entries = {
      {"model.embed_tokens.weight", "BF16", {301, 63}, TensorBytes(DType::kBF16, 301 * 63, 1)},
      {"model.layers.0.mlp.up_proj.weight", "F32", {96, 128}, TensorBytes(DType::kF32, 96 * 128, 2)},
      {"model.layers.0.mlp.up_proj.bias", "F32", {96}, TensorBytes(DType::kF32, 96, 3)},
      {"model.layers.0.attn.qkv.weight", "F16", {3, 40, 97}, TensorBytes(DType::kF16, 3 * 40 * 97, 4)},
      {"model.norm.weight", "F64", {1031}, TensorBytes(DType::kF64, 1031, 5)},
      {"step", "I64", {1}, TensorBytes(DType::kI64, 1, 6)},
  };
  const Bytes file = BuildSafetensors(entries);

  SpanSource src(file);
  FileLayout layout = DetectLayout(src);
  ASSERT_EQ(layout.format, "safetensors") << layout.note;
  ASSERT_EQ(layout.tensors.size(), entries.size());
  std::vector<TensorRange> ranges = TensorRangesOf(layout);
  ASSERT_EQ(ranges.size(), 4u);  // bias and step are too small
  EXPECT_EQ(ranges[0].dtype, DType::kBF16);
  EXPECT_EQ(ranges[1].dtype, DType::kF32);
  EXPECT_EQ(ranges[1].offset % 4, 2u);  // misaligned, as intended
  EXPECT_EQ(ranges[2].dtype, DType::kF16);
  EXPECT_EQ(ranges[3].dtype, DType::kF64);
  for (const TensorRange& r : ranges) ASSERT_LE(r.offset + r.length, file.size());

  for (uint32_t chunk_size : {16384u, 65536u, 1u << 20}) {
    SCOPED_TRACE("chunk size " + std::to_string(chunk_size));
    Result<PackStats> st = WritePackOf(file, chunk_size, ranges);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    Result<std::shared_ptr<PackReader>> r = Open();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ((*r)->header().version, kPackPlainVersion);
    std::map<ChunkCodec, int> codecs;
    for (const ChunkEntry& e : (*r)->chunks()) ++codecs[e.codec];
    EXPECT_GT(codecs[ChunkCodec::kTensor], 0);
    Result<Bytes> back = ReadAll(**r);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, file);
    EXPECT_TRUE((*r)->VerifyAll().ok());
    EXPECT_LT(st->stored_size, file.size());

    // The same file without the tensor codec: no kTensor chunk, and bigger.
    ChunkEncoderOptions no_tensor;
    no_tensor.tensor_codec = false;
    Result<PackStats> plain = WritePackOf(file, chunk_size, ranges, no_tensor);
    ASSERT_TRUE(plain.ok());
    r = Open();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (const ChunkEntry& e : (*r)->chunks()) EXPECT_NE(e.codec, ChunkCodec::kTensor);
    back = ReadAll(**r);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, file);
    EXPECT_LT(st->stored_size, plain->stored_size);
  }
}

TEST_F(TensorPackTest, UnknownFormatTakesTheGenericPath) {
  Bytes file = TensorBytes(DType::kF32, 50000, 7);  // floats, but no header
  FileLayout layout = DetectLayout(SpanSource(file));
  EXPECT_EQ(layout.format, "unknown");
  std::vector<TensorRange> ranges = TensorRangesOf(layout);
  EXPECT_TRUE(ranges.empty());
  ASSERT_TRUE(WritePackOf(file, 65536, ranges).ok());
  Result<std::shared_ptr<PackReader>> r = Open();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const ChunkEntry& e : (*r)->chunks()) EXPECT_NE(e.codec, ChunkCodec::kTensor);
  Result<Bytes> back = ReadAll(**r);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, file);
}

}  // namespace
}  // namespace ckptfs
