// docs/FORMAT.md against the code: the record sizes it states (the tables
// whose caption says "(N bytes)", and the size column of the meta block)
// against the constants, and every field of the fixed-size records against
// what the encoders write at that offset. The records are encoded field by
// field (base/le.h), never as a memcpy of a struct, so sizeof of the
// in-memory structs says nothing about the format; the encoders' output is
// what the doc must describe.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "base/hash.h"
#include "base/le.h"
#include "codec/chunk_codec.h"
#include "store/pack.h"
#include "store/pack_format.h"
#include "store/pack_meta.h"
#include "store/stub.h"
#include "test_util.h"

namespace ckptfs {
namespace {

namespace fs = std::filesystem;

std::string FormatDoc() {
  std::ifstream in(fs::path(CKPTFS_SOURCE_DIR) / "docs" / "FORMAT.md");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// One Markdown table and the paragraph before it.
struct DocTable {
  std::string caption;
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;
  std::optional<uint64_t> total;  // "(N bytes" in the caption
};

std::vector<std::string> Cells(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream s(line.substr(1));
  std::string cell;
  while (std::getline(s, cell, '|')) {
    const size_t b = cell.find_first_not_of(' '), e = cell.find_last_not_of(' ');
    cells.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
  }
  return cells;
}

std::vector<DocTable> ParseTables(const std::string& md) {
  std::vector<std::string> lines;
  std::stringstream s(md);
  for (std::string l; std::getline(s, l);) lines.push_back(l);
  std::vector<DocTable> tables;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    if (lines[i].rfind("| ", 0) != 0 || lines[i + 1].rfind("|---", 0) != 0) continue;
    DocTable t;
    t.columns = Cells(lines[i]);
    size_t p = i;
    while (p > 0 && lines[p - 1].empty()) --p;
    std::vector<std::string> para;
    while (p > 0 && !lines[p - 1].empty()) para.insert(para.begin(), lines[--p]);
    for (const std::string& l : para) t.caption += (t.caption.empty() ? "" : " ") + l;
    std::smatch m;
    if (std::regex_search(t.caption, m, std::regex(R"(\((\d+) bytes)"))) t.total = std::stoull(m[1]);
    for (i += 2; i < lines.size() && lines[i].rfind("| ", 0) == 0; ++i) t.rows.push_back(Cells(lines[i]));
    tables.push_back(std::move(t));
  }
  return tables;
}

const DocTable& TableCaptioned(const std::vector<DocTable>& tables, const std::string& caption) {
  for (const DocTable& t : tables) {
    if (t.caption.find(caption) != std::string::npos) return t;
  }
  static const DocTable none;
  ADD_FAILURE() << "docs/FORMAT.md has no table captioned \"" << caption << "\"";
  return none;
}

// A size cell: a product of numbers and counts ("8", "8·B", "3 × 24"),
// optionally followed by a parenthesised remark.
uint64_t EvalSize(std::string cell, const std::map<std::string, uint64_t>& vars) {
  if (const size_t paren = cell.find(" ("); paren != std::string::npos) cell.resize(paren);
  uint64_t product = 1;
  std::regex factor(R"(\s*([0-9]+|[A-Z])\s*(·|×|$))");
  for (auto it = std::sregex_iterator(cell.begin(), cell.end(), factor); it != std::sregex_iterator(); ++it) {
    const std::string f = (*it)[1];
    product *= std::isdigit(static_cast<unsigned char>(f[0])) ? std::stoull(f) : vars.at(f);
  }
  return product;
}

uint64_t FieldValue(std::span<const uint8_t> b, uint64_t off, uint64_t size) {
  uint64_t v = 0;
  for (uint64_t i = 0; i < size; ++i) v |= static_cast<uint64_t>(b[off + i]) << (8 * i);
  return v;
}

std::vector<uint8_t> Bytes(const char* s, size_t n) { return std::vector<uint8_t>(s, s + n); }

// What a record's field must hold, by the first words of its description in
// the doc; every row of the table must be named here and every name here
// must be in the table, so the doc and this test move together.
using Expect = std::variant<uint64_t, std::vector<uint8_t>>;

void CheckOffsetTable(const DocTable& t, uint64_t constant, std::span<const uint8_t> encoded,
                      const std::vector<std::pair<std::string, Expect>>& fields) {
  SCOPED_TRACE(t.caption);
  ASSERT_EQ(t.columns, (std::vector<std::string>{"offset", "size", "field"}));
  ASSERT_TRUE(t.total.has_value()) << "the caption should say \"(N bytes)\"";
  EXPECT_EQ(*t.total, constant);
  EXPECT_EQ(encoded.size(), constant);
  uint64_t next = 0;
  std::vector<bool> used(fields.size());
  for (const std::vector<std::string>& row : t.rows) {
    ASSERT_EQ(row.size(), 3u);
    const uint64_t off = std::stoull(row[0]), size = std::stoull(row[1]);
    EXPECT_EQ(off, next) << row[2] << ": fields must tile the record";
    next = off + size;
    ASSERT_LE(next, encoded.size()) << row[2];
    bool known = false;
    for (size_t k = 0; k < fields.size(); ++k) {
      if (row[2].rfind(fields[k].first, 0) != 0) continue;
      known = used[k] = true;
      const std::span<const uint8_t> field = encoded.subspan(off, size);
      if (const uint64_t* v = std::get_if<uint64_t>(&fields[k].second)) {
        if (size > 8) {  // a wide reserved field
          EXPECT_EQ(*v, 0u) << row[2];
          EXPECT_TRUE(std::all_of(field.begin(), field.end(), [](uint8_t b) { return b == 0; })) << row[2];
        } else {
          EXPECT_EQ(FieldValue(encoded, off, size), *v) << row[2] << " at offset " << off;
        }
      } else {
        const std::vector<uint8_t>& want = std::get<std::vector<uint8_t>>(fields[k].second);
        EXPECT_EQ(std::vector<uint8_t>(field.begin(), field.end()), want) << row[2] << " at offset " << off;
      }
      break;
    }
    EXPECT_TRUE(known) << "the test does not know the field \"" << row[2] << "\"";
  }
  EXPECT_EQ(next, *t.total) << "the fields do not add up to the record's size";
  for (size_t k = 0; k < fields.size(); ++k) EXPECT_TRUE(used[k]) << "no row for " << fields[k].first;
}

// The doc with its lines joined, for phrases that may be wrapped anywhere.
std::string Flat(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

class FormatDocTest : public ::testing::Test {
 protected:
  const std::string doc_ = FormatDoc();
  const std::string flat_ = Flat(doc_);
  const std::vector<DocTable> tables_ = ParseTables(doc_);
};

TEST_F(FormatDocTest, StubSlot) {
  const StubRecord rec{.gen = 0x0807060504030201ull,
                       .state = StubState::kStaged,
                       .size = 0x1817161514131211ull,
                       .object = 0x2827262524232221ull,
                       .node = 0x3837363534333231ull,
                       .closed = true};
  std::array<uint8_t, kStubSlotSize> slot;
  EncodeStubSlot(rec, slot);
  EXPECT_NE(
      flat_.find("A stub is 0, " + std::to_string(kStubSlotSize) + " or " + std::to_string(kStubFileSize) + " bytes"),
      std::string::npos);
  CheckOffsetTable(TableCaptioned(tables_, "Slot ("), kStubSlotSize, slot,
                   {{"magic `CKST`", Bytes(kStubMagic, 4)},
                    {"stub format version (1)", uint64_t{kStubFormatVersion}},
                    {"state", uint64_t{2}},
                    {"flags: bit 0 = closed", uint64_t{1}},
                    {"node", rec.node},
                    {"reserved (0)", uint64_t{0}},
                    {"gen", rec.gen},
                    {"size", rec.size},
                    {"object", rec.object},
                    {"XXH3-64 of bytes 0..55", Checksum64(std::span<const uint8_t>(slot).first(56), kSeedStub)}});
}

// A small pack written by WritePack: three chunks (zstd, raw, zero).
struct WrittenPack {
  std::vector<uint8_t> src;
  std::vector<uint8_t> bytes;
  PackStats stats;
};

WrittenPack WriteSamplePack(uint32_t chunk_size) {
  test::TempDir dir;
  WrittenPack w;
  w.src = test::CompressibleBytes(chunk_size, 1);
  const std::vector<uint8_t> random = test::RandomBytes(chunk_size, 2);
  w.src.insert(w.src.end(), random.begin(), random.end());
  w.src.resize(w.src.size() + chunk_size / 2);  // a short zero chunk last
  test::WriteFileBytes(dir.Sub("src"), w.src);
  UniqueFd src(::open(dir.Sub("src").c_str(), O_RDONLY));
  UniqueFd dst(::open(dir.Sub("pack").c_str(), O_CREAT | O_RDWR, 0600));
  Result<PackStats> stats = WritePack(Env::Default(), src.get(), w.src.size(), dst.get(), chunk_size, {});
  EXPECT_TRUE(stats.ok()) << stats.status().ToString();
  if (stats.ok()) w.stats = *stats;
  w.bytes = test::ReadFileBytes(dir.Sub("pack"));
  return w;
}

TEST_F(FormatDocTest, PackHeaderTableAndFooter) {
  constexpr uint32_t kChunk = 4096;
  const WrittenPack w = WriteSamplePack(kChunk);
  const std::span<const uint8_t> pack(w.bytes);
  ASSERT_EQ(w.stats.chunk_count, 3u);
  // "header (64 B) | chunk payloads | meta block (v3) | chunk table (40 B per chunk) | footer (32 B)"
  std::smatch m;
  ASSERT_TRUE(std::regex_search(doc_, m,
                                std::regex(R"(header \((\d+) B\) \| chunk payloads \| meta block \(v3\) )"
                                           R"(\| chunk table \((\d+) B per chunk\) \| footer \((\d+) B\))")));
  EXPECT_EQ(std::stoull(m[1]), kPackHeaderSize);
  EXPECT_EQ(std::stoull(m[2]), kPackTableEntrySize);
  EXPECT_EQ(std::stoull(m[3]), kPackFooterSize);

  const uint64_t table_bytes = kPackTableEntrySize * w.stats.chunk_count;
  const uint64_t table_at = pack.size() - kPackFooterSize - table_bytes;
  const uint64_t meta_len = w.stats.meta.chunk_hash.size() * 9 + 32 + 8;
  const uint64_t meta_at = table_at - meta_len;
  CheckOffsetTable(TableCaptioned(tables_, "Header ("), kPackHeaderSize, pack.first(kPackHeaderSize),
                   {{"magic `CKPTPACK`", Bytes(kPackMagic, 8)},
                    {"pack format version", uint64_t{kPackPlainVersion}},
                    {"header size", uint64_t{kPackHeaderSize}},
                    {"chunk size", uint64_t{kChunk}},
                    {"flags (0)", uint64_t{0}},
                    {"logical size", w.src.size()},
                    {"chunk count", uint64_t{3}},
                    {"meta block offset", meta_at},
                    {"meta block length", meta_len},
                    {"reserved (0)", uint64_t{0}},
                    {"XXH3-64 of bytes 0..55", Checksum64(pack.first(56), kSeedHeader)}});

  // Chunk 1 is the random one, stored raw right after chunk 0's payload.
  const std::span<const uint8_t> entry = pack.subspan(table_at + kPackTableEntrySize, kPackTableEntrySize);
  const uint64_t payload_at = le::Get64(entry, 0);
  const std::span<const uint8_t> raw(w.src.data() + kChunk, kChunk);
  CheckOffsetTable(
      TableCaptioned(tables_, "Chunk table entry `i` ("), kPackTableEntrySize, entry,
      {{"payload offset", payload_at},
       {"stored length", uint64_t{kChunk}},
       {"raw length", uint64_t{kChunk}},
       {"codec", static_cast<uint64_t>(ChunkCodec::kRaw)},
       {"padding (0)", uint64_t{0}},
       {"XXH3-64 of the stored payload", Checksum64(pack.subspan(payload_at, kChunk), kSeedChunkStored ^ 1)},
       {"XXH3-64 of the decoded bytes", Checksum64(raw, kSeedChunkRaw ^ 1)}});

  CheckOffsetTable(TableCaptioned(tables_, "Footer ("), kPackFooterSize, pack.last(kPackFooterSize),
                   {{"table offset", table_at},
                    {"chunk count", uint64_t{3}},
                    {"XXH3-64 of the whole table", Checksum64(pack.subspan(table_at, table_bytes), kSeedTable)},
                    {"magic `CKPTEND1`", Bytes(kPackFooterMagic, 8)}});
}

// The meta block table's sizes, summed for given counts, as EvalSize reads
// them; the lossy and input rows count only when the block has the section.
uint64_t DocMetaSize(const DocTable& t, uint64_t bases, uint64_t tensors, uint64_t chunks, bool lossy,
                     bool input = false) {
  uint64_t total = 0;
  for (const std::vector<std::string>& row : t.rows) {
    if (row[1].rfind("lossy section", 0) == 0 && !lossy) continue;
    if (row[1].rfind("input section", 0) == 0 && !input) continue;
    total += EvalSize(row[0], {{"B", bases}, {"T", tensors}, {"C", chunks}});
  }
  return total;
}

PackMeta SampleMeta(bool lossy, bool input = false) {
  PackMeta m;
  if (input) m.input = InputDigest{{1, 2}, 3};
  m.sealed_ns = 1;
  m.bases = {11, 12};
  m.tensors = {{.offset = 0, .length = 4096, .dtype = DType::kF32},
               {.offset = 4096, .length = 100, .dtype = DType::kF16},
               {.offset = 8192, .length = 8, .dtype = DType::kI64}};
  m.chunk_hash = {1, 2, 3, 4, 5};
  m.chunk_depth = {0, 1, 2, 0, 1};
  if (lossy) {
    m.lossy.emplace();
    m.lossy->fidelity = 0.01f;
  }
  return m;
}

TEST_F(FormatDocTest, MetaBlockAndLossySection) {
  const DocTable& meta = TableCaptioned(tables_, "(`store/pack_meta.h`)");
  ASSERT_EQ(meta.columns, (std::vector<std::string>{"size", "field"}));
  EXPECT_EQ(DocMetaSize(meta, 2, 3, 5, false), EncodePackMeta(SampleMeta(false)).size());
  EXPECT_EQ(DocMetaSize(meta, 2, 3, 5, true), EncodePackMeta(SampleMeta(true)).size());
  EXPECT_EQ(DocMetaSize(meta, 0, 0, 0, false), EncodePackMeta(PackMeta{}).size());

  const DocTable& lossy = TableCaptioned(tables_, "Lossy section (");
  ASSERT_TRUE(lossy.total.has_value());
  uint64_t sum = 0;
  for (const std::vector<std::string>& row : lossy.rows) sum += EvalSize(row[0], {});
  EXPECT_EQ(sum, *lossy.total) << "the lossy section's fields do not add up to its size";
  const uint64_t section = EncodePackMeta(SampleMeta(true)).size() - EncodePackMeta(SampleMeta(false)).size();
  EXPECT_EQ(*lossy.total, section);
  // Its version 1 lacks the last three fields (4 bytes): "96 (92 in section version 1)".
  EXPECT_NE(std::find_if(meta.rows.begin(), meta.rows.end(),
                         [&](const std::vector<std::string>& r) {
                           return r[0] == std::to_string(section) + " (" + std::to_string(section - 4) +
                                              " in section version 1)";
                         }),
            meta.rows.end());
  // The section starts with its magic right after the depths.
  const std::vector<uint8_t> enc = EncodePackMeta(SampleMeta(true));
  EXPECT_EQ(std::memcmp(enc.data() + 32 + 16 + 51 + 45, "LOSY", 4), 0);
}

TEST_F(FormatDocTest, MetaBlockInputSection) {
  const DocTable& meta = TableCaptioned(tables_, "(`store/pack_meta.h`)");
  EXPECT_EQ(DocMetaSize(meta, 2, 3, 5, true, true), EncodePackMeta(SampleMeta(true, true)).size());
  EXPECT_EQ(DocMetaSize(meta, 2, 3, 5, false, true), EncodePackMeta(SampleMeta(false, true)).size());
  const DocTable& input = TableCaptioned(tables_, "Input section (");
  ASSERT_TRUE(input.total.has_value());
  uint64_t sum = 0;
  for (const std::vector<std::string>& row : input.rows) sum += EvalSize(row[0], {});
  EXPECT_EQ(sum, *input.total) << "the input section's fields do not add up to its size";
  // After the lossy section, magic first, then the fields in the table's order.
  const std::vector<uint8_t> enc = EncodePackMeta(SampleMeta(true, true));
  const size_t at = enc.size() - 8 - *input.total;
  EXPECT_EQ(std::memcmp(enc.data() + at, "INPT", 4), 0);
  EXPECT_EQ(le::Get32(enc, at + 4), 1u);
  EXPECT_EQ(le::Get64(enc, at + 8), 1u);
  EXPECT_EQ(le::Get64(enc, at + 16), 2u);
  EXPECT_EQ(le::Get64(enc, at + 24), 3u);
}

TEST_F(FormatDocTest, BaseReferenceAndVersions) {
  EXPECT_NE(flat_.find("Payload: `u64 base pack id | u64 offset in the base's logical bytes`"), std::string::npos);
  EXPECT_EQ(kBaseRefSize, 16u);
  EXPECT_NE(
      doc_.find("# ckptfs on-disk format: store version 1, pack format version " + std::to_string(kPackFormatVersion)),
      std::string::npos);
  EXPECT_NE(flat_.find("This build reads pack versions " + std::to_string(kPackMinReadableVersion) + " to " +
                       std::to_string(kPackFormatVersion)),
            std::string::npos);
}

}  // namespace
}  // namespace ckptfs
