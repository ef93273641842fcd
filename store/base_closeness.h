// Telling apart predecessors that match a new file's layout equally well.
// The shards of one DCP save (one per rank) have the same tensors of the
// same sizes, so by layout rank 2's shard at step N matches every rank's
// shard at step N-1; only the content says which one it continues. Training
// moves weights and moments a little per step, so the predecessor is the
// candidate whose bytes at a sampled place are closest to the new file's.
#pragma once

#include <cstddef>
#include <span>

#include "codec/formats/layout.h"
#include "codec/tensor_chunk.h"
#include "store/pack.h"
#include "store/pack_index.h"

namespace ckptfs {

// Candidates within this share of the best one's matched bytes are compared.
inline constexpr double kCloseCandidateShare = 0.9;
// At most this many, each costing one chunk decode.
inline constexpr size_t kMaxComparedBases = 8;

// The index in `candidates` of the one whose bytes are closest to `file`'s,
// sampled in the largest tensor all of them hold; among equally close ones
// the one with the shallowest delta chain, then the first (best by layout);
// 0 when they cannot be compared.
size_t ClosestBase(const ByteSource& file, std::span<const TensorRange> ranges,
                   std::span<const BaseChoice> candidates, BaseSource& bases);

// How far apart two samples of a tensor of type `t` are: the sum of the
// elements' absolute differences for floating point (non-finite elements
// that differ count as far), the number of differing bytes otherwise.
double SampleDistance(DType t, std::span<const uint8_t> a, std::span<const uint8_t> b);

}  // namespace ckptfs
