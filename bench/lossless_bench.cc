// Compares the lossless tensor codec with zstd and a ZipNN-style baseline
// (byte grouping + zstd per plane) on one tensor file or synthetic weights.
//
//   lossless_bench --dtype BF16 --file weights.bin [--chunk 4194304]
//   lossless_bench --dtype F32 --synthetic 4194304 --std 0.02
//
// The file is raw little-endian elements (no header). With --chunk the
// input is coded in independent chunks, as the pack layer would.
#include <strings.h>
#include <zstd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "codec/dtype.h"
#include "codec/lossless/entropy.h"
#include "codec/lossless/plane_codec.h"

namespace ckptfs::lossless {
namespace {

struct Args {
  DType dtype = DType::kF32;
  std::string file;
  size_t synthetic = 0;
  float stddev = 0.02f;
  size_t chunk = 0;
  int level = 3;
  int repeats = 3;
  std::string methods = "zrs";  // z = zstd, r = rANS, s = context split
};

bool ParseDType(const std::string& s, DType* t) {
  for (int v = 0; v <= static_cast<int>(DType::kC128); ++v) {
    if (strcasecmp(std::string(DTypeName(static_cast<DType>(v))).c_str(), s.c_str()) == 0) {
      *t = static_cast<DType>(v);
      return true;
    }
  }
  return false;
}

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) return false;
    std::string v = argv[++i];
    if (k == "--dtype") {
      if (!ParseDType(v, &a->dtype)) return false;
    } else if (k == "--file") {
      a->file = v;
    } else if (k == "--synthetic") {
      a->synthetic = std::stoull(v);
    } else if (k == "--std") {
      a->stddev = std::stof(v);
    } else if (k == "--chunk") {
      a->chunk = std::stoull(v);
    } else if (k == "--level") {
      a->level = std::stoi(v);
    } else if (k == "--methods") {
      a->methods = v;
    } else if (k == "--repeats") {
      a->repeats = std::max(1, std::stoi(v));
    } else {
      return false;
    }
  }
  return !a->file.empty() || a->synthetic > 0;
}

bool ReadFile(const std::string& path, std::vector<uint8_t>* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return true;
}

uint16_t FloatToF16(uint32_t x) {
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t a = x & 0x7fffffff;
  if (a >= 0x7f800000) return static_cast<uint16_t>(sign | (a > 0x7f800000 ? 0x7e00 : 0x7c00));
  if (a >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // >= 65520 rounds to inf
  if (a < 0x38800000) {  // half subnormal: exact scaling, then round to nearest even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(std::bit_cast<float>(a) * 16777216.0f)));
  }
  return static_cast<uint16_t>(sign | ((a + 0xc8000fff + ((a >> 13) & 1)) >> 13));
}

// Normal weights rounded to the requested float type (round to nearest even).
std::vector<uint8_t> Synthetic(DType t, size_t n, float stddev) {
  std::mt19937_64 rng(1);
  std::normal_distribution<float> dist(0.0f, stddev);
  unsigned w = DTypeSize(t);
  std::vector<uint8_t> out(n * w);
  for (size_t i = 0; i < n; ++i) {
    uint32_t x = std::bit_cast<uint32_t>(dist(rng));
    if (t == DType::kBF16) {
      uint16_t h = static_cast<uint16_t>((x + 0x7fff + ((x >> 16) & 1)) >> 16);
      std::memcpy(&out[i * 2], &h, 2);
    } else if (t == DType::kF16) {
      uint16_t h = FloatToF16(x);
      std::memcpy(&out[i * 2], &h, 2);
    } else if (t == DType::kF64) {
      double d = std::bit_cast<float>(x);
      std::memcpy(&out[i * 8], &d, 8);
    } else if (w == 4) {
      std::memcpy(&out[i * 4], &x, 4);
    } else {
      std::fprintf(stderr, "--synthetic supports F32, F64, F16, BF16 only\n");
      std::exit(2);
    }
  }
  return out;
}

size_t ZstdSize(std::span<const uint8_t> b, int level) {
  std::vector<uint8_t> z(ZSTD_compressBound(b.size()));
  size_t n = ZSTD_compress(z.data(), z.size(), b.data(), b.size(), level);
  return ZSTD_isError(n) ? b.size() : std::min(n, b.size());
}

// ZipNN-style: group byte k of every element into plane k, compress each
// plane on its own (ZipNN uses Huffman; zstd's entropy stage is Huffman too).
size_t ByteGroupZstdSize(std::span<const uint8_t> b, unsigned w, int level) {
  size_t lanes = b.size() / w;
  size_t total = b.size() - lanes * w;
  std::vector<uint8_t> plane(lanes);
  for (unsigned k = 0; k < w; ++k) {
    for (size_t i = 0; i < lanes; ++i) plane[i] = b[i * w + k];
    total += ZstdSize(plane, level);
  }
  return total;
}

std::vector<std::span<const uint8_t>> Chunks(std::span<const uint8_t> b, size_t chunk) {
  std::vector<std::span<const uint8_t>> out;
  if (chunk == 0) chunk = b.size() ? b.size() : 1;
  for (size_t off = 0; off < b.size(); off += chunk) out.push_back(b.subspan(off, std::min(chunk, b.size() - off)));
  return out;
}

double Seconds(std::chrono::steady_clock::time_point a) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

// The input: the file's bytes, or synthetic weights. False (after a
// message) when the file cannot be read.
bool LoadInput(const Args& a, std::vector<uint8_t>* data) {
  if (a.file.empty()) {
    *data = Synthetic(a.dtype, a.synthetic, a.stddev);
    return true;
  }
  if (!ReadFile(a.file, data)) {
    std::fprintf(stderr, "cannot read %s\n", a.file.c_str());
    return false;
  }
  return true;
}

PlaneCodecOptions CodecOptions(const Args& a) {
  PlaneCodecOptions opts;
  opts.zstd_level = a.level;
  opts.allow_zstd = a.methods.find('z') != std::string::npos;
  opts.allow_rans = a.methods.find('r') != std::string::npos;
  opts.allow_split = a.methods.find('s') != std::string::npos;
  return opts;
}

// Sizes the baselines reach on the same chunks.
struct Baselines {
  size_t zstd = 0;
  size_t grouped = 0;  // ZipNN-style
};

Baselines MeasureBaselines(const std::vector<std::span<const uint8_t>>& chunks, unsigned w, int level) {
  Baselines b;
  for (auto c : chunks) {
    b.zstd += ZstdSize(c, level);
    b.grouped += ByteGroupZstdSize(c, w, level);
  }
  return b;
}

struct Encoded {
  std::vector<std::vector<uint8_t>> blobs;  // one per chunk
  std::vector<EncodeStats> stats;
  double best_seconds = 1e30;
};

// Encodes every chunk `a.repeats` times, keeping the fastest time. False
// (after a message) when a chunk fails to encode.
bool EncodeAll(const Args& a, const std::vector<std::span<const uint8_t>>& chunks, const PlaneCodecOptions& opts,
               Encoded* enc) {
  enc->blobs.assign(chunks.size(), {});
  enc->stats.assign(chunks.size(), {});
  for (int r = 0; r < a.repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < chunks.size(); ++i) {
      enc->blobs[i].clear();
      Status s = EncodeTensorBytes(a.dtype, chunks[i], opts, &enc->blobs[i], &enc->stats[i]);
      if (!s.ok()) {
        std::fprintf(stderr, "encode: %s\n", s.ToString().c_str());
        return false;
      }
    }
    enc->best_seconds = std::min(enc->best_seconds, Seconds(t0));
  }
  return true;
}

// Decodes every chunk into `back` `a.repeats` times; the fastest time, or
// nullopt (after a message) when a chunk fails to decode.
std::optional<double> DecodeAll(const Args& a, const std::vector<std::span<const uint8_t>>& chunks, const Encoded& enc,
                                std::vector<uint8_t>* back) {
  double best = 1e30;
  for (int r = 0; r < a.repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    size_t off = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      Status s = DecodeTensorBytes(enc.blobs[i], std::span<uint8_t>(*back).subspan(off, chunks[i].size()));
      if (!s.ok()) {
        std::fprintf(stderr, "decode: %s\n", s.ToString().c_str());
        return std::nullopt;
      }
      off += chunks[i].size();
    }
    best = std::min(best, Seconds(t0));
  }
  return best;
}

void PrintReport(const Args& a, size_t input_size, const std::vector<std::span<const uint8_t>>& chunks,
                 const Baselines& base, const Encoded& enc, double dec_best) {
  size_t ours = 0;
  double entropy_bytes = 0;
  size_t rotated = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const EncodeStats& st = enc.stats[i];
    ours += enc.blobs[i].size();
    rotated += st.transform == PlaneTransform::kRotl1Planes;
    size_t lanes = st.planes.empty() ? 0 : st.planes[0].raw_bytes;
    entropy_bytes += static_cast<double>(chunks[i].size() - lanes * st.planes.size());  // verbatim tail
    for (const PlaneStats& p : st.planes) entropy_bytes += std::min(p.entropy_bits / 8, double(p.raw_bytes));
  }
  double mb = static_cast<double>(input_size) / 1e6;
  auto ratio = [&](double n) { return n > 0 ? static_cast<double>(input_size) / n : 0.0; };
  std::printf("input        %s, %s, %zu bytes, %zu chunk(s), %zu rotated\n",
              a.file.empty() ? "synthetic" : a.file.c_str(), std::string(DTypeName(a.dtype)).c_str(), input_size,
              chunks.size(), rotated);
  std::printf("zstd -%d      ratio %.4f\n", a.level, ratio(double(base.zstd)));
  std::printf("bytegrp+zstd ratio %.4f   (ZipNN-style)\n", ratio(double(base.grouped)));
  std::printf("lossless     ratio %.4f   (%.2f%% over entropy bound)\n", ratio(double(ours)),
              100.0 * (double(ours) / entropy_bytes - 1.0));
  std::printf("entropy bnd  ratio %.4f   (order-0 per plane of the chosen transform)\n", ratio(entropy_bytes));
  std::printf("speed        encode %.0f MB/s, decode %.0f MB/s (1 thread, best of %d)\n", mb / enc.best_seconds,
              mb / dec_best, a.repeats);
  if (chunks.size() == 1) {
    for (size_t k = 0; k < enc.stats[0].planes.size(); ++k) {
      const PlaneStats& p = enc.stats[0].planes[k];
      std::printf("  plane %zu: %-5s %10llu -> %10llu bytes, entropy %.0f bytes\n", k, PlaneMethodName(p.method),
                  static_cast<unsigned long long>(p.raw_bytes), static_cast<unsigned long long>(p.stored_bytes),
                  p.entropy_bits / 8);
    }
  }
}

int Run(const Args& a) {
  std::vector<uint8_t> data;
  if (!LoadInput(a, &data)) return 1;
  unsigned w = DTypeSize(a.dtype) ? DTypeSize(a.dtype) : 1;
  if (a.chunk % w != 0) {
    std::fprintf(stderr, "--chunk must be a multiple of the element size %u\n", w);
    return 2;
  }
  auto chunks = Chunks(data, a.chunk);
  const Baselines base = MeasureBaselines(chunks, w, a.level);
  Encoded enc;
  if (!EncodeAll(a, chunks, CodecOptions(a), &enc)) return 1;
  std::vector<uint8_t> back(data.size());
  std::optional<double> dec_best = DecodeAll(a, chunks, enc, &back);
  if (!dec_best) return 1;
  if (back != data) {
    std::fprintf(stderr, "ROUND TRIP MISMATCH\n");
    return 1;
  }
  PrintReport(a, data.size(), chunks, base, enc, *dec_best);
  return 0;
}

}  // namespace
}  // namespace ckptfs::lossless

int main(int argc, char** argv) {
  ckptfs::lossless::Args a;
  if (!ckptfs::lossless::ParseArgs(argc, argv, &a)) {
    std::fprintf(stderr,
                 "usage: lossless_bench --dtype F32|BF16|F16|... (--file PATH | --synthetic N [--std S])\n"
                 "                      [--chunk BYTES] [--level N] [--repeats N]\n");
    return 2;
  }
  return ckptfs::lossless::Run(a);
}
