// Writes seeds for fuzz_lossless_decode: real blobs from the encoder for
// each dtype and a few kinds of content, each prefixed with the raw size
// (u32 LE) as the fuzz target expects; with a second directory, also
// tensor chunk payloads for fuzz_tensor_chunk.
// Usage: lossless_seed_gen OUT_DIR [CHUNK_OUT_DIR]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codec/dtype.h"
#include "codec/lossless/plane_codec.h"
#include "codec/tensor_chunk.h"

using ckptfs::DType;

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: %s OUT_DIR [CHUNK_OUT_DIR]\n", argv[0]);
    return 2;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const DType kTypes[] = {DType::kF32, DType::kBF16, DType::kF16,  DType::kF64,    DType::kI64,
                          DType::kU8,  DType::kC64,  DType::kBool, DType::kUnknown};
  int written = 0;
  for (DType t : kTypes) {
    for (int kind = 0; kind < 4; ++kind) {
      // Normal weights, a constant run, an odd length with a partial element,
      // and a plane big enough for the exponent split and rANS.
      size_t n = kind == 2 ? 1001 : kind == 3 ? 160000 : 4096;
      std::vector<uint8_t> raw(n);
      for (size_t i = 0; i + 4 <= n; i += 4) {
        float v = kind == 1 ? 1.0f : kind == 3 ? normal(rng) * normal(rng) * 1e-3f : normal(rng);
        if (t == DType::kBF16 || t == DType::kF16) v = std::ldexp(v, 16);  // spread the high bytes
        std::memcpy(raw.data() + i, &v, 4);
      }
      std::vector<uint8_t> blob;
      // A low split threshold keeps split planes among the seeds.
      ckptfs::lossless::PlaneCodecOptions opts;
      if (kind == 3) opts.split_min_gain_bits = 0.02;
      if (!ckptfs::lossless::EncodeTensorBytes(t, raw, opts, &blob).ok()) continue;
      std::vector<uint8_t> seed = {uint8_t(n), uint8_t(n >> 8), uint8_t(n >> 16), uint8_t(n >> 24)};
      seed.insert(seed.end(), blob.begin(), blob.end());
      std::string path = std::string(argv[1]) + "/" + std::string(ckptfs::DTypeName(t)) + "-" + std::to_string(kind);
      FILE* f = std::fopen(path.c_str(), "wb");
      if (!f || std::fwrite(seed.data(), 1, seed.size(), f) != seed.size() || std::fclose(f) != 0) return 1;
      ++written;
    }
  }
  {
    // An Adam second moment laid out as a 64 x 96 matrix, cut mid-row: a
    // blob with the grid predictor's terms (transform 2).
    const size_t rows = 64, cols = 96, first = 37, n = rows * cols - first;  // under -max_len
    std::vector<float> row(rows), col(cols);
    for (float& r : row) r = -20 + 4 * normal(rng) / 0.02f;
    for (float& c : col) c = 3 * normal(rng) / 0.02f;
    std::vector<uint8_t> raw(4 * n);
    for (size_t i = 0; i < n; ++i) {
      const size_t at = first + i;
      float v = std::exp2(row[at / cols] + col[at % cols] + 10 * normal(rng));
      std::memcpy(raw.data() + 4 * i, &v, 4);
    }
    std::vector<uint8_t> blob;
    if (!ckptfs::lossless::EncodeTensorBytes(DType::kF32, raw, {cols, first % cols}, {}, &blob).ok()) return 1;
    size_t bytes = raw.size();
    std::vector<uint8_t> seed = {uint8_t(bytes), uint8_t(bytes >> 8), uint8_t(bytes >> 16), uint8_t(bytes >> 24)};
    seed.insert(seed.end(), blob.begin(), blob.end());
    FILE* f = std::fopen((std::string(argv[1]) + "/F32-grid").c_str(), "wb");
    if (!f || std::fwrite(seed.data(), 1, seed.size(), f) != seed.size() || std::fclose(f) != 0) return 1;
    ++written;
  }
  if (argc == 3) {
    // A chunk with metadata around an f32 and a bf16 tensor.
    std::vector<uint8_t> chunk(200000);
    for (size_t i = 0; i < 300; ++i) chunk[i] = static_cast<uint8_t>("PK\3\4{\"dtype\":"[i % 14]);
    for (size_t i = 300; i + 4 <= 120300; i += 4) {
      float v = normal(rng);
      std::memcpy(chunk.data() + i, &v, 4);
    }
    for (size_t i = 120300; i + 2 <= 199000; i += 2) {
      float v = normal(rng);
      uint32_t u;
      std::memcpy(&u, &v, 4);
      chunk[i] = static_cast<uint8_t>(u >> 16);
      chunk[i + 1] = static_cast<uint8_t>(u >> 24);
    }
    const ckptfs::TensorRange ranges[] = {{300, 120000, DType::kF32}, {120300, 78700, DType::kBF16}};
    std::vector<uint8_t> payload;
    if (!ckptfs::EncodeTensorChunk(chunk, 0, ranges, {}, &payload).ok()) return 1;
    size_t n = chunk.size();
    std::vector<uint8_t> seed = {uint8_t(n), uint8_t(n >> 8), uint8_t(n >> 16), uint8_t(n >> 24)};
    seed.insert(seed.end(), payload.begin(), payload.end());
    FILE* f = std::fopen((std::string(argv[2]) + "/mixed").c_str(), "wb");
    if (!f || std::fwrite(seed.data(), 1, seed.size(), f) != seed.size() || std::fclose(f) != 0) return 1;
  }
  std::printf("%d lossless seeds\n", written);
  return written > 0 ? 0 : 1;
}
