#include "codec/lossless/rans.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "codec/lossless/byte_io.h"

namespace ckptfs::lossless {
namespace {

// States live in [kL, kL << 8); byte-wise renormalization keeps them there.
constexpr uint32_t kL = 1u << 23;
constexpr int kStates = 4;
constexpr uint8_t kModeRun = 0;
constexpr uint8_t kModeRans = 1;
// Below this many distinct symbols, listing them is smaller than a bitmap.
constexpr unsigned kListedSymbolsMax = 32;

// Small inputs get a coarser scale: their frequencies then fit in fewer
// varint bytes, and quantization error is small next to the table cost.
unsigned ScaleBitsFor(uint64_t n) {
  unsigned bits = static_cast<unsigned>(std::bit_width(n));
  if (bits < kRansMinScaleBits) return kRansMinScaleBits;
  if (bits > kRansMaxScaleBits) return kRansMaxScaleBits;
  return bits;
}

// Per-symbol encoder constants; division by freq is replaced by a
// multiply with a rounded-up reciprocal (exact for x < 2^31, see
// F. Giesen, "rans_byte.h").
struct EncSymbol {
  uint32_t x_max;
  uint32_t rcp_freq;
  uint32_t bias;
  uint16_t cmpl_freq;
  uint16_t rcp_shift;
};

EncSymbol MakeEncSymbol(uint32_t start, uint32_t freq, unsigned scale_bits) {
  EncSymbol s{};
  s.x_max = ((kL >> scale_bits) << 8) * freq;
  s.cmpl_freq = static_cast<uint16_t>((1u << scale_bits) - freq);
  if (freq < 2) {
    // q = x - 1 via rcp ~0, and bias folds in the remaining x*(M-1) term.
    s.rcp_freq = ~0u;
    s.rcp_shift = 0;
    s.bias = start + (1u << scale_bits) - 1;
  } else {
    uint32_t shift = 0;
    while (freq > (1u << shift)) ++shift;
    s.rcp_freq = static_cast<uint32_t>(((uint64_t{1} << (shift + 31)) + freq - 1) / freq);
    s.rcp_shift = static_cast<uint16_t>(shift - 1);
    s.bias = start;
  }
  return s;
}

inline void EncPut(uint32_t* state, uint8_t** ptr, const EncSymbol& sym) {
  uint32_t x = *state;
  while (x >= sym.x_max) {
    *--*ptr = static_cast<uint8_t>(x);
    x >>= 8;
  }
  uint32_t q = static_cast<uint32_t>((uint64_t{x} * sym.rcp_freq) >> 32) >> sym.rcp_shift;
  *state = x + sym.bias + q * sym.cmpl_freq;
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

// Per-symbol freq/start plus a slot -> symbol map: 256-entry tables and a
// byte per slot stay in L1, where a per-slot (freq, bias) table would not.
struct DecodeTables {
  unsigned scale_bits = 0;
  std::vector<uint8_t> sym;  // slot -> symbol
  uint32_t freq[256] = {};
  uint32_t start[256] = {};
};

Status ReadTables(ByteReader* r, DecodeTables* t) {
  uint8_t scale = 0, distinct_m1 = 0;
  RETURN_IF_ERROR(r->Byte(&scale, "rANS scale"));
  if (scale < kRansMinScaleBits || scale > kRansMaxScaleBits) {
    return Status::Corruption("rANS scale_bits " + std::to_string(scale) + " outside [8, 15]");
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
  t->sym.resize(total);
  uint32_t start = 0;
  for (unsigned i = 0; i < distinct; ++i) {
    std::memset(t->sym.data() + start, symbols[i], freq[i]);
    t->freq[symbols[i]] = freq[i];
    t->start[symbols[i]] = start;
    start += freq[i];
  }
  return Status::Ok();
}

Status DecodePayload(const DecodeTables& t, uint32_t states[kStates], std::span<const uint8_t> payload,
                     std::span<uint8_t> out) {
  // Everything hot lives in locals: stores through the uint8_t output
  // pointer may alias anything, which would otherwise force reloads.
  const unsigned scale = t.scale_bits;
  const uint32_t mask = (1u << scale) - 1;
  const uint8_t* const sym = t.sym.data();
  const uint32_t* const freq = t.freq;
  const uint32_t* const start = t.start;
  const uint8_t* p = payload.data();
  const uint8_t* const end = p + payload.size();
  uint8_t* const o = out.data();
  const size_t n = out.size();
  uint32_t x0 = states[0], x1 = states[1], x2 = states[2], x3 = states[3];

  auto step = [&](uint32_t& x, uint8_t* dst) {
    uint32_t slot = x & mask;
    uint8_t s = sym[slot];
    *dst = s;
    x = freq[s] * (x >> scale) + slot - start[s];
  };
  // A symbol consumes at most 2 bytes (the state falls no lower than
  // kL >> 15 = 2^8), so 4 symbols need at most 8 bytes: no checks needed.
  auto refill = [&](uint32_t& x) {
    while (x < kL) x = (x << 8) | *p++;
  };
  size_t i = 0;
  for (; i + kStates <= n && end - p >= 2 * kStates; i += kStates) {
    step(x0, o + i);
    step(x1, o + i + 1);
    step(x2, o + i + 2);
    step(x3, o + i + 3);
    refill(x0);
    refill(x1);
    refill(x2);
    refill(x3);
  }
  states[0] = x0, states[1] = x1, states[2] = x2, states[3] = x3;
  for (; i < n; ++i) {
    uint32_t& x = states[i % kStates];
    step(x, o + i);
    while (x < kL) {
      if (p == end) return Status::Corruption("rANS payload ends early at symbol " + std::to_string(i));
      x = (x << 8) | *p++;
    }
  }
  if (p != end) {
    return Status::Corruption("rANS payload has " + std::to_string(end - p) + " unread bytes");
  }
  for (int k = 0; k < kStates; ++k) {
    if (states[k] != kL) return Status::Corruption("rANS final state mismatch (payload corrupt)");
  }
  return Status::Ok();
}

}  // namespace

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
  std::array<uint32_t, 256> freq = NormalizeFrequencies(*hist, n, scale);
  PutByte(out, kModeRans);
  PutByte(out, static_cast<uint8_t>(scale));
  PutByte(out, static_cast<uint8_t>(distinct - 1));
  WriteSymbolSet(freq, distinct, out);
  WriteFrequencies(freq, distinct, out);

  EncSymbol syms[256];
  uint32_t start = 0;
  for (int s = 0; s < 256; ++s) {
    syms[s] = freq[s] != 0 ? MakeEncSymbol(start, freq[s], scale) : EncSymbol{};
    start += freq[s];
  }

  // At most 2 bytes per symbol (freq >= 1 at scale <= 15), written backwards.
  std::vector<uint8_t> buf(2 * n + 16);
  uint8_t* const buf_end = buf.data() + buf.size();
  uint8_t* ptr = buf_end;
  uint32_t states[kStates] = {kL, kL, kL, kL};
  // Symbols go in reverse so the decoder emits them forwards; symbol i
  // always uses state i % 4 on both sides.
  size_t i = n;
  while (i % kStates != 0) {
    --i;
    EncPut(&states[i % kStates], &ptr, syms[in[i]]);
  }
  while (i > 0) {
    i -= kStates;
    EncPut(&states[3], &ptr, syms[in[i + 3]]);
    EncPut(&states[2], &ptr, syms[in[i + 2]]);
    EncPut(&states[1], &ptr, syms[in[i + 1]]);
    EncPut(&states[0], &ptr, syms[in[i]]);
  }
  for (int k = 0; k < kStates; ++k) PutU32(out, states[k]);
  out->insert(out->end(), ptr, buf_end);
}

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
  if (mode != kModeRans) return Status::Corruption("unknown rANS mode " + std::to_string(mode));

  DecodeTables tables;
  RETURN_IF_ERROR(ReadTables(&r, &tables));
  uint32_t states[kStates];
  for (int k = 0; k < kStates; ++k) {
    RETURN_IF_ERROR(r.U32(&states[k], "rANS state"));
    if (states[k] < kL || states[k] >= (kL << 8)) {
      return Status::Corruption("rANS initial state out of range");
    }
  }
  return DecodePayload(tables, states, r.Rest(), out);
}

}  // namespace ckptfs::lossless
