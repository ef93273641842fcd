// Shared helpers for the unit tests: temp directories, test data, and
// reading a file's content the way the FUSE layer would (stub -> pack or
// staging file).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/env.h"
#include "codec/formats/layout.h"
#include "store/store.h"

namespace ckptfs::test {

#define ASSERT_OK(expr)                                     \
  do {                                                      \
    const ::ckptfs::Status _s = (expr);                     \
    ASSERT_TRUE(_s.ok()) << #expr << ": " << _s.ToString(); \
  } while (0)
#define EXPECT_OK(expr)                                     \
  do {                                                      \
    const ::ckptfs::Status _s = (expr);                     \
    EXPECT_TRUE(_s.ok()) << #expr << ": " << _s.ToString(); \
  } while (0)

// A fresh directory under /tmp, removed with everything in it.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

// A parser's regions are in file order, non-empty, disjoint and inside a
// file of `size` bytes.
void ExpectRegionsInOrder(const FileLayout& l, uint64_t size);

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed);
// Text-like bytes that zstd shrinks well.
std::vector<uint8_t> CompressibleBytes(size_t n, uint64_t seed);
// A mix a checkpoint might hold: compressible, random, and all-zero chunks,
// ending in a partial chunk.
std::vector<uint8_t> MixedContent(uint32_t chunk_size, uint64_t seed);

void WriteFileBytes(const std::string& path, const std::vector<uint8_t>& bytes);
std::vector<uint8_t> ReadFileBytes(const std::string& path);
std::vector<uint8_t> ReadFdBytes(int fd);

// Number of entries in a directory (recursing one level for packs/XX).
size_t CountFiles(const std::string& dir, bool one_level_down = false);

// Content of a file as the stub says it is: the pack's chunks if sealed,
// the staging file if staged.
Result<std::vector<uint8_t>> ReadContent(Store* store, int stub_fd);
Result<std::vector<uint8_t>> ReadContentAt(Store* store, const std::string& ns_path);

StoreOptions SmallChunks(uint32_t chunk_size = 4096);

// ---- building files the format parsers read

// Appends `v` as `width` little-endian bytes.
void PutLE(std::vector<uint8_t>* b, uint64_t v, unsigned width);

// Little-endian fields appended to a byte buffer, for headers and records.
struct ByteWriter {
  std::vector<uint8_t> b;
  void U8(uint8_t v) { b.push_back(v); }
  void U16(uint16_t v) { PutLE(&b, v, 2); }
  void U32(uint32_t v) { PutLE(&b, v, 4); }
  void U64(uint64_t v) { PutLE(&b, v, 8); }
  void Str(std::string_view s) { b.insert(b.end(), s.begin(), s.end()); }
  void Raw(std::span<const uint8_t> d) { b.insert(b.end(), d.begin(), d.end()); }
  size_t size() const { return b.size(); }
};

// f32 -> IEEE half bits, truncating, flush-to-zero: for test data, where
// only the byte statistics matter.
uint16_t F32ToF16Bits(float f);

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  std::vector<uint64_t> shape;
  std::vector<uint8_t> data;
};
// A safetensors file: the 8-byte header length, the JSON header
// (__metadata__ first, then the tensors in order) padded with spaces to 8
// bytes as the reference writer does, then the tensors back to back.
std::vector<uint8_t> BuildSafetensors(const std::vector<SafetensorsTensor>& tensors);

// A 1-D .npy file of little-endian f32 elements (`f32`: their bytes), which
// the format parsers recognise, so its tensor is coded by element type.
std::vector<uint8_t> NpyF32(std::span<const uint8_t> f32);
// Training-like .npy versions of one float32 tensor (`seed` draws it): each
// nudges half of the weights, so each is stored as deltas of the last.
std::vector<std::vector<uint8_t>> NpyVersions(int n, size_t elems, uint32_t seed);

// Base packs held in memory as their logical bytes, bounds-checked as the
// store checks them.
class MemBases : public BaseSource {
 public:
  std::map<ObjectId, std::vector<uint8_t>> packs;
  Status ReadPackRange(ObjectId pack, uint64_t offset, std::span<uint8_t> out) override;
};

// Creates ns/<name> STAGED with `bytes` in a fresh staging file, all fsync'd.
// Returns the stub record.
Result<StubRecord> MakeStagedFile(Store* store, const std::string& name, const std::vector<uint8_t>& bytes);
// Same, then sealed into a pack.
Result<StubRecord> MakeSealedFile(Store* store, const std::string& name, const std::vector<uint8_t>& bytes);

}  // namespace ckptfs::test
