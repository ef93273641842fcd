// Writes seeds for fuzz_lossless_decode: real blobs from the encoder for
// each dtype and a few kinds of content, each prefixed with the raw size
// (u32 LE) as the fuzz target expects. Usage: lossless_seed_gen OUT_DIR
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codec/dtype.h"
#include "codec/lossless/plane_codec.h"

using ckptfs::DType;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const DType kTypes[] = {DType::kF32, DType::kBF16, DType::kF16,  DType::kF64,    DType::kI64,
                          DType::kU8,  DType::kC64,  DType::kBool, DType::kUnknown};
  int written = 0;
  for (DType t : kTypes) {
    for (int kind = 0; kind < 3; ++kind) {
      // Normal weights, a constant run, and an odd length with a partial element.
      size_t n = kind == 2 ? 1001 : 4096;
      std::vector<uint8_t> raw(n);
      for (size_t i = 0; i + 4 <= n; i += 4) {
        float v = kind == 1 ? 1.0f : normal(rng);
        if (t == DType::kBF16 || t == DType::kF16) v = std::ldexp(v, 16);  // spread the high bytes
        std::memcpy(raw.data() + i, &v, 4);
      }
      std::vector<uint8_t> blob;
      if (!ckptfs::lossless::EncodeTensorBytes(t, raw, {}, &blob).ok()) continue;
      std::vector<uint8_t> seed = {uint8_t(n), uint8_t(n >> 8), uint8_t(n >> 16), uint8_t(n >> 24)};
      seed.insert(seed.end(), blob.begin(), blob.end());
      std::string path = std::string(argv[1]) + "/" + std::string(ckptfs::DTypeName(t)) + "-" + std::to_string(kind);
      FILE* f = std::fopen(path.c_str(), "wb");
      if (!f || std::fwrite(seed.data(), 1, seed.size(), f) != seed.size() || std::fclose(f) != 0) return 1;
      ++written;
    }
  }
  std::printf("%d lossless seeds\n", written);
  return written > 0 ? 0 : 1;
}
