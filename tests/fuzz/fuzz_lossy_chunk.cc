// libFuzzer entry for the lossy codecs (codec/lossy). The first byte picks
// the mode:
//   even: decode. Bytes 1..4 (LE) give the chunk size, capped at 256 KiB;
//         the rest is a lossy chunk payload, decoded against a fixed
//         pseudo-random base. It must fail cleanly or fill exactly the chunk.
//   odd:  round trip. Byte 1 picks element type, domain and target; the
//         rest, read as elements of that type, is coded against a base made
//         from the same bytes nudged. Decoding must give the encoder's
//         reconstruction bit for bit, within the target.
// Built with CKPTFS_FUZZ_DECODE_ONLY (fuzz_lossy_chunk, which links no
// encoder) every input is decoded; fuzz_lossy_roundtrip has both modes.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "codec/lossy/float_bits.h"
#include "codec/lossy/lossy_chunk.h"
#include "codec/lossy/quantizer.h"

namespace {

using namespace ckptfs;
using namespace ckptfs::lossy;

std::vector<uint8_t> Filler(size_t n) {
  std::vector<uint8_t> b(n);
  uint64_t x = 0x9E3779B97F4A7C15ULL;
  for (auto& v : b) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = static_cast<uint8_t>(x);
  }
  return b;
}

void Decode(const uint8_t* data, size_t size) {
  if (size < 5) return;
  uint32_t n = data[1] | data[2] << 8 | data[3] << 16 | static_cast<uint32_t>(data[4]) << 24;
  n %= 256 * 1024 + 1;
  std::vector<uint8_t> out(n);
  const std::vector<uint8_t> base = Filler(n);
  (void)DecodeLossyChunk(std::span(data + 5, size - 5), base, out);
  (void)DecodePiece(std::span(data + 5, size - 5), base, out);
}

#ifndef CKPTFS_FUZZ_DECODE_ONLY
void RoundTrip(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const uint8_t sel = data[1];
  static const DType kTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
  static const double kTargets[] = {0.003, 0.01, 0.05, 0.2, 0.5, 1.0};
  PieceSpec spec;
  spec.dtype = kTypes[sel % 3];
  spec.domain = (sel >> 2) & 1 ? Domain::kLogBits : Domain::kValue;
  spec.target = kTargets[(sel >> 3) % 6];
  const size_t es = DTypeSize(spec.dtype);
  const size_t len = (size - 2) / es * es;
  std::vector<uint8_t> x(data + 2, data + 2 + len), base(x), recon(len), blob, out(len);
  for (size_t i = 0; i < base.size(); i += 3) base[i] ^= 1;  // low bits of some elements
  const bool with_base = (sel >> 6) & 1;
  Result<PieceOutcome> r =
      EncodePiece(spec, PieceInput{x, with_base ? std::span<const uint8_t>(base) : std::span<const uint8_t>{}, {}},
                  &blob, recon);
  if (!r.ok()) {
    if (r.status().code() != EFBIG) abort();
    return;
  }
  if (!DecodePiece(blob, with_base ? std::span<const uint8_t>(base) : std::span<const uint8_t>{}, out).ok()) abort();
  if (out != recon) abort();
  if (MeasureError(spec, x, recon) > spec.target) abort();
}
#endif

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
#ifdef CKPTFS_FUZZ_DECODE_ONLY
  Decode(data, size);
#else
  if (data[0] % 2 == 0) {
    Decode(data, size);
  } else {
    RoundTrip(data, size);
  }
#endif
  return 0;
}
