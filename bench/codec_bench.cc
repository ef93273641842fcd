// Measures, on real checkpoint files and in one run, what each lossless
// method makes of them: zstd -3, zstd -19, byte grouping + zstd -3 (ZipNN's
// recipe), and ckptfs's chunk encoder exactly as sealing runs it (layout
// detection, 4 MiB chunks, tensor-aware planes). Also the order-0 entropy
// bound of the tensor planes. One thread; speeds are the best wall time of
// N rounds that interleave the methods (--repeats N, default 3).
//
//   codec_bench [--repeats N] [--no-zstd19] [--planes] FILE...
// Prints one JSON object per file on stdout (bench/codec_table.py reads it).
#include <zstd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "codec/chunk_codec.h"
#include "codec/formats/layout.h"
#include "codec/formats/ocdbt.h"
#include "codec/formats/onnx.h"
#include "codec/formats/tf_bundle.h"
#include "codec/lossless/entropy.h"
#include "codec/lossless/lanes.h"
#include "codec/lossless/plane_codec.h"
#include "codec/tensor_chunk.h"
#include "store/pack_format.h"

namespace ckptfs {
namespace {

using Bytes = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;

struct Chunk {
  uint64_t offset;
  std::span<const uint8_t> raw;
};

struct Method {
  uint64_t stored = 0;
  double enc_s = 0;
  double dec_s = 0;
};

// Sizes are the same every round; times keep the best.
void KeepBest(Method* best, const Method& m) {
  const bool first = best->enc_s == 0;
  best->stored = m.stored;
  best->enc_s = first ? m.enc_s : std::min(best->enc_s, m.enc_s);
  best->dec_s = first ? m.dec_s : std::min(best->dec_s, m.dec_s);
}

double BestOf(int repeats, const std::function<void()>& f) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

bool Check(bool ok, const std::string& what) {
  if (!ok) std::fprintf(stderr, "codec_bench: ROUND TRIP FAILED: %s\n", what.c_str());
  return ok;
}

// zstd at `level` per 4 MiB chunk, as a plain compressed store would.
Method MeasureZstd(const std::vector<Chunk>& chunks, int level, int repeats, bool* ok) {
  std::vector<Bytes> z(chunks.size());
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_DCtx* dctx = ZSTD_createDCtx();
  Method m;
  m.enc_s = BestOf(repeats, [&] {
    for (size_t i = 0; i < chunks.size(); ++i) {
      z[i].resize(ZSTD_compressBound(chunks[i].raw.size()));
      size_t n = ZSTD_compressCCtx(cctx, z[i].data(), z[i].size(), chunks[i].raw.data(), chunks[i].raw.size(), level);
      z[i].resize(ZSTD_isError(n) ? 0 : n);
    }
  });
  for (auto& b : z) m.stored += b.size();
  Bytes back(kDefaultChunkSize);
  m.dec_s = BestOf(repeats, [&] {
    for (size_t i = 0; i < chunks.size(); ++i)
      ZSTD_decompressDCtx(dctx, back.data(), back.size(), z[i].data(), z[i].size());
  });
  for (size_t i = 0; i < chunks.size(); ++i) {
    size_t n = ZSTD_decompressDCtx(dctx, back.data(), back.size(), z[i].data(), z[i].size());
    *ok &= Check(n == chunks[i].raw.size() && std::memcmp(back.data(), chunks[i].raw.data(), n) == 0, "zstd");
  }
  ZSTD_freeCCtx(cctx);
  ZSTD_freeDCtx(dctx);
  return m;
}

// ZipNN's recipe: within each tensor piece, byte k of every element into
// plane k (no bit rotation), each plane through zstd; metadata through zstd.
Method MeasureByteGroup(const std::vector<Chunk>& chunks, std::span<const TensorRange> ranges, int repeats, bool* ok) {
  struct Coded {
    std::vector<Bytes> parts;
  };
  std::vector<Coded> coded(chunks.size());
  std::vector<std::vector<ChunkPiece>> pieces(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    pieces[i] = CutChunk(chunks[i].offset, chunks[i].raw.size(),
                         RangesOverlapping(ranges, chunks[i].offset, chunks[i].offset + chunks[i].raw.size()));
  }
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_DCtx* dctx = ZSTD_createDCtx();
  auto zstd = [&](std::span<const uint8_t> b) {
    Bytes z(ZSTD_compressBound(b.size()));
    z.resize(ZSTD_compressCCtx(cctx, z.data(), z.size(), b.data(), b.size(), 3));
    return z;
  };
  Bytes planes(kDefaultChunkSize);
  Method m;
  m.enc_s = BestOf(repeats, [&] {
    for (size_t i = 0; i < chunks.size(); ++i) {
      coded[i].parts.clear();
      for (const ChunkPiece& p : pieces[i]) {
        auto bytes = chunks[i].raw.subspan(p.begin, p.end - p.begin);
        unsigned w = p.dtype == DType::kUnknown ? 1 : std::max(1u, DTypeSize(p.dtype));
        size_t lanes = bytes.size() / w;
        if (w == 1) {
          coded[i].parts.push_back(zstd(bytes));
          continue;
        }
        uint8_t* ptrs[8];
        for (unsigned k = 0; k < w; ++k) ptrs[k] = planes.data() + k * lanes;
        lossless::SplitLanes(w, false, bytes.data(), lanes, ptrs);
        for (unsigned k = 0; k < w; ++k) coded[i].parts.push_back(zstd({ptrs[k], lanes}));
        coded[i].parts.push_back(zstd(bytes.subspan(lanes * w)));
      }
    }
  });
  for (auto& c : coded)
    for (auto& p : c.parts) m.stored += p.size();
  Bytes back(kDefaultChunkSize);
  auto decode = [&](size_t i) {
    size_t part = 0;
    for (const ChunkPiece& p : pieces[i]) {
      uint8_t* dst = back.data() + p.begin;
      unsigned w = p.dtype == DType::kUnknown ? 1 : std::max(1u, DTypeSize(p.dtype));
      size_t n = p.end - p.begin, lanes = n / w;
      if (w == 1) {
        const Bytes& z = coded[i].parts[part++];
        ZSTD_decompressDCtx(dctx, dst, n, z.data(), z.size());
        continue;
      }
      const uint8_t* ptrs[8];
      for (unsigned k = 0; k < w; ++k) {
        const Bytes& z = coded[i].parts[part++];
        ZSTD_decompressDCtx(dctx, planes.data() + k * lanes, lanes, z.data(), z.size());
        ptrs[k] = planes.data() + k * lanes;
      }
      lossless::MergeLanes(w, false, ptrs, lanes, dst);
      const Bytes& tail = coded[i].parts[part++];
      ZSTD_decompressDCtx(dctx, dst + lanes * w, n - lanes * w, tail.data(), tail.size());
    }
  };
  m.dec_s = BestOf(repeats, [&] {
    for (size_t i = 0; i < chunks.size(); ++i) decode(i);
  });
  for (size_t i = 0; i < chunks.size(); ++i) {
    decode(i);
    *ok &= Check(std::memcmp(back.data(), chunks[i].raw.data(), chunks[i].raw.size()) == 0, "byte grouping");
  }
  ZSTD_freeCCtx(cctx);
  ZSTD_freeDCtx(dctx);
  return m;
}

// The encoder's defaults, or experiment knobs from the environment, e.g.
// CODEC_BENCH_METHODS=z for zstd-only planes.
ChunkEncoderOptions BenchOptions() {
  ChunkEncoderOptions opts;
  if (const char* m = std::getenv("CODEC_BENCH_METHODS")) {
    std::string ms = m;
    opts.planes.allow_zstd = ms.find('z') != std::string::npos;
    opts.planes.allow_rans = ms.find('r') != std::string::npos;
    opts.planes.allow_split = ms.find('s') != std::string::npos;
  }
  if (const char* g = std::getenv("CODEC_BENCH_RANS_MAX")) opts.planes.rans_max_size = std::atof(g);
  if (const char* g = std::getenv("CODEC_BENCH_SPLIT_GAIN")) opts.planes.split_min_gain_bits = std::atof(g);
  if (const char* g = std::getenv("CODEC_BENCH_GRID_GAIN")) opts.planes.grid_min_gain_bits = std::atof(g);
  return opts;
}

// The daemon's own path: EncodeChunk with the file's tensor ranges.
Method MeasureCkptfs(const std::vector<Chunk>& chunks, std::span<const TensorRange> ranges, int repeats, bool* ok,
                     nlohmann::json* codecs) {
  const ChunkEncoderOptions opts = BenchOptions();
  std::vector<Bytes> stored(chunks.size());
  std::vector<ChunkCodec> codec(chunks.size());
  Method m;
  m.enc_s = BestOf(repeats, [&] {
    for (size_t i = 0; i < chunks.size(); ++i) {
      const uint64_t off = chunks[i].offset;
      codec[i] =
          EncodeChunk(chunks[i].raw, opts, &stored[i], off, RangesOverlapping(ranges, off, off + chunks[i].raw.size()));
    }
  });
  for (size_t i = 0; i < chunks.size(); ++i) {
    m.stored += stored[i].size();
    (*codecs)[ChunkCodecName(codec[i])] = (*codecs).value(ChunkCodecName(codec[i]), 0) + 1;
  }
  Bytes back(kDefaultChunkSize);
  m.dec_s = BestOf(repeats, [&] {
    for (size_t i = 0; i < chunks.size(); ++i) {
      (void)DecodeChunk(codec[i], stored[i], std::span<uint8_t>(back).first(chunks[i].raw.size()));
    }
  });
  for (size_t i = 0; i < chunks.size(); ++i) {
    Status s = DecodeChunk(codec[i], stored[i], std::span<uint8_t>(back).first(chunks[i].raw.size()));
    *ok &= Check(s.ok() && std::memcmp(back.data(), chunks[i].raw.data(), chunks[i].raw.size()) == 0,
                 "ckptfs chunk " + std::to_string(i) + (s.ok() ? "" : ": " + s.ToString()));
  }
  return m;
}

// Order-0 entropy of every byte plane of every tensor piece (with the bit
// rotation ckptfs applies to floats); metadata counted at its zstd -19 size.
double EntropyBoundBytes(const std::vector<Chunk>& chunks, std::span<const TensorRange> ranges) {
  double total = 0;
  Bytes planes(kDefaultChunkSize);
  for (const Chunk& c : chunks) {
    for (const ChunkPiece& p :
         CutChunk(c.offset, c.raw.size(), RangesOverlapping(ranges, c.offset, c.offset + c.raw.size()))) {
      auto bytes = c.raw.subspan(p.begin, p.end - p.begin);
      if (p.dtype == DType::kUnknown) {
        Bytes z(ZSTD_compressBound(bytes.size()));
        total += static_cast<double>(ZSTD_compress(z.data(), z.size(), bytes.data(), bytes.size(), 19));
        continue;
      }
      unsigned w = std::max(1u, DTypeSize(p.dtype));
      size_t lanes = bytes.size() / w;
      uint8_t* ptrs[8];
      for (unsigned k = 0; k < w; ++k) ptrs[k] = planes.data() + k * lanes;
      lossless::SplitLanes(w, DTypeIsFloat(p.dtype) && w >= 2, bytes.data(), lanes, ptrs);
      for (unsigned k = 0; k < w; ++k) total += lossless::Order0EntropyBits({ptrs[k], lanes}) / 8;
      total += static_cast<double>(bytes.size() - lanes * w);
    }
  }
  return total;
}

// Which plane methods the tensor pieces got, and how close each plane came
// to its order-0 entropy: for tuning, printed with --planes.
nlohmann::json PlaneReport(const std::vector<Chunk>& chunks, std::span<const TensorRange> ranges) {
  std::map<std::string, std::array<double, 3>> agg;  // "dtype plane k method" -> raw, stored, entropy
  for (const Chunk& c : chunks) {
    for (const ChunkPiece& p :
         CutChunk(c.offset, c.raw.size(), RangesOverlapping(ranges, c.offset, c.offset + c.raw.size()))) {
      if (p.dtype == DType::kUnknown) continue;
      Bytes out;
      lossless::EncodeStats st;
      (void)lossless::EncodeTensorBytes(p.dtype, c.raw.subspan(p.begin, p.end - p.begin), {p.row_length, p.first_col},
                                        BenchOptions().planes, &out, &st);
      for (size_t k = 0; k < st.planes.size(); ++k) {
        const char* grid = st.transform == lossless::PlaneTransform::kRotl1Grid ? " grid" : "";
        auto& a = agg[std::string(DTypeName(p.dtype)) + grid + " plane " + std::to_string(k) + " " +
                      lossless::PlaneMethodName(st.planes[k].method)];
        a[0] += double(st.planes[k].raw_bytes);
        a[1] += double(st.planes[k].stored_bytes);
        a[2] += st.planes[k].entropy_bits / 8;
      }
    }
  }
  nlohmann::json j = nlohmann::json::object();
  for (auto& [k, a] : agg) j[k] = {{"raw", a[0]}, {"stored", a[1]}, {"entropy", a[2]}};
  return j;
}

nlohmann::json MethodJson(const Method& m, uint64_t size) {
  return {{"stored", m.stored},
          {"ratio", m.stored ? double(size) / double(m.stored) : 0.0},
          {"enc_mbps", m.enc_s > 0 ? double(size) / 1e6 / m.enc_s : 0.0},
          {"dec_mbps", m.dec_s > 0 ? double(size) / 1e6 / m.dec_s : 0.0}};
}

// An Orbax data file's layout comes from the OCDBT database around it
// (../manifest.ocdbt and the tree nodes in d/), as the store's seal finds it
// (seal/ocdbt_data.h).
std::optional<FileLayout> OcdbtLayoutOf(const std::filesystem::path& path, const Bytes& data) {
  const std::filesystem::path root = path.parent_path().parent_path();
  if (path.parent_path().filename() != "d" || !std::filesystem::exists(root / "manifest.ocdbt")) return std::nullopt;
  std::vector<std::shared_ptr<Bytes>> keep;
  formats::OcdbtOpener open = [&](const std::string& rel) -> Result<std::shared_ptr<const ByteSource>> {
    std::ifstream f(root / rel, std::ios::binary);
    if (!f) return Status::Error(ENOENT, rel);
    keep.push_back(std::make_shared<Bytes>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()));
    return std::shared_ptr<const ByteSource>(std::make_shared<SpanSource>(*keep.back()));
  };
  Result<std::shared_ptr<const ByteSource>> manifest = open("manifest.ocdbt");
  if (!manifest.ok()) return std::nullopt;
  Result<formats::OcdbtRoot> root_node = formats::ReadOcdbtManifest(**manifest);
  if (!root_node.ok()) return std::nullopt;
  Result<std::vector<formats::OcdbtEntry>> keys = formats::ListOcdbt(*root_node, open);
  if (!keys.ok()) return std::nullopt;
  Result<FileLayout> l = formats::OcdbtDataLayout(*keys, "d/" + path.filename().string(), data.size(), open);
  return l.ok() ? std::optional<FileLayout>(std::move(l).value()) : std::nullopt;
}

// An ONNX external data file's layout comes from the model beside it that
// names it, as the store's seal finds it (seal/onnx_external.h).
FileLayout OnnxExternalLayoutOf(const std::string& path, const Bytes& data, const FileLayout& unknown) {
  const std::filesystem::path p(path);
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(p.parent_path(), ec)) {
    if (e.path().extension() != ".onnx") continue;
    std::ifstream f(e.path(), std::ios::binary);
    Bytes b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto refs = formats::ReadOnnxExternalTensors(SpanSource(b));
    if (!refs.ok()) continue;
    if (auto l = formats::OnnxExternalLayout(*refs, p.filename().string(), data.size())) return *l;
  }
  return unknown;
}

// A chunk file of Orbax's legacy per-array zarr layout (use_ocdbt=False)
// gets its layout from the .zarray beside it and its directory's name, as
// the store's seal finds it (seal/ocdbt_data.h, ZarrChunkLayoutFromSiblings).
std::optional<FileLayout> ZarrChunkLayoutOf(const std::filesystem::path& path, const Bytes& data) {
  if (!formats::LooksLikeZarrChunkName(path.filename().string())) return std::nullopt;
  std::ifstream f(path.parent_path() / ".zarray", std::ios::binary);
  if (!f) return std::nullopt;
  std::string zarray((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  Result<FileLayout> l = formats::ZarrChunkFileLayout(zarray, std::filesystem::absolute(path).parent_path().filename(),
                                                      path.filename().string(), data.size());
  return l.ok() ? std::optional<FileLayout>(std::move(l).value()) : std::nullopt;
}

// A TF data shard's layout comes from the bundle index beside it, as the
// store's seal finds it (seal/tf_shards.h).
FileLayout LayoutOf(const std::string& path, const Bytes& data) {
  FileLayout layout = DetectLayout(SpanSource(data));
  if (layout.format != "unknown") return layout;
  if (std::optional<FileLayout> o = OcdbtLayoutOf(path, data)) return *o;
  if (std::optional<FileLayout> z = ZarrChunkLayoutOf(path, data)) return *z;
  std::vector<formats::NamedTfIndex> indexes;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path(), ec)) {
    if (e.path().extension() != ".index") continue;
    std::ifstream f(e.path(), std::ios::binary);
    Bytes b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (auto idx = formats::ReadTfBundleIndex(SpanSource(b)); idx.ok()) indexes.push_back({e.path(), *idx});
  }
  std::optional<FileLayout> tf = formats::TfDataLayoutFromIndexes(SpanSource(data), indexes);
  return tf ? *tf : OnnxExternalLayoutOf(path, data, layout);
}

int BenchFile(const std::string& path, int repeats, bool zstd19, bool planes, bool only_ckptfs) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  Bytes data(f ? static_cast<size_t>(f.tellg()) : 0);
  if (!f || !f.seekg(0) || !f.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(data.size()))) {
    std::fprintf(stderr, "codec_bench: cannot read %s\n", path.c_str());
    return 2;
  }
  FileLayout layout = LayoutOf(path, data);
  std::vector<TensorRange> ranges = TensorRangesOf(layout);
  std::vector<Chunk> chunks;
  for (uint64_t off = 0; off < data.size(); off += kDefaultChunkSize) {
    chunks.push_back(
        {off, std::span<const uint8_t>(data).subspan(off, std::min<uint64_t>(kDefaultChunkSize, data.size() - off))});
  }
  uint64_t tensor_bytes = 0;
  for (const TensorRange& r : ranges) tensor_bytes += r.length;
  bool ok = true;
  nlohmann::json codecs = nlohmann::json::object();
  nlohmann::json j = {{"file", path},
                      {"size", data.size()},
                      {"format", layout.format},
                      {"tensor_bytes", tensor_bytes},
                      {"rounds", repeats}};
  // Rounds interleave the methods, so a slow spell of a shared machine
  // slows all of them rather than one; each round times every method twice
  // (the first run grows its buffers) and the best time of all rounds counts.
  Method ckptfs, zstd3, bytegroup;
  for (int round = 0; round < repeats; ++round) {
    codecs = nlohmann::json::object();  // counted once, not per round
    KeepBest(&ckptfs, MeasureCkptfs(chunks, ranges, 2, &ok, &codecs));
    if (only_ckptfs) continue;
    KeepBest(&zstd3, MeasureZstd(chunks, 3, 2, &ok));
    KeepBest(&bytegroup, MeasureByteGroup(chunks, ranges, 2, &ok));
  }
  j["ckptfs"] = MethodJson(ckptfs, data.size());
  if (only_ckptfs) {
    std::printf("%s\n", j.dump().c_str());
    return ok ? 0 : 1;
  }
  j["zstd3"] = MethodJson(zstd3, data.size());
  j["bytegroup"] = MethodJson(bytegroup, data.size());
  j["entropy_bound"] = EntropyBoundBytes(chunks, ranges);
  if (planes) j["planes"] = PlaneReport(chunks, ranges);
  if (zstd19) j["zstd19"] = MethodJson(MeasureZstd(chunks, 19, 1, &ok), data.size());
  j["ckptfs_chunks"] = codecs;
  j["round_trip_ok"] = ok;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace ckptfs

int main(int argc, char** argv) {
  int repeats = 3;
  bool zstd19 = true;
  bool planes = false;
  bool only_ckptfs = false;  // for profiling the codec alone
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--only-ckptfs") {
      only_ckptfs = true;
    } else if (a == "--planes") {
      planes = true;
    } else if (a == "--no-zstd19") {
      zstd19 = false;
    } else if (a.starts_with("--")) {
      std::fprintf(stderr, "usage: codec_bench [--repeats N] [--no-zstd19] FILE...\n");
      return 2;
    } else {
      files.push_back(a);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: codec_bench [--repeats N] [--no-zstd19] FILE...\n");
    return 2;
  }
  int rc = 0;
  for (const std::string& f : files) rc = std::max(rc, ckptfs::BenchFile(f, repeats, zstd19, planes, only_ckptfs));
  return rc;
}
