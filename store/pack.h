// Writing and reading packs. A PackWriter streams a source fd in chunks into
// a temporary file (bounded memory: one chunk in, one chunk out); the Store
// then publishes it with rename. A PackReader keeps the chunk table in memory
// and decodes one chunk at a time, verifying both checksums.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"
#include "codec/chunk_codec.h"
#include "store/env.h"
#include "store/pack_format.h"

namespace ckptfs {

struct PackStats {
  uint64_t logical_size = 0;
  uint64_t stored_size = 0;  // whole pack file, headers included
  uint64_t chunk_count = 0;
};

// Encodes bytes [0, size) of src_fd into dst_fd (an empty, writable file)
// and fdatasyncs dst_fd. `cancel`, when set and true, aborts with ECANCELED.
// `tensors` (sorted, absolute offsets) lets chunks holding them use kTensor.
Result<PackStats> WritePack(Env* env, int src_fd, uint64_t size, int dst_fd, uint32_t chunk_size,
                            const ChunkEncoderOptions& opts, const std::atomic<bool>* cancel = nullptr,
                            std::span<const TensorRange> tensors = {});

class PackReader {
 public:
  // Validates header, footer and table checksums. `name` is used in messages.
  static Result<std::shared_ptr<PackReader>> Open(Env* env, UniqueFd fd, std::string name);

  const PackHeader& header() const { return header_; }
  const std::vector<ChunkEntry>& chunks() const { return chunks_; }
  uint64_t stored_size() const { return stored_size_; }
  const std::string& name() const { return name_; }
  int fd() const { return fd_.get(); }

  // Decodes chunk `index` into `out` (resized to raw_len). Corruption names
  // the pack, the chunk and its logical offset.
  Status ReadChunk(uint64_t index, std::vector<uint8_t>* out) const;
  // Asks the kernel to start reading chunk `index` from disk (no-op when
  // out of range), so a sequential reader finds it in the page cache.
  void Prefetch(uint64_t index) const;
  // Reads and checks every chunk (fsck).
  Status VerifyAll() const;

 private:
  PackReader(Env* env, UniqueFd fd, std::string name) : env_(env), fd_(std::move(fd)), name_(std::move(name)) {}
  Env* env_;
  UniqueFd fd_;
  std::string name_;
  PackHeader header_;
  std::vector<ChunkEntry> chunks_;
  uint64_t stored_size_ = 0;
};

}  // namespace ckptfs
