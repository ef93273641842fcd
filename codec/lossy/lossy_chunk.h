// The payload of a lossy chunk (chunk codec kLossy), after its 16-byte base
// reference: the chunk cut into segments, each either coded losslessly
// (metadata, integer and small tensors: a codec/tensor_chunk.h blob) or a
// lossy piece (codec/lossy/quantizer.h) predicted from the base bytes at the
// same position. The reconstruction, not the original, is what the file
// holds from then on.
//
//   u8      version (kLossyChunkVersion)
//   varint  segment count
//   per segment: u8 kind (0 lossless, 1 lossy), varint raw length,
//            lossy only: varint stored length
//   u8      lossless coding (LosslessCoding)
//   varint  stored length of the lossless run
//   the lossless run: one tensor chunk blob of all lossless segments' bytes
//            back to back (XORed with the base bytes at their positions
//            under kXorBase)
//   lossy piece payloads, in order; raw lengths sum to the chunk's length
//
// Version 1 (packs of format 4) stored every segment's length and coded
// each lossless segment alone as its own tensor chunk blob; it is still read.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "codec/lossy/quantizer.h"
#include "codec/lossy/roles.h"
#include "codec/tensor_chunk.h"

namespace ckptfs::lossy {

inline constexpr uint8_t kLossyChunkVersion = 2;
inline constexpr uint8_t kLossyChunkVersionPerSegment = 1;
// How the lossless run is coded (version 2).
enum class LosslessCoding : uint8_t { kAlone = 0, kXorBase = 1 };
// A segment's kind byte.
enum class SegmentCoding : uint8_t { kLossless = 0, kLossy = 1 };

// A lossy piece as the zip CRC pass coded it, kept so that the pack's pass
// decodes its blob (cheap) instead of coding the piece again: the blob and
// reconstruction are the same either way (codec/lossy/file_coder.h).
struct CodedPiece {
  std::vector<uint8_t> blob;  // EncodePiece's output; empty when no code met the target
  PieceOutcome outcome;       // outcome.choice.exact: stored losslessly
  double error_to_steps = 0;  // the segment's, for the statistics
};

// A chunk-relative byte range and how to code it.
struct ChunkSegment {
  uint64_t begin = 0;
  uint64_t end = 0;
  bool lossy = false;
  PieceSpec spec;                        // lossy only
  TensorRole role = TensorRole::kOther;  // lossy only: for statistics
  std::vector<float> weight;             // lossy kValue only; empty: uniform
  const PieceChoice* choice = nullptr;   // lossy only: code as chosen before (PieceInput::choice)
  // Lossy only: decode this earlier result instead of coding (it must be
  // of the same elements against the same base); `choice` and `weight`
  // are then not needed.
  const CodedPiece* coded = nullptr;
  // Lossy only, with a null `out`: keep the piece's blob in `blob` too.
  bool keep_blob = false;
  std::vector<uint8_t> blob;
  // Weights under the one-step measure: the measured error times this is
  // the error in steps (C / the piece's relative target); 0 otherwise.
  double error_to_steps = 0;
  // Filled by the encoder: how the piece came out (lossy segments only;
  // `coded_lossy` false when it had to be stored losslessly).
  PieceOutcome outcome;
  bool coded_lossy = false;
  // Bytes of its payload; an exact piece's share of the lossless run.
  uint64_t stored = 0;
};

// Codes `raw` (file offset `chunk_offset`, `ranges`: the tensor ranges
// overlapping it) against `base` (the predecessor's bytes for this chunk,
// or empty) and rewrites `raw` in place with the reconstruction. Segments
// must cover the chunk in order. Appends to `out`; with a null `out`, only
// rewrites `raw` (and fills each lossy segment's outcome). `scratch`: the
// caller's buffers for the pieces (null: fresh ones). The lossless bytes
// are coded against `base` when that is smaller, which needs the base as
// much as a predicted piece does: `lossless_against_base`, when given,
// says whether they were.
Status EncodeLossyChunk(std::span<uint8_t> raw, std::span<const uint8_t> base, uint64_t chunk_offset,
                        std::span<const TensorRange> ranges, std::span<ChunkSegment> segments,
                        const TensorChunkOptions& opts, std::vector<uint8_t>* out, PieceScratch* scratch = nullptr,
                        bool* lossless_against_base = nullptr);

// Decodes into exactly out.size() bytes. `base` is required (same size)
// when any piece, or the lossless run, was coded against it.
Status DecodeLossyChunk(std::span<const uint8_t> stored, std::span<const uint8_t> base, std::span<uint8_t> out);

}  // namespace ckptfs::lossy
