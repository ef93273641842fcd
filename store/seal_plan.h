// The seam between the store and the layer that knows file formats. The
// store's seal asks a SealPlanner how to code a closed file, and never
// parses it itself: which ranges are tensors, which chunk size suits the
// file, and, under a lossy policy, the lossy coder. seal/seal_planner.h
// implements it; a store given none seals every file with the generic
// lossless codec.
#pragma once

#include <cerrno>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/byte_source.h"
#include "base/status.h"
#include "codec/lossy/file_coder.h"
#include "codec/lossy/policy.h"
#include "codec/lossy/siblings.h"
#include "codec/tensor_chunk.h"

namespace ckptfs {

// How a seal codes a file: its tensor ranges, its chunk size and, under a
// lossy policy with something in scope, its lossy coder, which reads
// `tensors` and the file: both outlive it, and a SealCoding is filled in
// place, never moved.
struct SealCoding {
  std::vector<TensorRange> tensors;
  uint32_t chunk_size = 0;
  std::optional<LossyCoder> lossy;
};

// The status code of a postponed seal.
inline constexpr int kSealPostponed = EINPROGRESS;

class SealPlanner {
 public:
  virtual ~SealPlanner() = default;
  // Fills `out` (its chunk_size preset to the store's) for `file`, with
  // `siblings` (may be null) for the files of its save; the store's
  // kSealPostponed when the seal should wait for more of that save. `ctx`
  // names the seal in logs.
  virtual Status Plan(const ByteSource& file, const LossyPolicy& policy, SiblingSource* siblings,
                      const TensorChunkOptions& chunk_options, const std::string& ctx, SealCoding* out) const = 0;
};

// Plans nothing: every file is generic bytes, sealed losslessly.
const SealPlanner& GenericSealPlanner();

}  // namespace ckptfs
