#include "codec/lossless/rans.h"

#include <algorithm>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "codec/cpu_features.h"
#include "codec/lossless/byte_io.h"
#include "codec/lossless/rans_format.h"

namespace ckptfs::lossless {
namespace {

// The constants the rANS encoder and decoder share (rans_format.h).
using namespace rans;

// Per-symbol freq/start plus a slot -> symbol map: 256-entry tables and a
// byte per slot stay in L1, where a per-slot (freq, bias) table would not.
// One word per slot: symbol (bits 0-7), frequency (8-19), slot - start (20-31).
struct DecodeTables {
  unsigned scale_bits = 0;
  std::vector<uint32_t> slot;
};

Status ReadTables(ByteReader* r, DecodeTables* t) {
  uint8_t scale = 0, distinct_m1 = 0;
  RETURN_IF_ERROR(r->Byte(&scale, "rANS scale"));
  if (scale < kRansMinScaleBits || scale > kRansMaxScaleBits) {
    return Status::Corruption("rANS scale_bits " + std::to_string(scale) + " outside [8, 12]");
  }
  RETURN_IF_ERROR(r->Byte(&distinct_m1, "rANS symbol count"));
  unsigned distinct = distinct_m1 + 1u;
  if (distinct < 2) return Status::Corruption("rANS table with one symbol (should be a run)");

  uint8_t symbols[256];
  unsigned found = 0;
  std::span<const uint8_t> set;
  if (distinct <= kListedSymbolsMax) {
    RETURN_IF_ERROR(r->Bytes(distinct, &set, "rANS symbol list"));
    for (unsigned i = 0; i < distinct; ++i) {
      if (i > 0 && set[i] <= set[i - 1]) return Status::Corruption("rANS symbol list not ascending");
      symbols[found++] = set[i];
    }
  } else {
    RETURN_IF_ERROR(r->Bytes(32, &set, "rANS symbol bitmap"));
    for (unsigned s = 0; s < 256; ++s) {
      if ((set[s >> 3] >> (s & 7)) & 1) symbols[found++] = static_cast<uint8_t>(s);
    }
    if (found != distinct) {
      return Status::Corruption("rANS bitmap has " + std::to_string(found) + " symbols, header says " +
                                std::to_string(distinct));
    }
  }

  const uint32_t total = 1u << scale;
  uint32_t freq[256];
  uint64_t sum = 0;
  for (unsigned i = 0; i + 1 < distinct; ++i) {
    uint64_t f_m1 = 0;
    RETURN_IF_ERROR(r->Varint(&f_m1, "rANS frequency"));
    sum += f_m1 + 1;
    if (sum >= total) return Status::Corruption("rANS frequencies exceed 2^" + std::to_string(scale));
    freq[i] = static_cast<uint32_t>(f_m1 + 1);
  }
  freq[distinct - 1] = static_cast<uint32_t>(total - sum);  // > 0 by the check above

  t->scale_bits = scale;
  t->slot.resize(total);
  uint32_t start = 0;
  for (unsigned i = 0; i < distinct; ++i) {
    for (uint32_t j = 0; j < freq[i]; ++j) t->slot[start + j] = symbols[i] | (freq[i] << 8) | (j << 20);
    start += freq[i];
  }
  return Status::Ok();
}

inline uint16_t LoadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

inline uint8_t Step(uint32_t& x, const uint32_t* slot, uint32_t mask, unsigned scale) {
  uint32_t e = slot[x & mask];
  x = ((e >> 8) & 0xFFF) * (x >> scale) + (e >> 20);
  return static_cast<uint8_t>(e);
}

// The scale as a constant: x86 shifts by a variable count go through CL,
// which serialises the eight states' chains.
template <unsigned kScale>
inline uint8_t StepFixed(uint32_t& x, const uint32_t* slot) {
  const uint32_t e = slot[x & ((1u << kScale) - 1)];
  x = ((e >> 8) & 0xFFF) * (x >> kScale) + (e >> 20);
  return static_cast<uint8_t>(e);
}

// Whether a state needs a word is data-dependent and would mispredict
// often; both outcomes are computed and selected (a cmov).
inline void Refill(uint32_t& x, const uint8_t*& p) {
  const uint32_t grown = (x << 16) | LoadU16(p);
  const bool need = x < kL;
  x = need ? grown : x;
  p += need ? 2 : 0;
}

// `rounds` rounds of one symbol per state, with no bounds checks: the
// caller guarantees every stream holds a word per round.
template <unsigned kScale>
void DecodeRounds(const uint32_t* slot, uint32_t x[kStates], const uint8_t* p[kStates], uint8_t* o, size_t rounds) {
  uint32_t x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3], x4 = x[4], x5 = x[5], x6 = x[6], x7 = x[7];
  const uint8_t *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3], *p4 = p[4], *p5 = p[5], *p6 = p[6], *p7 = p[7];
  for (size_t r = 0; r < rounds; ++r, o += kStates) {
    // One 8-byte store: byte stores could alias the payload and tables.
    const uint64_t sym8 = uint64_t{StepFixed<kScale>(x0, slot)} | uint64_t{StepFixed<kScale>(x1, slot)} << 8 |
                          uint64_t{StepFixed<kScale>(x2, slot)} << 16 | uint64_t{StepFixed<kScale>(x3, slot)} << 24 |
                          uint64_t{StepFixed<kScale>(x4, slot)} << 32 | uint64_t{StepFixed<kScale>(x5, slot)} << 40 |
                          uint64_t{StepFixed<kScale>(x6, slot)} << 48 | uint64_t{StepFixed<kScale>(x7, slot)} << 56;
    std::memcpy(o, &sym8, 8);
    Refill(x0, p0), Refill(x1, p1), Refill(x2, p2), Refill(x3, p3);
    Refill(x4, p4), Refill(x5, p5), Refill(x6, p6), Refill(x7, p7);
  }
  x[0] = x0, x[1] = x1, x[2] = x2, x[3] = x3, x[4] = x4, x[5] = x5, x[6] = x6, x[7] = x7;
  p[0] = p0, p[1] = p1, p[2] = p2, p[3] = p3, p[4] = p4, p[5] = p5, p[6] = p6, p[7] = p7;
}

using RoundsFn = void (*)(const uint32_t*, uint32_t*, const uint8_t**, uint8_t*, size_t);
RoundsFn RoundsFor(unsigned scale) {
  static_assert(kRansMinScaleBits == 8 && kRansMaxScaleBits == 12);
  static constexpr RoundsFn kFns[] = {DecodeRounds<8>, DecodeRounds<9>, DecodeRounds<10>, DecodeRounds<11>,
                                      DecodeRounds<12>};
  return kFns[scale - kRansMinScaleBits];
}

// Words each stream must hold beyond what the AVX2 rounds may take: each
// round reads four bytes at every stream's position.
constexpr size_t kVectorSpareWords = 2;

#if defined(__x86_64__)
// The eight states as the lanes of one AVX2 register: a gather looks up
// their slots and another loads their next words, so a round is one chain
// of vector operations where the scalar rounds run eight chains of scalar
// ones: 1.1-1.8x the symbols per second on the 2-core VM, the more the
// more bits a symbol takes. The same integer arithmetic as StepFixed and
// Refill: the same symbols, states and stream positions.
//
// Every stream must hold kVectorSpareWords more words than the rounds may
// take: each round reads four bytes at every stream's position, whether it
// needs a word or not. Positions are 32-bit offsets from `base`.
__attribute__((target("avx2"))) void DecodeRoundsAvx2(unsigned scale, const uint32_t* slot, uint32_t x[kStates],
                                                      const uint8_t* p[kStates], const uint8_t* base, uint8_t* o,
                                                      size_t rounds) {
  static_assert(kStates == 8 && kL == 1u << 16);
  alignas(32) int32_t offsets[kStates];
  for (int k = 0; k < kStates; ++k) offsets[k] = static_cast<int32_t>(p[k] - base);
  __m256i state = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  __m256i at = _mm256_load_si256(reinterpret_cast<const __m256i*>(offsets));
  const __m256i mask = _mm256_set1_epi32(static_cast<int32_t>((1u << scale) - 1));
  const __m128i shift = _mm_cvtsi32_si128(static_cast<int>(scale));
  const __m256i freq_bits = _mm256_set1_epi32(0xFFF), word_bits = _mm256_set1_epi32(0xFFFF);
  const __m256i two = _mm256_set1_epi32(2), zero = _mm256_setzero_si256();
  // Byte 0 of each lane to the low four bytes of each 128-bit half.
  const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                             0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const int* const slots = reinterpret_cast<const int*>(slot);
  const int* const words = reinterpret_cast<const int*>(base);
  for (size_t r = 0; r < rounds; ++r, o += kStates) {
    const __m256i e = _mm256_i32gather_epi32(slots, _mm256_and_si256(state, mask), 4);
    const __m256i freq = _mm256_and_si256(_mm256_srli_epi32(e, 8), freq_bits);
    state = _mm256_add_epi32(_mm256_mullo_epi32(freq, _mm256_srl_epi32(state, shift)), _mm256_srli_epi32(e, 20));
    const __m256i sym = _mm256_shuffle_epi8(e, low_bytes);
    const uint64_t sym8 = static_cast<uint32_t>(_mm256_cvtsi256_si32(sym)) |
                          uint64_t{static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(sym, 1)))} << 32;
    std::memcpy(o, &sym8, 8);
    const __m256i need = _mm256_cmpeq_epi32(_mm256_srli_epi32(state, 16), zero);
    const __m256i word = _mm256_and_si256(_mm256_i32gather_epi32(words, at, 1), word_bits);
    state = _mm256_blendv_epi8(state, _mm256_or_si256(_mm256_slli_epi32(state, 16), word), need);
    at = _mm256_add_epi32(at, _mm256_and_si256(need, two));
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(x), state);
  _mm256_store_si256(reinterpret_cast<__m256i*>(offsets), at);
  for (int k = 0; k < kStates; ++k) p[k] = base + offsets[k];
}

// Runs `rounds` (within the streams' words less kVectorSpareWords) with
// AVX2; false without it, or where the streams lie too far apart for
// 32-bit offsets.
bool VectorRounds(unsigned scale, const uint32_t* slot, uint32_t x[kStates], const uint8_t* p[kStates],
                  const uint8_t* const end[kStates], uint8_t* o, size_t rounds) {
  if (!CpuHasAvx2()) return false;
  const uint8_t* lo = p[0];
  const uint8_t* hi = end[0];
  for (int k = 0; k < kStates; ++k) lo = std::min(lo, p[k]), hi = std::max(hi, end[k]);
  if (hi - lo > INT32_MAX) return false;
  DecodeRoundsAvx2(scale, slot, x, p, lo, o, rounds);
  return true;
}
#else
bool VectorRounds(unsigned, const uint32_t*, uint32_t*, const uint8_t**, const uint8_t* const*, uint8_t*, size_t) {
  return false;
}
#endif

// At most `rounds`, as many as every stream can feed while keeping `spare`
// words in hand: a round takes at most one word from each stream.
size_t RoundsInHand(const uint8_t* const p[kStates], const uint8_t* const end[kStates], size_t rounds, size_t spare) {
  for (int k = 0; k < kStates; ++k) {
    const size_t words = static_cast<size_t>(end[k] - p[k]) / 2;
    rounds = std::min(rounds, words > spare ? words - spare : 0);
  }
  return rounds;
}

// One symbol from state x and its refill from [p, end), bounds-checked:
// false when the stream ends early.
inline bool CheckedStep(uint32_t& x, const uint8_t*& p, const uint8_t* end, const DecodeTables& t, uint8_t* o) {
  *o = Step(x, t.slot.data(), (1u << t.scale_bits) - 1, t.scale_bits);
  if (x >= kL) return true;
  if (end - p < 2) return false;
  x = (x << 16) | LoadU16(p);
  p += 2;
  return true;
}

// After the last symbol every stream is read to its end and its state is
// back where the encoder started.
Status CheckStreamEnd(uint32_t x, const uint8_t* p, const uint8_t* end, int k) {
  if (p != end) return Status::Corruption("rANS stream " + std::to_string(k) + " has unread bytes");
  if (x != kL) return Status::Corruption("rANS final state mismatch (payload corrupt)");
  return Status::Ok();
}

Status DecodePayload(const DecodeTables& t, uint32_t states[kStates], const uint8_t* const begin[kStates],
                     const uint8_t* const end[kStates], std::span<uint8_t> out) {
  const unsigned scale = t.scale_bits;
  const uint32_t* const slot = t.slot.data();
  uint8_t* const o = out.data();
  const size_t n = out.size();
  const uint8_t* p[kStates];
  uint32_t x[kStates];
  for (int k = 0; k < kStates; ++k) {
    p[k] = begin[k];
    x[k] = states[k];
  }

  // Unchecked rounds, in passes as long as the streams' words allow (a
  // round takes a word from a stream only now and then, so each pass
  // allows the next one more): AVX2 first, then the scalar rounds.
  size_t i = 0;
  while (i + kStates <= n) {
    const size_t rounds = RoundsInHand(p, end, (n - i) / kStates, kVectorSpareWords);
    if (rounds == 0 || !VectorRounds(scale, slot, x, p, end, o + i, rounds)) break;
    i += rounds * kStates;
  }
  const RoundsFn rounds_fn = RoundsFor(scale);
  while (i + kStates <= n) {
    const size_t rounds = RoundsInHand(p, end, (n - i) / kStates, 0);
    if (rounds == 0) break;
    rounds_fn(slot, x, p, o + i, rounds);
    i += rounds * kStates;
  }
  for (; i < n; ++i) {
    const int k = static_cast<int>(i % kStates);
    if (!CheckedStep(x[k], p[k], end[k], t, &o[i]))
      return Status::Corruption("rANS stream " + std::to_string(k) + " ends early");
  }
  for (int k = 0; k < kStates; ++k) RETURN_IF_ERROR(CheckStreamEnd(x[k], p[k], end[k], k));
  return Status::Ok();
}

// Mode 2: one state, one stream, read symbol by symbol (short inputs only).
Status DecodeOneState(ByteReader& r, const DecodeTables& t, std::span<uint8_t> out) {
  uint32_t x = 0;
  uint64_t words = 0;
  RETURN_IF_ERROR(r.U32(&x, "rANS state"));
  if (x < kL) return Status::Corruption("rANS initial state out of range");
  RETURN_IF_ERROR(r.Varint(&words, "rANS stream length"));
  if (words > r.remaining() / 2 || 2 * words != r.remaining())
    return Status::Corruption("rANS stream length does not match the blob");
  std::span<const uint8_t> stream;
  RETURN_IF_ERROR(r.Bytes(2 * words, &stream, "rANS stream"));
  const uint8_t* p = stream.data();
  const uint8_t* const end = p + stream.size();
  for (uint8_t& o : out) {
    if (!CheckedStep(x, p, end, t, &o)) return Status::Corruption("rANS stream 0 ends early");
  }
  return CheckStreamEnd(x, p, end, 0);
}

}  // namespace

Result<uint64_t> RansDecodedSize(std::span<const uint8_t> blob) {
  ByteReader r(blob);
  uint64_t n = 0;
  RETURN_IF_ERROR(r.Varint(&n, "rANS symbol count"));
  return n;
}

Status RansDecode(std::span<const uint8_t> blob, std::span<uint8_t> out) {
  ByteReader r(blob);
  uint64_t n = 0;
  RETURN_IF_ERROR(r.Varint(&n, "rANS symbol count"));
  if (n != out.size()) {
    return Status::Corruption("rANS blob holds " + std::to_string(n) + " symbols, expected " +
                              std::to_string(out.size()));
  }
  if (n == 0) {
    if (r.remaining() != 0) return Status::Corruption("empty rANS blob has trailing bytes");
    return Status::Ok();
  }
  uint8_t mode = 0;
  RETURN_IF_ERROR(r.Byte(&mode, "rANS mode"));
  if (mode == kModeRun) {
    uint8_t sym = 0;
    RETURN_IF_ERROR(r.Byte(&sym, "run symbol"));
    if (r.remaining() != 0) return Status::Corruption("rANS run blob has trailing bytes");
    std::memset(out.data(), sym, out.size());
    return Status::Ok();
  }
  if (mode != kModeRans && mode != kModeRansOneState)
    return Status::Corruption("unknown rANS mode " + std::to_string(mode));

  DecodeTables tables;
  RETURN_IF_ERROR(ReadTables(&r, &tables));
  if (mode == kModeRansOneState) return DecodeOneState(r, tables, out);
  uint32_t states[kStates];
  for (int k = 0; k < kStates; ++k) {
    RETURN_IF_ERROR(r.U32(&states[k], "rANS state"));
    if (states[k] < kL) {
      return Status::Corruption("rANS initial state out of range");
    }
  }
  uint64_t words[kStates];
  for (int k = 0; k < kStates; ++k) RETURN_IF_ERROR(r.Varint(&words[k], "rANS stream length"));
  const uint8_t* begin[kStates];
  const uint8_t* end[kStates];
  for (int k = 0; k < kStates; ++k) {
    if (words[k] > r.remaining() / 2) return Status::Corruption("rANS stream longer than the blob");
    std::span<const uint8_t> stream;
    RETURN_IF_ERROR(r.Bytes(2 * words[k], &stream, "rANS stream"));
    begin[k] = stream.data();
    end[k] = stream.data() + stream.size();
  }
  if (r.remaining() != 0)
    return Status::Corruption("rANS blob has " + std::to_string(r.remaining()) + " trailing bytes");
  return DecodePayload(tables, states, begin, end, out);
}

}  // namespace ckptfs::lossless
