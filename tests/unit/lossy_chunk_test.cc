// The lossy chunk payload (codec/lossy/lossy_chunk_encode.cc,
// lossy_chunk_decode.cc): metadata exact and coded against the base when
// that is cheaper, tensors within the target, version 1 still read.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <span>
#include <vector>

#include "codec/lossless/byte_io.h"
#include "codec/lossy/lossy_chunk.h"
#include "codec/lossy/quantizer.h"
#include "tests/unit/lossy_test_util.h"
#include "tests/unit/test_util.h"

namespace ckptfs::lossy {
namespace {

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

// A torch.save-like chunk: `entries` tensors of `elems` f32 each, each
// after 64 bytes of zip local header. Returns the chunk and its segments
// (headers lossless, tensors lossy weights at 1%).
struct ZipLikeChunk {
  std::vector<uint8_t> raw;
  std::vector<ChunkSegment> segs;
  std::vector<TensorRange> ranges;  // at file offset 0
};

ZipLikeChunk MakeZipLikeChunk(size_t entries, size_t elems, uint32_t seed) {
  ZipLikeChunk c;
  std::mt19937 rng(seed);
  for (size_t e = 0; e < entries; ++e) {
    ChunkSegment h;
    h.begin = c.raw.size(), h.end = h.begin + 64;
    for (int i = 0; i < 64; ++i) c.raw.push_back(static_cast<uint8_t>(rng()));
    c.segs.push_back(h);
    const std::vector<uint8_t> t = Floats(Normal(elems, 0.02f, seed * 1000 + static_cast<uint32_t>(e)));
    ChunkSegment p;
    p.begin = c.raw.size(), p.end = p.begin + t.size(), p.lossy = true;
    p.spec = PieceSpec{DType::kF32, Domain::kValue, 0.01};
    p.role = TensorRole::kWeight;
    c.ranges.push_back({p.begin, t.size(), DType::kF32});
    c.raw.insert(c.raw.end(), t.begin(), t.end());
    c.segs.push_back(p);
  }
  return c;
}

// The bytes of a lossy chunk payload that are not its pieces' blobs.
uint64_t NonPieceBytes(const std::vector<uint8_t>& payload, std::span<const ChunkSegment> segs) {
  uint64_t pieces = 0;
  for (const ChunkSegment& s : segs) pieces += s.coded_lossy ? s.stored : 0;
  return payload.size() - pieces;
}

TEST(LossyChunk, SuccessorCodesItsMetadataAgainstTheBase) {
  constexpr size_t kEntries = 100;
  ZipLikeChunk first = MakeZipLikeChunk(kEntries, 1024, 1);
  std::vector<uint8_t> payload0;
  ASSERT_OK(EncodeLossyChunk(first.raw, {}, 0, first.ranges, first.segs, TensorChunkOptions{}, &payload0));
  const std::vector<uint8_t> base = first.raw;  // the reconstruction

  // The next checkpoint: new tensor values, the same headers but for a
  // 4-byte CRC field in each (what a lossy seal rewrites every time).
  ZipLikeChunk next = MakeZipLikeChunk(kEntries, 1024, 2);
  for (size_t e = 0; e < kEntries; ++e) {
    const ChunkSegment& h = next.segs[2 * e];
    std::copy(base.begin() + h.begin, base.begin() + h.end, next.raw.begin() + h.begin);
    for (int i = 0; i < 4; ++i) next.raw[h.begin + 14 + i] ^= static_cast<uint8_t>(0x5A + e + i);
  }
  std::vector<uint8_t> payload;
  bool against_base = false;
  ASSERT_OK(EncodeLossyChunk(next.raw, base, 0, next.ranges, next.segs, TensorChunkOptions{}, &payload, nullptr,
                             &against_base));
  EXPECT_TRUE(against_base);
  std::vector<uint8_t> out(next.raw.size());
  ASSERT_OK(DecodeLossyChunk(payload, base, out));
  EXPECT_EQ(out, next.raw);
  // Without the base it cannot be decoded, and says so.
  EXPECT_EQ(DecodeLossyChunk(payload, {}, out).code(), Status::Corruption("").code());

  // Alone, 64 random bytes per header cost at least their 6400 bytes. Against
  // the base only the 4 changed bytes per header are new: they are
  // incompressible, and each change costs a zstd sequence (a few bytes) to
  // place; 12 bytes per header and 16 per piece's descriptor (kind,
  // lengths) leave room for that and the run's framing.
  EXPECT_GT(NonPieceBytes(payload0, first.segs), 64 * kEntries);
  EXPECT_LT(NonPieceBytes(payload, next.segs), (12 + 16) * kEntries);
}

TEST(LossyChunk, UnrelatedBaseLeavesTheMetadataCodedAlone) {
  ZipLikeChunk c = MakeZipLikeChunk(8, 1024, 3);
  std::vector<uint8_t> base(c.raw.size());
  std::mt19937 rng(9);
  for (uint8_t& b : base) b = static_cast<uint8_t>(rng());
  // Headers of zeros: alone they cost nothing, against random bytes a lot.
  for (size_t e = 0; e < 8; ++e) std::fill_n(c.raw.begin() + c.segs[2 * e].begin, 64, 0);
  std::vector<uint8_t> payload;
  bool against_base = true;
  ASSERT_OK(EncodeLossyChunk(c.raw, base, 0, c.ranges, c.segs, TensorChunkOptions{}, &payload, nullptr, &against_base));
  EXPECT_FALSE(against_base);
  std::vector<uint8_t> out(c.raw.size());
  ASSERT_OK(DecodeLossyChunk(payload, base, out));
  EXPECT_EQ(out, c.raw);
}

TEST(LossyChunk, ExactPiecesAndTensorRangesCutBySegmentsRoundTrip) {
  // A float tensor that starts in the metadata segment and an exact
  // piece (a target no code meets) both go into the lossless run.
  ZipLikeChunk c = MakeZipLikeChunk(3, 4096, 4);
  c.segs[3].spec.target = -1;  // no code meets it: stays exact
  c.ranges.push_back({10, 40, DType::kF32});
  std::vector<uint8_t> base = c.raw;
  for (size_t i = 0; i < base.size(); i += 7) base[i] ^= 1;
  std::vector<uint8_t> payload;
  ASSERT_OK(EncodeLossyChunk(c.raw, base, 0, c.ranges, c.segs, TensorChunkOptions{}, &payload));
  EXPECT_FALSE(c.segs[3].coded_lossy);
  EXPECT_GT(c.segs[3].stored, 0u);  // its share of the run, for the statistics
  std::vector<uint8_t> out(c.raw.size());
  ASSERT_OK(DecodeLossyChunk(payload, base, out));
  EXPECT_EQ(out, c.raw);
}

TEST(LossyChunk, Version1PayloadsStillDecode) {
  // Version 1 (pack format 4): each segment's stored length, each lossless
  // segment its own tensor chunk blob.
  const std::vector<uint8_t> meta(100, 0xAB);
  const std::vector<uint8_t> tensor = Floats(Normal(1 << 12, 0.02f, 5));
  std::vector<uint8_t> piece(tensor.size()), blob_meta, blob_piece;
  ASSERT_OK(EncodeTensorChunk(meta, 0, {}, TensorChunkOptions{}, &blob_meta));
  PieceInput in{tensor, {}, {}, nullptr, nullptr, nullptr};
  ASSERT_TRUE(EncodePiece(PieceSpec{DType::kF32, Domain::kValue, 0.01}, in, &blob_piece, piece).ok());
  std::vector<uint8_t> v1 = {1, 2, 0};
  lossless::PutVarint(&v1, meta.size());
  lossless::PutVarint(&v1, blob_meta.size());
  v1.push_back(1);
  lossless::PutVarint(&v1, tensor.size());
  lossless::PutVarint(&v1, blob_piece.size());
  v1.insert(v1.end(), blob_meta.begin(), blob_meta.end());
  v1.insert(v1.end(), blob_piece.begin(), blob_piece.end());
  std::vector<uint8_t> out(meta.size() + tensor.size());
  ASSERT_OK(DecodeLossyChunk(v1, {}, out));
  EXPECT_TRUE(std::equal(meta.begin(), meta.end(), out.begin()));
  EXPECT_TRUE(std::equal(piece.begin(), piece.end(), out.begin() + meta.size()));
}

}  // namespace
}  // namespace ckptfs::lossy
