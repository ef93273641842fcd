#include "codec/lossy/quantizer.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "codec/cpu_features.h"
#include "codec/lossless/byte_io.h"
#include "codec/lossless/rans.h"
#include "codec/lossless/scratch.h"
#include "codec/lossy/float_bits.h"
#include "codec/lossy/piece_format.h"

namespace ckptfs::lossy {
namespace {

using lossless::ByteReader;
using piece::kFlagAgainstBase;
using piece::kFlagUniformGrid;
using piece::kMaxLevelStep;
using piece::StoredLevels;
using piece::UnZigZag;

Status Malformed(const std::string& what) { return Status::Corruption("lossy piece: " + what); }

// The elements from their symbols, one instance per element type and
// domain, so that loads, stores and the reconstruction inline without
// branching on them. Per element, both the predictor and the predictor
// moved by the symbol's level are computed and one is selected (whether an
// element was pruned is data, and a branch on it mispredicts); the bits are
// piece::Reconstruct's.
template <DType T, Domain D>
struct LevelTable {
  // Levels by symbol; symbol 0's entry is never selected.
  std::array<float, 256> add{};
  std::array<int64_t, 256> step{};
  LevelTable(unsigned k, const StoredLevels& lv) {
    for (unsigned s = 1; s <= k; ++s) {
      if constexpr (D == Domain::kValue) {
        add[s] = lv.value[s - 1];
      } else {
        step[s] = lv.steps[s - 1];
      }
    }
  }
  // The levels by symbol of this domain (the vector loops' table).
  const auto* Levels() const {
    if constexpr (D == Domain::kValue) {
      return add.data();
    } else {
      return step.data();
    }
  }
  // Element i of a symbol other than an escape.
  uint32_t Element(unsigned sym, const uint8_t* base, size_t i) const {
    const uint32_t pred = base != nullptr ? LoadBits(T, base, i) : 0;
    uint32_t moved;
    if constexpr (D == Domain::kValue) {
      moved = FloatToBits(T, BitsToFloat(T, pred) + add[sym]);
    } else {
      moved = piece::ClampBits(T, static_cast<int64_t>(pred) + step[sym]);
    }
    // A mask, not `?:`: the compiler would turn that back into a branch.
    const uint32_t keep = 0u - static_cast<uint32_t>(sym == 0);
    return moved ^ ((moved ^ pred) & keep);
  }
};

#if defined(__x86_64__)
// LevelTable::Element for f32, eight elements a step. The compiler's loops
// looked each level up on its own, and took a third of the daemon's CPU in
// a cold read of a lossy checkpoint.
//
// Values: the levels by gather and the same single-precision add.
__attribute__((target("avx2"))) __m256i MovedF32(__m256i pred, __m256i sym, const float* add) {
  const __m256 level = _mm256_i32gather_ps(add, sym, 4);
  return _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(pred), level));
}

// Bit patterns (the log domain): the predictor's bits plus the level's
// step in 64-bit lanes, clamped to [0, the largest finite float] as
// piece::ClampBits does, four at a time.
__attribute__((target("avx2"))) __m128i StepAndClamp(__m128i pred, __m128i sym, const int64_t* step) {
  const __m256i zero = _mm256_setzero_si256(), top = _mm256_set1_epi64x(MaxFiniteBits(DType::kF32));
  __m256i sum = _mm256_add_epi64(_mm256_cvtepu32_epi64(pred),
                                 _mm256_i32gather_epi64(reinterpret_cast<const long long*>(step), sym, 8));
  sum = _mm256_blendv_epi8(sum, zero, _mm256_cmpgt_epi64(zero, sum));
  sum = _mm256_blendv_epi8(sum, top, _mm256_cmpgt_epi64(sum, top));
  const __m256i low_halves = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(sum, low_halves));
}

__attribute__((target("avx2"))) __m256i MovedF32(__m256i pred, __m256i sym, const int64_t* step) {
  const __m128i lo = StepAndClamp(_mm256_castsi256_si128(pred), _mm256_castsi256_si128(sym), step);
  const __m128i hi = StepAndClamp(_mm256_extracti128_si256(pred, 1), _mm256_extracti128_si256(sym, 1), step);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

// n elements from their symbols and the predictor (null: zeros), the
// predictor itself where the symbol is 0; `levels` is LevelTable::Levels:
// add (values) or step (bits). Returns the elements done, a multiple of 8.
template <typename Level>
__attribute__((target("avx2"))) size_t RebuildF32Avx2(const uint8_t* symbols, size_t n, const Level* levels,
                                                      const uint8_t* base, uint8_t* out) {
  const __m256i zero = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i sym = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(symbols + i)));
    const __m256i pred = base != nullptr ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + 4 * i)) : zero;
    const __m256i keep = _mm256_cmpeq_epi32(sym, zero);
    const __m256i moved = MovedF32(pred, sym, levels);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 4 * i), _mm256_blendv_epi8(moved, pred, keep));
  }
  return i;
}
#endif

// Elements [begin, end), none of them an escape: eight at a time where the
// CPU allows, the rest one by one.
template <DType T, Domain D>
void RebuildRun(const LevelTable<T, D>& table, const uint8_t* symbols, size_t begin, size_t end, const uint8_t* base,
                uint8_t* out) {
  size_t i = begin;
#if defined(__x86_64__)
  if constexpr (T == DType::kF32) {
    const size_t at = 4 * begin;
    const uint8_t* b = base != nullptr ? base + at : nullptr;
    if (CpuHasAvx2()) i += RebuildF32Avx2(symbols + begin, end - begin, table.Levels(), b, out + at);
  }
#endif
  for (; i < end; ++i) StoreBits(T, out, i, table.Element(symbols[i], base, i));
}

// A piece with escapes (or symbols not checked yet): the runs between
// escapes as RebuildRun does, each escape from the stored ones.
template <DType T, Domain D>
Status Rebuild(std::span<const uint8_t> symbols, unsigned k, const StoredLevels& lv, const uint8_t* base,
               std::span<const uint8_t> esc, uint64_t n_esc, uint64_t* next_esc, std::span<uint8_t> out) {
  const LevelTable<T, D> table(k, lv);
  const size_t n = symbols.size();
  for (size_t i = 0; i < n; ++i) {
    size_t run = i;
    while (run < n && symbols[run] <= k) ++run;
    RebuildRun(table, symbols.data(), i, run, base, out.data());
    if (run == n) break;
    if (symbols[run] != k + 1u) return Malformed("symbol out of range");
    if (*next_esc == n_esc) return Malformed("more escape symbols than escapes");
    StoreBits(T, out.data(), run, LoadBits(T, esc.data(), (*next_esc)++));
    i = run;
  }
  return Status::Ok();
}

// A piece without escapes whose symbols were checked to be at most k: one run.
template <DType T, Domain D>
void RebuildChecked(std::span<const uint8_t> symbols, unsigned k, const StoredLevels& lv, const uint8_t* base,
                    std::span<uint8_t> out) {
  RebuildRun(LevelTable<T, D>(k, lv), symbols.data(), 0, symbols.size(), base, out.data());
}

// What a piece's symbols hold, eight at a time (a byte loop compiles to a
// scalar one): whether all are 0, and whether any is above k.
struct SymbolSurvey {
  bool all_zero = true;
  bool any_above = false;
};

SymbolSurvey Survey(std::span<const uint8_t> symbols, unsigned k) {
  SymbolSurvey out;
  size_t i = 0;
  if (k < 128) {
    // A byte b > k has its high bit set in (b + 127 - k) | b. A carry out
    // of a byte above 127 can only add to what is already found.
    constexpr uint64_t kOnes = 0x0101010101010101ull, kHighs = 0x8080808080808080ull;
    const uint64_t add = kOnes * (127 - k);
    uint64_t any = 0, above = 0;
    for (; i + 8 <= symbols.size(); i += 8) {
      uint64_t x;
      std::memcpy(&x, symbols.data() + i, 8);
      any |= x;
      above |= ((x + add) | x) & kHighs;
    }
    out.all_zero = any == 0;
    out.any_above = above != 0;
  }
  for (; i < symbols.size(); ++i) {
    out.all_zero = out.all_zero && symbols[i] == 0;
    out.any_above = out.any_above || symbols[i] > k;
  }
  return out;
}

template <DType T, Domain D>
Status RebuildPiece(std::span<const uint8_t> symbols, unsigned k, const StoredLevels& lv, const uint8_t* base,
                    std::span<const uint8_t> esc, uint64_t n_esc, uint64_t* next_esc, std::span<uint8_t> out) {
  if (n_esc != 0) return Rebuild<T, D>(symbols, k, lv, base, esc, n_esc, next_esc, out);
  const SymbolSurvey survey = Survey(symbols, k);
  // Every element kept its predecessor's bits (what a checkpoint that
  // moved less than its budget since its base is made of): a copy.
  if (survey.all_zero) {
    // An empty span's data() may be null, which memcpy and memset must not get.
    if (out.empty()) return Status::Ok();
    if (base != nullptr) {
      std::memcpy(out.data(), base, out.size());
    } else {
      std::memset(out.data(), 0, out.size());
    }
    return Status::Ok();
  }
  // An escape symbol or worse: the checking loop reports it.
  if (survey.any_above) return Rebuild<T, D>(symbols, k, lv, base, esc, n_esc, next_esc, out);
  RebuildChecked<T, D>(symbols, k, lv, base, out);
  return Status::Ok();
}

// The k levels after a piece's header: listed, or a uniform grid's step
// and first multiple.
Status ReadLevels(ByteReader& r, Domain d, bool grid, unsigned k, StoredLevels* lv) {
  if (grid) {
    uint32_t bits = 0;
    uint64_t z = 0;
    RETURN_IF_ERROR(r.U32(&bits, "grid step"));
    RETURN_IF_ERROR(r.Varint(&z, "grid's first multiple"));
    const UniformGrid g{std::bit_cast<float>(bits), UnZigZag(z)};
    const int64_t limit = piece::kMaxGridMultiple;
    // The encoder keeps the first and the last multiple within ±limit.
    if (k == 0 || !(g.step > 0) || !std::isfinite(g.step) || g.first < -limit || g.first > limit - (k - 1))
      return Malformed("bad uniform grid");
    for (unsigned i = 0; i < k; ++i) lv->value.push_back(piece::GridLevel(g, i));
    lv->grid = g;
    return Status::Ok();
  }
  for (unsigned i = 0; i < k; ++i) {
    if (d == Domain::kValue) {
      uint32_t bits = 0;
      RETURN_IF_ERROR(r.U32(&bits, "level"));
      lv->value.push_back(std::bit_cast<float>(bits));
    } else {
      uint64_t z = 0;
      RETURN_IF_ERROR(r.Varint(&z, "level"));
      // A step beyond the span of the bit patterns moves every element to a
      // bound; refused, so that adding it to one is never an overflow.
      const int64_t step = UnZigZag(z);
      if (step < -kMaxLevelStep || step > kMaxLevelStep) return Malformed("level step out of range");
      lv->steps.push_back(step);
    }
  }
  return Status::Ok();
}

}  // namespace

Status DecodePiece(std::span<const uint8_t> blob, std::span<const uint8_t> base, std::span<uint8_t> out) {
  ByteReader r(blob);
  uint8_t version = 0, dt = 0, dom = 0, flags = 0, k = 0;
  RETURN_IF_ERROR(r.Byte(&version, "version"));
  if (version != 1 && version != kPieceVersion) return Malformed("unknown version " + std::to_string(version));
  RETURN_IF_ERROR(r.Byte(&dt, "dtype"));
  RETURN_IF_ERROR(r.Byte(&dom, "domain"));
  RETURN_IF_ERROR(r.Byte(&flags, "flags"));
  const DType t = static_cast<DType>(dt);
  // Version 1 knew only kFlagAgainstBase; a grid stores value levels only.
  const uint8_t known = version == 1 || dom != 0 ? kFlagAgainstBase : kFlagAgainstBase | kFlagUniformGrid;
  if (!LossyDTypeSupported(t) || dom > 1 || (flags & ~known) != 0) return Malformed("bad header");
  const Domain d = static_cast<Domain>(dom);
  const size_t es = DTypeSize(t);
  uint64_t n = 0;
  RETURN_IF_ERROR(r.Varint(&n, "element count"));
  if (out.size() % es != 0 || n != out.size() / es) return Malformed("element count does not match the chunk");
  const bool against_base = (flags & kFlagAgainstBase) != 0;
  if (against_base && base.size() != out.size()) return Malformed("coded against a base that is missing");
  RETURN_IF_ERROR(r.Byte(&k, "level count"));
  if (k > kMaxLevels) return Malformed("too many levels");
  StoredLevels lv;
  RETURN_IF_ERROR(ReadLevels(r, d, (flags & kFlagUniformGrid) != 0, k, &lv));
  uint64_t n_esc = 0, rans_len = 0;
  RETURN_IF_ERROR(r.Varint(&n_esc, "escape count"));
  RETURN_IF_ERROR(r.Varint(&rans_len, "symbol stream length"));
  std::span<const uint8_t> rans, esc;
  RETURN_IF_ERROR(r.Bytes(rans_len, &rans, "symbol stream"));
  if (n_esc > n || r.remaining() != n_esc * es) return Malformed("escape bytes do not match their count");
  RETURN_IF_ERROR(r.Bytes(n_esc * es, &esc, "escapes"));
  const std::span<uint8_t> symbols = lossless::Scratch(lossless::ScratchSlot::kLossySymbols, n);
  RETURN_IF_ERROR(lossless::RansDecode(rans, symbols));
  uint64_t next_esc = 0;
  const uint8_t* base_bytes = against_base ? base.data() : nullptr;
  Status st;
  switch (t) {
    case DType::kF32:
      st = d == Domain::kValue
               ? RebuildPiece<DType::kF32, Domain::kValue>(symbols, k, lv, base_bytes, esc, n_esc, &next_esc, out)
               : RebuildPiece<DType::kF32, Domain::kLogBits>(symbols, k, lv, base_bytes, esc, n_esc, &next_esc, out);
      break;
    case DType::kF16:
      st = d == Domain::kValue
               ? RebuildPiece<DType::kF16, Domain::kValue>(symbols, k, lv, base_bytes, esc, n_esc, &next_esc, out)
               : RebuildPiece<DType::kF16, Domain::kLogBits>(symbols, k, lv, base_bytes, esc, n_esc, &next_esc, out);
      break;
    default:
      st = d == Domain::kValue
               ? RebuildPiece<DType::kBF16, Domain::kValue>(symbols, k, lv, base_bytes, esc, n_esc, &next_esc, out)
               : RebuildPiece<DType::kBF16, Domain::kLogBits>(symbols, k, lv, base_bytes, esc, n_esc, &next_esc, out);
      break;
  }
  RETURN_IF_ERROR(st);
  if (next_esc != n_esc) return Malformed("fewer escape symbols than escapes");
  return Status::Ok();
}

}  // namespace ckptfs::lossy
