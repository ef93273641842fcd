#include "codec/lossless/rans.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "codec/lossless/byte_io.h"
#include "codec/lossless/rans_format.h"
#include "codec/lossless/scratch.h"

namespace ckptfs::lossless {
namespace {

// The constants the rANS encoder and decoder share (rans_format.h).
using namespace rans;

unsigned ScaleBitsFor(uint64_t n) {
  unsigned bits = static_cast<unsigned>(std::bit_width(n));
  if (bits < kRansMinScaleBits) return kRansMinScaleBits;
  if (bits > kRansMaxScaleBits) return kRansMaxScaleBits;
  return bits;
}

// Division by the frequency as a multiply: with m = floor(2^64 / f) + 1,
// x / f == high 64 bits of x * m for every 32-bit x (the error stays below
// 2^-32 <= 1/f). f == 1 would need m = 2^64, so it keeps rcp 0 and q = x.
struct EncSymbol {
  uint32_t x_max = 0;
  uint32_t freq = 1;
  uint32_t start = 0;
  uint64_t rcp = 0;
};

EncSymbol MakeEncSymbol(uint32_t freq, uint32_t start, unsigned scale) {
  EncSymbol e;
  e.x_max = ((kL >> scale) << 16) * freq;
  e.freq = freq;
  e.start = start;
  e.rcp = freq == 1 ? 0 : ~uint64_t{0} / freq + 1;
  return e;
}

// Branch-free like the decoder's refill: the word is always written below
// the stream pointer, which moves only when the state overflows. Every
// stream has room for one more word than it can emit, so the write stays
// inside its own stream.
template <unsigned kScale>
inline void EncPut(uint32_t& x, uint16_t*& ptr, const EncSymbol& sym) {
  const bool flush = x >= sym.x_max;
  ptr[-1] = static_cast<uint16_t>(x);
  ptr -= flush ? 1 : 0;
  x = flush ? x >> 16 : x;
  const uint32_t hi = static_cast<uint32_t>((static_cast<unsigned __int128>(x) * sym.rcp) >> 64);
  const uint32_t q = sym.rcp == 0 ? x : hi;
  x = (q << kScale) + (x - q * sym.freq) + sym.start;
}

// Codes `in` backwards into the states; symbol i belongs to state i % 8.
template <unsigned kScale>
void EncodeStates(std::span<const uint8_t> in, const EncSymbol* syms, uint32_t st[kStates], uint16_t* ptr[kStates]) {
  size_t i = in.size();
  while (i % kStates != 0) {
    --i;
    EncPut<kScale>(st[i % kStates], ptr[i % kStates], syms[in[i]]);
  }
  uint32_t x0 = st[0], x1 = st[1], x2 = st[2], x3 = st[3], x4 = st[4], x5 = st[5], x6 = st[6], x7 = st[7];
  uint16_t *p0 = ptr[0], *p1 = ptr[1], *p2 = ptr[2], *p3 = ptr[3], *p4 = ptr[4], *p5 = ptr[5], *p6 = ptr[6],
           *p7 = ptr[7];
  const uint8_t* s = in.data();
  for (; i > 0; i -= kStates) {
    const uint8_t* b = s + i - kStates;
    EncPut<kScale>(x7, p7, syms[b[7]]), EncPut<kScale>(x6, p6, syms[b[6]]);
    EncPut<kScale>(x5, p5, syms[b[5]]), EncPut<kScale>(x4, p4, syms[b[4]]);
    EncPut<kScale>(x3, p3, syms[b[3]]), EncPut<kScale>(x2, p2, syms[b[2]]);
    EncPut<kScale>(x1, p1, syms[b[1]]), EncPut<kScale>(x0, p0, syms[b[0]]);
  }
  st[0] = x0, st[1] = x1, st[2] = x2, st[3] = x3, st[4] = x4, st[5] = x5, st[6] = x6, st[7] = x7;
  ptr[0] = p0, ptr[1] = p1, ptr[2] = p2, ptr[3] = p3, ptr[4] = p4, ptr[5] = p5, ptr[6] = p6, ptr[7] = p7;
}

using EncodeFn = void (*)(std::span<const uint8_t>, const EncSymbol*, uint32_t*, uint16_t**);
EncodeFn EncoderFor(unsigned scale) {
  static constexpr EncodeFn kFns[] = {EncodeStates<8>, EncodeStates<9>, EncodeStates<10>, EncodeStates<11>,
                                      EncodeStates<12>};
  return kFns[scale - kRansMinScaleBits];
}

// Appends 16-bit words little-endian.
void PutWords(const uint16_t* w, size_t count, std::vector<uint8_t>* out) {
  const size_t at = out->size();
  out->resize(at + 2 * count);
  uint8_t* dst = out->data() + at;
  if constexpr (std::endian::native == std::endian::little) {
    if (count != 0) std::memcpy(dst, w, 2 * count);
  } else {
    for (size_t k = 0; k < count; ++k)
      dst[2 * k] = static_cast<uint8_t>(w[k]), dst[2 * k + 1] = static_cast<uint8_t>(w[k] >> 8);
  }
}

void WriteSymbolSet(const std::array<uint32_t, 256>& freq, unsigned distinct, std::vector<uint8_t>* out) {
  if (distinct <= kListedSymbolsMax) {
    for (unsigned s = 0; s < 256; ++s) {
      if (freq[s] != 0) PutByte(out, static_cast<uint8_t>(s));
    }
    return;
  }
  uint8_t bitmap[32] = {};
  for (unsigned s = 0; s < 256; ++s) {
    if (freq[s] != 0) bitmap[s >> 3] |= static_cast<uint8_t>(1u << (s & 7));
  }
  out->insert(out->end(), bitmap, bitmap + 32);
}

void WriteFrequencies(const std::array<uint32_t, 256>& freq, unsigned distinct, std::vector<uint8_t>* out) {
  unsigned written = 0;
  for (unsigned s = 0; s < 256 && written + 1 < distinct; ++s) {
    if (freq[s] == 0) continue;
    PutVarint(out, freq[s] - 1);
    ++written;
  }
}

// Cost, in bits times count, of coding a symbol of count c with frequency f.
inline double CodeCost(uint64_t c, uint32_t f) { return -static_cast<double>(c) * std::log2(static_cast<double>(f)); }

// The mode, scale, symbol set and frequencies; fills `syms` for the encoder.
void WriteTables(uint8_t mode, unsigned scale, const std::array<uint32_t, 256>& freq, unsigned distinct,
                 EncSymbol syms[256], std::vector<uint8_t>* out) {
  PutByte(out, mode);
  PutByte(out, static_cast<uint8_t>(scale));
  PutByte(out, static_cast<uint8_t>(distinct - 1));
  WriteSymbolSet(freq, distinct, out);
  WriteFrequencies(freq, distinct, out);
  uint32_t start = 0;
  for (int s = 0; s < 256; ++s) {
    if (freq[s] != 0) syms[s] = MakeEncSymbol(freq[s], start, scale);
    start += freq[s];
  }
}

size_t VarintSize(uint64_t v) { return static_cast<size_t>(std::bit_width(v | 1) + 6) / 7; }

// The frequencies at the scale the format allows whose tables plus ideal
// payload are the fewest bytes: the finest scale codes closest to the
// entropy, but a short input pays more for its larger frequencies than it saves.
struct ScaledFrequencies {
  unsigned scale = kRansMaxScaleBits;
  std::array<uint32_t, 256> freq{};
};
ScaledFrequencies CompactFrequencies(const Histogram& h, uint64_t n, unsigned distinct) {
  ScaledFrequencies best;
  double best_bytes = 0;
  for (unsigned scale = kRansMinScaleBits; scale <= kRansMaxScaleBits; ++scale) {
    const std::array<uint32_t, 256> f = NormalizeFrequencies(h, n, scale);
    double bytes = 0;
    unsigned listed = 0;
    for (unsigned s = 0; s < 256; ++s) {
      if (f[s] == 0) continue;
      if (++listed < distinct) bytes += static_cast<double>(VarintSize(f[s] - 1));
      bytes += (static_cast<double>(h[s]) * scale + CodeCost(h[s], f[s])) / 8;
    }
    if (scale == kRansMinScaleBits || bytes < best_bytes) best = {scale, f}, best_bytes = bytes;
  }
  return best;
}

// Mode 2's one state: the symbols coded backwards by EncPut, as each of
// mode 1's eight states codes its share.
template <unsigned kScale>
void EncodeOneStateAt(std::span<const uint8_t> in, const EncSymbol* syms, uint32_t& x, uint16_t*& ptr) {
  for (size_t i = in.size(); i > 0; --i) EncPut<kScale>(x, ptr, syms[in[i - 1]]);
}

void EncodeOneState(std::span<const uint8_t> in, const EncSymbol* syms, unsigned scale, std::vector<uint8_t>* out) {
  using Fn = void (*)(std::span<const uint8_t>, const EncSymbol*, uint32_t&, uint16_t*&);
  static constexpr Fn kFns[] = {EncodeOneStateAt<8>, EncodeOneStateAt<9>, EncodeOneStateAt<10>, EncodeOneStateAt<11>,
                                EncodeOneStateAt<12>};
  std::vector<uint16_t> buf(in.size() + 2);  // a word per symbol at most, and EncPut's spare slot
  uint16_t* ptr = buf.data() + buf.size();
  uint32_t x = kL;
  kFns[scale - kRansMinScaleBits](in, syms, x, ptr);
  const size_t words = static_cast<size_t>(buf.data() + buf.size() - ptr);
  PutU32(out, x);
  PutVarint(out, words);
  PutWords(ptr, words, out);
}

}  // namespace

void RansEncodeCompact(std::span<const uint8_t> in, std::vector<uint8_t>* out) {
  const size_t n = in.size();
  const Histogram h = ByteHistogram(in);
  const unsigned distinct = n == 0 ? 0 : DistinctSymbols(h);
  if (n > kRansOneStateMax || distinct < 2) return RansEncode(in, out, &h);
  PutVarint(out, n);
  const ScaledFrequencies f = CompactFrequencies(h, n, distinct);
  EncSymbol syms[256];
  WriteTables(kModeRansOneState, f.scale, f.freq, distinct, syms, out);
  EncodeOneState(in, syms, f.scale, out);
}

std::array<uint32_t, 256> NormalizeFrequencies(const Histogram& h, uint64_t total, unsigned scale_bits) {
  const uint32_t target = 1u << scale_bits;
  std::array<uint32_t, 256> f{};
  int64_t sum = 0;
  for (int s = 0; s < 256; ++s) {
    if (h[s] == 0) continue;
    double scaled = static_cast<double>(h[s]) * target / static_cast<double>(total);
    uint32_t v = static_cast<uint32_t>(std::llround(scaled));
    f[s] = v == 0 ? 1 : v;
    sum += f[s];
  }
  // Rounding leaves the sum off by at most about one per symbol. Fix it one
  // step at a time, always moving the frequency whose change costs the
  // fewest coded bits.
  while (sum != target) {
    int best = -1;
    double best_delta = 0;
    bool shrink = sum > target;
    for (int s = 0; s < 256; ++s) {
      if (f[s] == 0 || (shrink && f[s] == 1)) continue;
      uint32_t next = shrink ? f[s] - 1 : f[s] + 1;
      double delta = CodeCost(h[s], next) - CodeCost(h[s], f[s]);
      if (best < 0 || delta < best_delta) {
        best = s;
        best_delta = delta;
      }
    }
    // best >= 0 always: target >= 256 >= distinct symbols, so a shrinkable one exists.
    f[best] = shrink ? f[best] - 1 : f[best] + 1;
    sum += shrink ? -1 : 1;
  }
  return f;
}

void RansEncode(std::span<const uint8_t> in, std::vector<uint8_t>* out, const Histogram* hist) {
  const size_t n = in.size();
  PutVarint(out, n);
  if (n == 0) return;
  Histogram local;
  if (hist == nullptr) {
    local = ByteHistogram(in);
    hist = &local;
  }
  unsigned distinct = DistinctSymbols(*hist);
  if (distinct == 1) {
    PutByte(out, kModeRun);
    PutByte(out, in[0]);
    return;
  }

  const unsigned scale = ScaleBitsFor(n);
  const std::array<uint32_t, 256> freq = NormalizeFrequencies(*hist, n, scale);
  EncSymbol syms[256];
  WriteTables(kModeRans, scale, freq, distinct, syms, out);

  // One word stream per state, so the decoder's states share no read
  // pointer; each symbol emits at most one 16-bit word into its stream.
  const size_t per_stream = n / kStates + 2;
  std::span<uint8_t> bytes = Scratch(ScratchSlot::kRans, per_stream * kStates * sizeof(uint16_t));
  std::span<uint16_t> buf(reinterpret_cast<uint16_t*>(bytes.data()), per_stream * kStates);
  uint16_t* ptr[kStates];
  uint32_t states[kStates];
  for (int k = 0; k < kStates; ++k) {
    ptr[k] = buf.data() + (k + 1) * per_stream;
    states[k] = kL;
  }
  EncoderFor(scale)(in, syms, states, ptr);
  for (int k = 0; k < kStates; ++k) PutU32(out, states[k]);
  for (int k = 0; k < kStates; ++k) PutVarint(out, static_cast<uint64_t>(buf.data() + (k + 1) * per_stream - ptr[k]));
  for (int k = 0; k < kStates; ++k)
    PutWords(ptr[k], static_cast<size_t>(buf.data() + (k + 1) * per_stream - ptr[k]), out);
}

}  // namespace ckptfs::lossless
