// Writing and reading packs. A PackWriter streams a source fd in chunks into
// a temporary file (bounded memory: one chunk in, one chunk out); the Store
// then publishes it with rename. A PackReader keeps the chunk table in memory
// and decodes one chunk at a time, verifying both checksums.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"
#include "codec/chunk_codec.h"
#include "store/chunk_read_ahead.h"
#include "base/env.h"
#include "store/object_id.h"
#include "store/pack_bytes.h"
#include "store/pack_format.h"
#include "store/pack_meta.h"

namespace ckptfs {

struct PackStats {
  uint64_t logical_size = 0;
  uint64_t stored_size = 0;  // whole pack file, headers included
  uint64_t chunk_count = 0;
  PackMeta meta;            // as written
  uint64_t ref_chunks = 0;  // chunks stored as kRef (dedup)
  uint64_t delta_chunks = 0;
  uint64_t lossy_chunks = 0;
};

// Logical bytes of other packs, for chunks stored against them. The store
// implements it (with the decoded-chunk cache); `depth` guards recursion.
class BaseSource {
 public:
  virtual ~BaseSource() = default;
  virtual Status ReadPackRange(ObjectId pack, uint64_t offset, std::span<uint8_t> out) = 0;
  // The same bytes, for a reader that needs them once (a seal reading the
  // base of a delta): a source with a cache of decoded chunks may decode a
  // chunk it does not hold straight into `out`, which saves a chunk-sized
  // allocation (fresh pages) and a copy, and leaves the cache to readers.
  virtual Status ReadPackRangeOnce(ObjectId pack, uint64_t offset, std::span<uint8_t> out) {
    return ReadPackRange(pack, offset, out);
  }
  // Runs `use` on the bytes of [offset, offset+len) of `pack`. A source with
  // a cache of decoded chunks lends a range inside one chunk without copying
  // it; this default reads it into a buffer.
  virtual Status UsePackRange(ObjectId pack, uint64_t offset, uint64_t len,
                              const std::function<Status(std::span<const uint8_t>)>& use);
  // A chunk's base window (pack_format.h, BaseWindowLead): the bytes of
  // `pack` at `offset`, behind zeros where the window starts before the pack.
  // `once` reads as ReadPackRangeOnce does.
  Status ReadBaseWindow(ObjectId pack, uint64_t offset, std::span<uint8_t> out, bool once = false);
  // When the chunks of `pack` that the base window [offset, offset+len)
  // touches are ref, delta or lossy chunks stored against one base with
  // one shift (a whole chunk, or a window moved with the file's tensors):
  // the window of that base the window's bytes were coded against
  // (its offset negative for a leading window).
  virtual std::optional<std::pair<ObjectId, uint64_t>> BaseOfChunk(ObjectId pack, uint64_t offset, uint64_t len) {
    (void)pack, (void)offset, (void)len;
    return std::nullopt;
  }
};

// What a chunk could be stored against, proposed by the store's lineage and
// dedup indexes while a pack is written.
struct ChunkPlan {
  ChunkCodec codec = ChunkCodec::kRaw;  // kRef, kDelta or kLossy
  std::vector<uint8_t> payload;         // complete, base reference included
  ObjectId base = 0;                    // 0: none (a lossy keyframe)
  uint8_t depth = 0;                    // delta depth of the resulting chunk
};
class ChunkPlanner {
 public:
  virtual ~ChunkPlanner() = default;
  // A kRef when the chunk's bytes are already stored (asked first: it makes
  // coding the chunk unnecessary), or nothing.
  virtual std::optional<ChunkPlan> PlanRef(uint64_t offset, std::span<const uint8_t> raw, uint64_t content_hash,
                                           std::span<const TensorRange> ranges) = 0;
  // A kDelta that beats the chunk coded on its own by enough to pay for its
  // read cost, or nothing. `standalone_size` codes the chunk on its own and
  // returns the coded size (once: later calls return the same size); it
  // costs as much as a delta, so a planner calls it only when it must.
  virtual std::optional<ChunkPlan> PlanDelta(uint64_t offset, std::span<const uint8_t> raw,
                                             std::span<const TensorRange> ranges,
                                             const std::function<size_t()>& standalone_size) = 0;
  // Lossy mode, asked before anything else: may rewrite `raw` into the
  // file's reconstructed bytes (quantized tensors, patched zip CRCs), which
  // are what the pack then holds, and returns the kLossy plan for chunks
  // holding lossy tensors.
  virtual Result<std::optional<ChunkPlan>> TransformLossy(uint64_t offset, std::span<uint8_t> raw,
                                                          std::span<const TensorRange> ranges) {
    (void)offset, (void)raw, (void)ranges;
    return std::optional<ChunkPlan>{};
  }
  // Whether TransformLossy may rewrite chunks: then every chunk is read,
  // holes included, since the lossy coder keeps state across them.
  virtual bool Rewrites() const { return false; }
  // Lets the planner add to the meta block before it is written.
  virtual void FinishMeta(PackMeta* meta) { (void)meta; }
};

// Encodes bytes [0, size) of src_fd into dst_fd (an empty, writable file)
// and fdatasyncs dst_fd. `cancel`, when set and true, aborts with ECANCELED.
// `tensors` (sorted, absolute offsets) lets chunks holding them use kTensor;
// `planner`, when set, may store chunks against other packs.
Result<PackStats> WritePack(Env* env, int src_fd, uint64_t size, int dst_fd, uint32_t chunk_size,
                            const ChunkEncoderOptions& opts, const std::atomic<bool>* cancel = nullptr,
                            std::span<const TensorRange> tensors = {}, ChunkPlanner* planner = nullptr);

// Threads that code a pack's chunks at the same time (each with its own
// planner, which only that thread uses), while the pack is still written in
// file order: the same bytes as one thread writes. Memory grows by a chunk
// in and two chunks out per thread (a coded chunk may wait for an earlier
// one). Lossy planners may share one LossyCoder (DeltaPlanner::SetLossy,
// which runs its CRC pass ahead of the chunks).
struct PackWorkers {
  unsigned count = 1;
  std::span<ChunkPlanner* const> planners;  // empty, or `count` planners
};
Result<PackStats> WritePack(Env* env, int src_fd, uint64_t size, int dst_fd, uint32_t chunk_size,
                            const ChunkEncoderOptions& opts, const std::atomic<bool>* cancel,
                            std::span<const TensorRange> tensors, const PackWorkers& workers);

class PackReader {
 public:
  // Validates header, footer and table checksums. `name` is used in messages.
  static Result<std::shared_ptr<PackReader>> Open(std::unique_ptr<PackBytes> source, std::string name);
  // A pack file held open, read through Env.
  static Result<std::shared_ptr<PackReader>> Open(Env* env, UniqueFd fd, std::string name) {
    return Open(std::make_unique<FdPackBytes>(env, std::move(fd)), std::move(name));
  }

  const PackHeader& header() const { return header_; }
  const std::vector<ChunkEntry>& chunks() const { return chunks_; }
  // Version 3 packs; empty (no bases, no hashes) for older ones, and when
  // the meta block cannot be read (then meta_status() says why, and the
  // pack's references are unknown although its chunks read fine).
  const PackMeta& meta() const { return meta_; }
  const Status& meta_status() const { return meta_status_; }
  uint64_t stored_size() const { return stored_size_; }
  const std::string& name() const { return name_; }

  // Decodes chunk `index` into `out` (resized to raw_len). Corruption names
  // the pack, the chunk and its logical offset. kRef/kDelta chunks read
  // their base through `bases` (an error when null).
  Status ReadChunk(uint64_t index, std::vector<uint8_t>* out, BaseSource* bases = nullptr) const;
  // The same into `out`, which must be exactly raw_len bytes; what it holds
  // after a failure is unspecified.
  Status ReadChunkInto(uint64_t index, std::span<uint8_t> out, BaseSource* bases = nullptr) const;
  // The base pack and offset a kRef/kDelta chunk names (fsck, stats).
  Result<std::pair<ObjectId, uint64_t>> ChunkBase(uint64_t index) const;
  // Starts reading chunk `index` ahead (no-op when out of range): the
  // kernel into its page cache for a file, an asynchronous read for a RADOS
  // object, so that a sequential reader finds it at hand.
  void Prefetch(uint64_t index) const;
  // Starts reading chunk `index`'s stored bytes on a thread of its own, so
  // that a ReadChunkInto of it soon after finds them (no-op when out of
  // range, read or started already): a delta seal's reads of its
  // predecessor (store/chunk_read_ahead.h).
  void ReadAhead(uint64_t index) const;
  // Reads and checks every chunk (fsck).
  Status VerifyAll(BaseSource* bases = nullptr) const;

 private:
  PackReader(std::unique_ptr<PackBytes> source, std::string name)
      : source_(std::move(source)), name_(std::move(name)) {}
  // Chunk `index`'s stored bytes, read into `buf` (grown as needed), or
  // copied there when they were read ahead.
  Result<std::span<const uint8_t>> ReadStored(uint64_t index, AlignedBuffer& buf) const;
  Status DecodeAgainstBase(ChunkCodec codec, std::span<const uint8_t> stored, std::span<uint8_t> out,
                           BaseSource* bases) const;
  std::unique_ptr<PackBytes> source_;
  std::unique_ptr<ChunkReadAhead> ahead_;  // after source_, which its reads use
  std::string name_;
  PackHeader header_;
  std::vector<ChunkEntry> chunks_;
  PackMeta meta_;
  Status meta_status_ = Status::Ok();
  uint64_t stored_size_ = 0;
};

}  // namespace ckptfs
