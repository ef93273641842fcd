// libFuzzer entry for the delta chunk codec (codec/delta_chunk.h). The
// first byte picks the mode:
//   even: decode. Bytes 1..4 (LE) give the chunk size, capped at 1 MiB; the
//         rest is the payload. The base is a fixed pseudo-random filler, so
//         any piece table the input holds is inverted against real bytes.
//         Decoding must fail cleanly or fill exactly the chunk.
//   odd:  round trip. A header (chunk size, chunk offset, up to 8 sorted
//         ranges of any dtype, which may start before the chunk and end
//         after it) and a body that is tiled into the chunk; the base is the
//         chunk nudged by small steps, and sometimes by a lot. The encoder
//         must succeed and the decoder give back the chunk bit for bit.
// Built with CKPTFS_FUZZ_DECODE_ONLY (fuzz_delta_chunk, which links no
// encoder) every input is decoded; fuzz_delta_roundtrip has both modes.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "codec/delta_chunk.h"

namespace {

using ckptfs::DType;
using ckptfs::TensorRange;

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

// Reads little-endian fields off the front; missing bytes read as zero, so
// every input has a header.
struct Header {
  std::span<const uint8_t> in;
  uint64_t Take(unsigned width) {
    uint64_t v = 0;
    for (unsigned i = 0; i < width && !in.empty(); ++i) {
      v |= static_cast<uint64_t>(in[0]) << (8 * i);
      in = in.subspan(1);
    }
    return v;
  }
};

void FuzzDecode(std::span<const uint8_t> data) {
  Header h{data};
  const size_t n = std::min<uint64_t>(h.Take(4), 1u << 20);
  std::vector<uint8_t> base(n), out(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = Mix(i);
    std::memcpy(base.data() + i, &v, std::min<size_t>(8, n - i));
  }
  (void)ckptfs::DecodeDeltaChunk(h.in, base, out);
}

#ifndef CKPTFS_FUZZ_DECODE_ONLY
void FuzzRoundTrip(std::span<const uint8_t> data) {
  Header h{data};
  // Up to 320 KiB, mostly less (a big chunk is slow under the sanitizers):
  // past 256 KiB the encoder judges on a sample.
  const size_t n = h.Take(2) * (1 + h.Take(1) % 5);
  const uint64_t chunk_offset = h.Take(2);
  const uint8_t base_mode = static_cast<uint8_t>(h.Take(1));
  const unsigned count = static_cast<unsigned>(h.Take(1) % 9);
  std::vector<TensorRange> ranges;
  uint64_t pos = chunk_offset - std::min<uint64_t>(chunk_offset, h.Take(2));
  for (unsigned i = 0; i < count; ++i) {
    const uint64_t offset = pos + h.Take(2);
    const uint64_t length = h.Take(2) * 8 + h.Take(1) % 8;
    const DType dtype = static_cast<DType>(h.Take(1) % 18);
    ranges.push_back({offset, length, dtype});
    pos = offset + length;
  }
  std::vector<uint8_t> raw(n), base(n);
  for (size_t i = 0; i < n; ++i) raw[i] = h.in.empty() ? static_cast<uint8_t>(i) : h.in[i % h.in.size()];
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = Mix(i ^ (uint64_t{base_mode} << 32));
    // Mostly small steps that borrow across bytes; the mode's top bit adds
    // bytes unrelated to the chunk.
    const int step = r % 16 < (base_mode & 15u) ? static_cast<int>((r >> 8) % 3) - 1 : 0;
    base[i] = static_cast<uint8_t>(raw[i] + step);
    if ((base_mode & 0x80) && r % 64 == 0) base[i] = static_cast<uint8_t>(r >> 16);
  }
  std::vector<uint8_t> payload;
  if (!ckptfs::EncodeDeltaChunk(raw, base, chunk_offset, ranges, {}, &payload).ok()) std::abort();
  std::vector<uint8_t> back(n);
  if (!ckptfs::DecodeDeltaChunk(payload, base, back).ok()) std::abort();
  if (back != raw) std::abort();
}
#endif

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::span<const uint8_t> rest(data + 1, size - 1);
#ifdef CKPTFS_FUZZ_DECODE_ONLY
  FuzzDecode(rest);
#else
  if (data[0] & 1) {
    FuzzRoundTrip(rest);
  } else {
    FuzzDecode(rest);
  }
#endif
  return 0;
}
