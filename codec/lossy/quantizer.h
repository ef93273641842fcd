// Lossy coding of one run of floating-point elements (a "piece": the part
// of one tensor inside one chunk), DynaQuant-style:
//   - the residual against a predictor (the predecessor's reconstructed
//     elements, closed loop, or zero for a keyframe) is computed;
//   - the least sensitive residuals are pruned (the element keeps its
//     predicted value), the most sensitive are kept at full precision
//     (escapes), and the rest snap to non-uniform levels fitted by
//     weighted k-means, or to a uniform grid (entropy-coded, it beats
//     k-means levels at the same error on weights' deltas);
//   - a search picks the prune share, escape share and level count whose
//     estimated size is smallest while the error stays within the target;
//   - level indices are rANS-coded; index 0 means "unchanged from the
//     predictor", so parts that did not move cost almost nothing.
// Two domains: kValue works on values (weights, first moments) with an
// error weighted by sensitivity; kLogBits works on the integer bit pattern
// of non-negative values (second moments), a piecewise-linear log2.
//
// Blob (little-endian, LEB128 varints), documented in docs/FORMAT.md:
//   u8 version | u8 dtype | u8 domain | u8 flags (bit 0: against the base;
//   bit 1, version 2 and kValue only: the levels are a uniform grid)
//   varint n | u8 K | K levels (kValue: f32; kLogBits: zigzag varint), or
//   for a grid: f32 step | zigzag varint first multiple (level i is
//   step·(first + i), rounded to f32)
//   varint escapes | varint rANS length | rANS blob of n symbols
//   escapes x element bytes (verbatim)
// Symbols: 0 = predictor, 1..K = predictor + level, K+1 = next escape.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "base/status.h"
#include "codec/dtype.h"

namespace ckptfs {
class ComputeDevice;
}

namespace ckptfs::lossy {

// Version 2 added the uniform grid flag; version 1 pieces are still read.
inline constexpr uint8_t kPieceVersion = 2;
inline constexpr unsigned kMaxLevels = 250;

enum class Domain : uint8_t { kValue = 0, kLogBits = 1 };

struct PieceSpec {
  DType dtype = DType::kF32;  // kF32, kF16 or kBF16
  Domain domain = Domain::kValue;
  // kValue: sqrt(sum w (x' - x)^2) / sqrt(sum w x^2) must not exceed it.
  // kLogBits: the RMS error of the bit pattern, in units of 2^mantissa
  // (about log2 of the value), must not exceed it.
  double target = 0.01;
  // kValue against a base: the error may also not exceed this share of the
  // residual (the change since the predecessor), so a small update is not
  // dropped wholesale just because it is small next to the values (0: no cap).
  double residual_cap = 0;
  // kValue: scale the fitted levels up so that the coded elements keep the
  // weighted energy of the values they stand for. Levels at conditional
  // means shrink a vector by 1 - e^2 in energy; for Adam's m that is a
  // partial drop of momentum at every restore, which costs loss where noise
  // of the same size does not (docs/LOSSY.md). The levels are stored, so
  // decoding is unchanged.
  bool preserve_energy = false;
  // Whether the search may leave the least sensitive elements at the
  // predictor. Off, every element snaps to its nearest level (a level may
  // still sit near zero): for Adam's m, pruning zeroes the momentum of the
  // smallest updates at every restore, a systematic error (docs/LOSSY.md).
  bool prune = true;
};

// What the search chose for a piece, so that the same input can be coded
// again without searching (the zip CRC pass codes each piece before the
// pack is written; LossyCoder keeps the choices for the second time).
// Levels at the consecutive multiples of `step` from `first` on, stored as
// these two numbers instead of one f32 per level.
struct UniformGrid {
  float step = 0;
  int64_t first = 0;
};

struct PieceChoice {
  bool exact = false;  // no lossy code met the target: the piece is stored losslessly
  bool against_base = false;
  uint32_t prune_below = 0;
  uint32_t escape_from = UINT32_MAX;
  std::vector<double> levels;
  std::optional<UniformGrid> grid;  // how `levels` are stored, when they are a grid
  double error = 0;
};

// Buffers the encoder reuses from piece to piece: pieces run up to a
// chunk's elements, and allocating their per-element arrays afresh cost
// more in page faults than some of the passes over them. One per sealing
// worker, owned by the caller, so the memory goes when the seal does.
struct PieceScratch {
  std::vector<double> r, w;
  std::vector<uint32_t> qclass;
  std::vector<uint8_t> must_escape, symbols;
  // Escaped elements' bits, room for every element of the largest piece:
  // left uninitialised, so that only the pages escapes are written to
  // become resident (most pieces have none).
  std::unique_ptr<uint32_t[]> escapes;
  size_t escapes_room = 0;
  std::vector<uint8_t> recon, bytes;  // a piece's reconstruction; file bytes (LossyCoder)
  // LossyCoder: the one-step measure's weights, first and second moments,
  // and sensitivity vectors handed back after a chunk, for the next.
  std::vector<uint8_t> step_bytes[3];
  std::vector<std::vector<float>> weights;
};

// The first n elements of `v`, grown to hold them.
template <typename T>
std::span<T> ScratchSpan(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return {v.data(), n};
}

struct PieceInput {
  std::span<const uint8_t> x;       // the elements
  std::span<const uint8_t> base;    // predecessor's reconstructed elements, or empty
  std::span<const float> weight;    // kValue sensitivity per element (>= 0), or empty: uniform
  // Runs the per-element passes (prune classes, level assignment); null:
  // inline. The blob and reconstruction are the same either way.
  const ComputeDevice* device = nullptr;
  // When given, code with this earlier choice for the same input instead of searching.
  const PieceChoice* choice = nullptr;
  PieceScratch* scratch = nullptr;  // null: a fresh one
};

struct PieceOutcome {
  double error = 0;  // measured on the reconstruction, in the target's metric
  bool against_base = false;
  unsigned levels = 0;
  uint64_t pruned = 0;
  uint64_t escaped = 0;
  PieceChoice choice;  // to code the same input again (PieceInput::choice)
};

// Appends the blob to `out` (null: only the reconstruction is wanted) and
// writes the reconstruction (what decoding gives) to `recon`, which has x's size. EFBIG when no lossy code meets the
// target: the caller should store the piece losslessly.
Result<PieceOutcome> EncodePiece(const PieceSpec& spec, const PieceInput& in, std::vector<uint8_t>* out,
                                 std::span<uint8_t> recon);

// Decodes into exactly out.size() bytes; `base` must be given (same size)
// when the blob was coded against one. Malformed blobs are Corruption.
Status DecodePiece(std::span<const uint8_t> blob, std::span<const uint8_t> base, std::span<uint8_t> out);

// The error of `recon` against `x` in `spec`'s metric (tests, stats).
double MeasureError(const PieceSpec& spec, std::span<const uint8_t> x, std::span<const uint8_t> recon,
                    std::span<const float> weight = {});

}  // namespace ckptfs::lossy
