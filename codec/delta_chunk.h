// Delta chunk coding: a chunk of a new checkpoint file is coded as a
// residual against `base`, the bytes its predecessor checkpoint holds at the
// same position. Training moves weights by small steps and leaves frozen
// layers alone, so the residual is mostly zeros and small numbers, which the
// tensor chunk codec stores far smaller than the chunk itself.
//
// Two residuals, whichever codes smaller on a sample of the chunk:
//   kXor      every byte: raw ^ base.
//   kIntDiff  the elements of tensor pieces whose lanes are 2, 4 or 8 bytes
//             (little-endian unsigned w-bit lanes, on the element boundaries
//             CutChunk gives): zigzag(raw - base mod 2^w), where
//             zigzag(d) = (d << 1) ^ (d >> (w-1), arithmetic). Same-signed
//             floats order like their bit patterns, so a small step of the
//             value is a small integer even where it crosses an exponent.
//             Every other byte (1-byte elements, metadata, a trailing
//             partial element): raw ^ base.
// A complex element's lanes are its real and imaginary parts (c64: 4 bytes,
// c128: 8 bytes). The residual is coded by EncodeTensorChunk with each range
// retyped as the unsigned integer type of its lane size, so the planes are
// plain bytes, without the float rotation.
//
// Payload (little-endian, LEB128 varints):
//   u8      version (kDeltaChunkVersion)
//   u8      kind (DeltaKind)
//   kIntDiff only, the int-diff piece table:
//     varint  piece count
//     per piece, chunk-relative, in order and not overlapping:
//       varint begin
//       varint end     (end - begin: a non-zero multiple of the lane size)
//       u8     lane size (2, 4 or 8)
//   tensor chunk payload (codec/tensor_chunk.h) of the residual, to the end
// The decoder needs no tensor ranges: bytes outside the pieces are XOR.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "base/status.h"
#include "codec/tensor_chunk.h"

namespace ckptfs {

inline constexpr uint8_t kDeltaChunkVersion = 1;

enum class DeltaKind : uint8_t { kXor = 1, kIntDiff = 2 };

// What a delta must come in under to be kept: `share` of the chunk's size
// coded on its own, which `standalone` computes when called (and returns
// again, without coding twice, when called again). That costs as much as
// coding the delta, so EncodeDeltaChunk calls it only where its sample
// leaves the verdict open. share 0: no limit.
struct DeltaLimit {
  double share = 0;
  const std::function<size_t()>* standalone = nullptr;

  size_t Bytes() const;  // share x standalone size; SIZE_MAX without a limit
};

// Codes `raw` against `base` (same size) and appends the payload to `out`.
// `ranges` (absolute file offsets, sorted; chunk starts at chunk_offset) say
// which bytes are tensor elements of which dtype, exactly as
// EncodeTensorChunk takes them. Picks the kind (XOR, or integer difference
// of the element bits) that codes smaller, judged on a sample, then codes
// the whole chunk with it. A payload that is not under `limit` is EFBIG and
// leaves `out` as it was; so is one the sample predicts clearly above it,
// without coding the chunk.
Status EncodeDeltaChunk(std::span<const uint8_t> raw, std::span<const uint8_t> base, uint64_t chunk_offset,
                        std::span<const TensorRange> ranges, const TensorChunkOptions& opts, std::vector<uint8_t>* out,
                        const DeltaLimit& limit = {});

// Rebuilds exactly raw_out.size() bytes from a payload and the same base;
// anything malformed is Corruption (never out-of-bounds reads/writes, on
// arbitrary payload bytes).
// `ranges` retyped for coding residuals (XOR or differences of `ranges`'
// bytes): each element as the unsigned integers of its lanes (a complex
// element's parts are lanes of their own).
std::vector<TensorRange> ResidualRanges(std::span<const TensorRange> ranges);

Status DecodeDeltaChunk(std::span<const uint8_t> payload, std::span<const uint8_t> base, std::span<uint8_t> raw_out);

}  // namespace ckptfs
