// Zip CRC upkeep for lossy mode: the CRC fields the parsers report for
// stored members, and the streaming CRC / chunked patch helpers. Archives
// are built here with real CRCs, rewritten, repaired and checked against
// zlib.
#include "codec/formats/zip_crc.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "codec/formats/layout.h"
#include "tests/unit/test_util.h"

namespace ckptfs::formats {
namespace {

using Bytes = std::vector<uint8_t>;
using test::ByteWriter;

uint32_t ZlibCrc(std::span<const uint8_t> d) { return uint32_t(crc32_z(0, d.data(), d.size())); }
uint32_t Get32(const Bytes& b, uint64_t off) {
  return uint32_t(b[off]) | uint32_t(b[off + 1]) << 8 | uint32_t(b[off + 2]) << 16 | uint32_t(b[off + 3]) << 24;
}

enum class Desc { kNone, kWithSig, kNoSig };
struct Member {
  std::string name;
  Bytes data;
  Desc desc = Desc::kNone;
  bool zip64 = false;     // sizes and offset saturated, carried in zip64 extras
  bool deflated = false;  // method 8 over opaque bytes
};

// A zip with true CRCs. Its offsets are relative to its first byte, so it
// can be appended to other bytes as DCP does.
Bytes BuildZip(const std::vector<Member>& members) {
  ByteWriter w;
  std::vector<uint64_t> local_offs;
  for (const Member& m : members) {
    local_offs.push_back(w.size());
    uint32_t crc = ZlibCrc(m.data);
    uint16_t flags = m.desc == Desc::kNone ? 0 : 8;
    uint32_t size = m.zip64 ? 0xFFFFFFFFu : uint32_t(m.data.size());
    w.U32(0x04034b50), w.U16(45), w.U16(flags), w.U16(m.deflated ? 8 : 0), w.U16(0), w.U16(0);
    // With a descriptor the local header's CRC and sizes may be zero.
    w.U32(flags ? 0 : crc), w.U32(flags ? 0 : size), w.U32(flags ? 0 : size);
    w.U16(uint16_t(m.name.size())), w.U16(m.zip64 ? 20 : 0), w.Str(m.name);
    if (m.zip64) w.U16(1), w.U16(16), w.U64(m.data.size()), w.U64(m.data.size());
    w.Raw(m.data);
    if (m.desc == Desc::kWithSig) w.U32(0x08074b50);
    if (m.desc != Desc::kNone) {
      w.U32(crc);
      if (m.zip64)
        w.U64(m.data.size()), w.U64(m.data.size());
      else
        w.U32(uint32_t(m.data.size())), w.U32(uint32_t(m.data.size()));
    }
  }
  uint64_t cd_start = w.size();
  for (size_t i = 0; i < members.size(); ++i) {
    const Member& m = members[i];
    uint32_t size = m.zip64 ? 0xFFFFFFFFu : uint32_t(m.data.size());
    w.U32(0x02014b50), w.U16(45), w.U16(45), w.U16(m.desc == Desc::kNone ? 0 : 8), w.U16(m.deflated ? 8 : 0);
    w.U16(0), w.U16(0), w.U32(ZlibCrc(m.data)), w.U32(size), w.U32(size);
    w.U16(uint16_t(m.name.size())), w.U16(m.zip64 ? 28 : 0), w.U16(0), w.U16(0), w.U16(0), w.U32(0);
    w.U32(m.zip64 ? 0xFFFFFFFFu : uint32_t(local_offs[i])), w.Str(m.name);
    if (m.zip64) w.U16(1), w.U16(24), w.U64(m.data.size()), w.U64(m.data.size()), w.U64(local_offs[i]);
  }
  uint64_t cd_size = w.size() - cd_start;
  // Zip64 end records, as torch writes them for every archive.
  uint64_t z64pos = w.size();
  w.U32(0x06064b50), w.U64(44), w.U16(45), w.U16(45), w.U32(0), w.U32(0);
  w.U64(members.size()), w.U64(members.size()), w.U64(cd_size), w.U64(cd_start);
  w.U32(0x07064b50), w.U32(0), w.U64(z64pos), w.U32(1);
  w.U32(0x06054b50), w.U16(0), w.U16(0), w.U16(0xFFFF), w.U16(0xFFFF), w.U32(0xFFFFFFFFu), w.U32(0xFFFFFFFFu);
  w.U16(0);
  return w.b;
}

Bytes Pattern(size_t n, uint8_t seed) {
  Bytes d(n);
  for (size_t i = 0; i < n; ++i) d[i] = uint8_t(seed * 31 + i * 7 + (i >> 8));
  return d;
}

std::vector<Member> TorchMembers(const std::string& archive) {
  // data.pkl is junk: the parser then keeps storages as bytes, which is
  // all the CRC upkeep needs.
  return {{archive + "/data.pkl", Pattern(40, 9)},
          {archive + "/data/0", Pattern(100, 1), Desc::kWithSig},
          {archive + "/data/1", Pattern(37, 2), Desc::kNoSig},
          {archive + "/data/2", Pattern(64, 3), Desc::kNone, /*zip64=*/true},
          {archive + "/data/3", Pattern(50, 4), Desc::kWithSig, false, /*deflated=*/true},
          {archive + "/data/4", Pattern(20, 5), Desc::kWithSig, /*zip64=*/true},
          {archive + "/version", {'3', '\n'}}};
}

Bytes Npy(const Bytes& payload) {
  std::string h = "{'descr': '|u1', 'fortran_order': False, 'shape': (" + std::to_string(payload.size()) + ",), }";
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  ByteWriter w;
  w.Str("\x93NUMPY"), w.b.push_back(1), w.b.push_back(0), w.U16(uint16_t(h.size())), w.Str(h), w.Raw(payload);
  return w.b;
}

FileLayout Detect(const Bytes& f) { return DetectLayout(SpanSource(f)); }

// Every tensor byte changes, as a lossy rewrite might.
Bytes Rewrite(const Bytes& f, const FileLayout& l) {
  Bytes out = f;
  for (const TensorRegion& t : l.tensors) {
    for (uint64_t i = 0; i < t.length; ++i) out[t.offset + i] ^= uint8_t(0x5A + i);
  }
  return out;
}

// Feeds the file in random-sized pieces, as the FUSE read path would.
std::vector<uint32_t> StreamCrcs(const Bytes& f, const FileLayout& l, uint64_t seed) {
  ZipCrcTracker tracker(l.zip_crcs);
  std::mt19937_64 rng(seed);
  for (uint64_t off = 0; off < f.size();) {
    uint64_t n = std::min<uint64_t>(f.size() - off, 1 + rng() % 97);
    tracker.Feed(off, std::span(f).subspan(off, n));
    off += n;
  }
  EXPECT_TRUE(tracker.Complete());
  return tracker.Crcs();
}

Bytes PatchInChunks(Bytes f, const FileLayout& l, const std::vector<uint32_t>& crcs, size_t chunk) {
  for (uint64_t off = 0; off < f.size(); off += chunk) {
    size_t n = std::min<uint64_t>(chunk, f.size() - off);
    PatchCrcFields(off, std::span(f).subspan(off, n), l.zip_crcs, crcs);
  }
  return f;
}

// Every reported field now holds zlib's CRC of the new member data, and
// only member data and CRC fields differ from the original.
void CheckRepaired(const Bytes& orig, const Bytes& fixed, const FileLayout& l) {
  std::vector<bool> may_change(orig.size(), false);
  for (const ZipCrcField& z : l.zip_crcs) {
    uint32_t want = ZlibCrc(std::span(fixed).subspan(z.data_offset, z.data_length));
    for (uint64_t off : z.field_offsets) {
      EXPECT_EQ(Get32(fixed, off), want) << "field at " << off;
      std::fill_n(may_change.begin() + off, 4, true);
    }
    std::fill_n(may_change.begin() + z.data_offset, z.data_length, true);
  }
  for (size_t i = 0; i < orig.size(); ++i) {
    if (!may_change[i]) {
      ASSERT_EQ(orig[i], fixed[i]) << "byte " << i;
    }
  }
}

// Rewrites, recomputes and patches with chunk sizes that straddle fields.
void RoundTrip(const Bytes& f, const FileLayout& l) {
  Bytes changed = Rewrite(f, l);
  std::vector<uint32_t> crcs = StreamCrcs(changed, l, 7);
  for (size_t chunk : {size_t{7}, size_t{1}, changed.size()}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    CheckRepaired(f, PatchInChunks(changed, l, crcs, chunk), l);
  }
}

// Before any rewrite, each field holds the member's CRC already, except
// that a local header may leave it zero when a descriptor carries it.
void CheckFieldsHoldOriginalCrcs(const Bytes& f, const FileLayout& l) {
  for (const ZipCrcField& z : l.zip_crcs) {
    uint32_t crc = ZlibCrc(std::span(f).subspan(z.data_offset, z.data_length));
    for (uint64_t off : z.field_offsets) {
      bool local_zero = off == z.field_offsets[0] && z.field_offsets.size() == 3 && Get32(f, off) == 0;
      if (!local_zero) {
        EXPECT_EQ(Get32(f, off), crc) << "field at " << off;
      }
    }
  }
}

TEST(ZipCrcTest, KnownVectors) {
  std::string_view check = "123456789";
  auto bytes = std::span(reinterpret_cast<const uint8_t*>(check.data()), check.size());
  EXPECT_EQ(Crc32(bytes), 0xCBF43926u);
  EXPECT_EQ(Crc32({}), 0u);
  EXPECT_EQ(Crc32({}, 0xCBF43926u), 0xCBF43926u);
  EXPECT_EQ(Crc32(bytes.subspan(4), Crc32(bytes.first(4))), 0xCBF43926u);
  std::string_view fox = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(Crc32(std::span(reinterpret_cast<const uint8_t*>(fox.data()), fox.size())), 0x414FA339u);
}

TEST(ZipCrcTest, PatchStraddlesChunks) {
  std::vector<ZipCrcField> fields = {{0, 0, {0, 9}}, {0, 0, {30}}};
  std::vector<uint32_t> crcs = {0x11223344u, 0xA1B2C3D4u};
  Bytes whole(36, 0xEE);
  PatchCrcFields(0, whole, fields, crcs);
  EXPECT_EQ(Get32(whole, 0), 0x11223344u);
  EXPECT_EQ(Get32(whole, 9), 0x11223344u);
  EXPECT_EQ(Get32(whole, 30), 0xA1B2C3D4u);
  EXPECT_EQ(whole[4], 0xEE);
  for (size_t chunk : {1, 2, 3, 5, 7}) {
    Bytes b(36, 0xEE);
    for (size_t off = 0; off < b.size(); off += chunk) {
      PatchCrcFields(off, std::span(b).subspan(off, std::min(chunk, b.size() - off)), fields, crcs);
    }
    EXPECT_EQ(b, whole) << chunk;
  }
  // Fields past the chunk, or at offsets that would wrap, are left alone.
  Bytes b(8, 0);
  PatchCrcFields(100, b, std::vector<ZipCrcField>{{0, 0, {UINT64_MAX - 1, 50}}}, crcs);
  EXPECT_EQ(b, Bytes(8, 0));
}

TEST(ZipCrcTest, TrackerSkipsOutsideBytesAndRefeeds) {
  Bytes f = Pattern(200, 3);
  std::vector<ZipCrcField> fields = {{10, 20, {}}, {50, 0, {}}, {60, 100, {}}};
  ZipCrcTracker t(fields);
  t.Feed(0, std::span(f).first(70));
  t.Feed(40, std::span(f).subspan(40, 60));  // overlaps what was fed
  EXPECT_FALSE(t.Complete());
  t.Feed(100, std::span(f).subspan(100));
  ASSERT_TRUE(t.Complete());
  std::vector<uint32_t> want = {ZlibCrc(std::span(f).subspan(10, 20)), 0, ZlibCrc(std::span(f).subspan(60, 100))};
  EXPECT_EQ(t.Crcs(), want);
}

// The CRC pass runs on every sealing worker: pieces arrive in any order,
// from several threads, some overlapping, and are joined by crc32_combine.
TEST(ZipCrcTest, TrackerJoinsPiecesFedInAnyOrderFromManyThreads) {
  Bytes f = Pattern(100000, 5);
  std::vector<ZipCrcField> fields = {{100, 30000, {}}, {30100, 7, {}}, {40000, 59000, {}}};
  std::vector<uint32_t> want;
  for (const ZipCrcField& fd : fields) want.push_back(ZlibCrc(std::span(f).subspan(fd.data_offset, fd.data_length)));
  for (uint64_t piece : {1000u, 4096u, 65536u}) {
    std::vector<uint64_t> offsets;
    for (uint64_t off = 0; off < f.size(); off += piece) offsets.push_back(off);
    std::mt19937 rng(static_cast<uint32_t>(piece));
    std::shuffle(offsets.begin(), offsets.end(), rng);
    ZipCrcTracker t(fields);
    std::vector<std::thread> threads;
    for (int k = 0; k < 4; ++k) {
      threads.emplace_back([&, k] {
        for (size_t i = static_cast<size_t>(k); i < offsets.size(); i += 4) {
          const uint64_t off = offsets[i], len = std::min<uint64_t>(piece, f.size() - off);
          t.Feed(off, std::span(f).subspan(off, len));
        }
      });
    }
    for (std::thread& th : threads) th.join();
    t.Feed(150, std::span(f).subspan(150, 5000));  // again, overlapping pieces: counts once
    ASSERT_TRUE(t.Complete()) << piece;
    EXPECT_EQ(t.Crcs(), want) << piece;
  }
  // Overlapping pieces fed before the ones they overlap.
  ZipCrcTracker t(fields);
  t.Feed(500, std::span(f).subspan(500, 2000));
  t.Feed(2400, std::span(f).subspan(2400, 100));
  t.Feed(0, std::span(f).first(3000));
  t.Feed(3000, std::span(f).subspan(3000));
  ASSERT_TRUE(t.Complete());
  EXPECT_EQ(t.Crcs(), want);
}

TEST(ZipCrcTest, TrackerGapIsIncomplete) {
  Bytes f = Pattern(100, 4);
  std::vector<ZipCrcField> fields = {{10, 50, {}}};
  ZipCrcTracker t(fields);
  t.Feed(0, std::span(f).first(20));
  t.Feed(30, std::span(f).subspan(30));
  EXPECT_FALSE(t.Complete());
  ZipCrcTracker never(fields);
  never.Feed(0, std::span(f).first(5));
  EXPECT_FALSE(never.Complete());
}

TEST(ZipCrcTest, TorchZipFieldsAndRepair) {
  Bytes f = BuildZip(TorchMembers("archive"));
  FileLayout l = Detect(f);
  ASSERT_EQ(l.format, "torch-zip") << l.note;
  ASSERT_EQ(l.tensors.size(), 4u) << l.note;  // data/3 is deflated
  ASSERT_EQ(l.zip_crcs.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(l.zip_crcs[i].data_offset, l.tensors[i].offset);
    EXPECT_EQ(l.zip_crcs[i].data_length, l.tensors[i].length);
  }
  // data/0 and data/1 (descriptors with and without signature) and data/4
  // name their CRC in the descriptor and the central directory: the local
  // header's stays zero, as the spec has it with a descriptor. data/2 has
  // no descriptor: local header and central directory.
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(l.zip_crcs[i].field_offsets.size(), 2u) << i;
  // Fields are sorted: descriptor (right after the data), central directory.
  EXPECT_EQ(l.zip_crcs[0].field_offsets[0], l.zip_crcs[0].data_offset + 100 + 4);
  EXPECT_EQ(l.zip_crcs[1].field_offsets[0], l.zip_crcs[1].data_offset + 37);
  CheckFieldsHoldOriginalCrcs(f, l);
  RoundTrip(f, l);
}

TEST(ZipCrcTest, NpzMembersCoverTheNpyHeader) {
  Bytes x = Npy(Pattern(300, 1)), y = Npy(Pattern(70, 2));
  Bytes f = BuildZip({{"x.npy", x, Desc::kWithSig},
                      {"y.npy", y, Desc::kNone, /*zip64=*/true},
                      {"z.npy", Npy(Pattern(10, 3)), Desc::kNone, false, /*deflated=*/true}});
  FileLayout l = Detect(f);
  ASSERT_EQ(l.format, "npz") << l.note;
  ASSERT_EQ(l.tensors.size(), 2u) << l.note;
  ASSERT_EQ(l.zip_crcs.size(), 2u);
  EXPECT_EQ(l.zip_crcs[0].data_length, x.size());
  EXPECT_EQ(l.zip_crcs[1].data_length, y.size());
  EXPECT_EQ(l.zip_crcs[0].data_offset + x.size() - 300, l.tensors[0].offset);
  EXPECT_EQ(l.zip_crcs[0].field_offsets.size(), 2u);  // descriptor, central directory
  EXPECT_EQ(l.zip_crcs[1].field_offsets.size(), 2u);  // local header, central directory
  CheckFieldsHoldOriginalCrcs(f, l);
  RoundTrip(f, l);
}

TEST(ZipCrcTest, DcpArchivesSortedAcrossArchives) {
  // Raw BYTE_IO items, then two torch archives back to back.
  Bytes f = Pattern(123, 7);
  Bytes a = BuildZip(TorchMembers("a"));
  f.insert(f.end(), a.begin(), a.end());
  Bytes b = BuildZip({{"b/data.pkl", Pattern(10, 8)}, {"b/data/0", Pattern(33, 9), Desc::kNoSig}});
  f.insert(f.end(), b.begin(), b.end());
  FileLayout l = Detect(f);
  ASSERT_EQ(l.format, "dcp") << l.note;
  ASSERT_EQ(l.zip_crcs.size(), 5u);
  EXPECT_TRUE(std::is_sorted(l.zip_crcs.begin(), l.zip_crcs.end(),
                             [](const auto& x, const auto& y) { return x.data_offset < y.data_offset; }));
  EXPECT_GT(l.zip_crcs[4].data_offset, 123u + a.size());
  RoundTrip(f, l);
}

TEST(ZipCrcTest, NonZipFormatsHaveNoFields) {
  FileLayout l = Detect(Npy(Pattern(64, 1)));
  EXPECT_EQ(l.format, "npy");
  EXPECT_TRUE(l.zip_crcs.empty());
}

}  // namespace
}  // namespace ckptfs::formats
