#include "store/pack.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>

#include "base/hash.h"
#include "base/le.h"
#include "store/write_behind.h"

namespace ckptfs {
namespace {

// The field offsets the pack reader and writer share (pack_format.h).
using namespace pack_layout;

void EncodeHeader(const PackHeader& h, std::span<uint8_t, kPackHeaderSize> out) {
  std::fill(out.begin(), out.end(), 0);
  std::memcpy(out.data(), kPackMagic, sizeof(kPackMagic));
  le::Put32(out, kHdrVersion, h.version);
  le::Put32(out, kHdrHeaderSize, kPackHeaderSize);
  le::Put32(out, kHdrChunkSize, h.chunk_size);
  le::Put32(out, kHdrFlags, h.flags);
  le::Put64(out, kHdrLogical, h.logical_size);
  le::Put64(out, kHdrCount, h.chunk_count);
  le::Put64(out, kHdrMetaOffset, h.meta_offset);
  le::Put32(out, kHdrMetaLen, h.meta_len);
  le::Put64(out, kHdrChecksum, Checksum64(std::span<const uint8_t>(out.data(), kHdrChecksum), kSeedHeader));
}

void EncodeEntry(const ChunkEntry& e, std::span<uint8_t> out) {
  std::fill(out.begin(), out.end(), 0);
  le::Put64(out, kEntOffset, e.offset);
  le::Put32(out, kEntStoredLen, e.stored_len);
  le::Put32(out, kEntRawLen, e.raw_len);
  out[kEntCodec] = static_cast<uint8_t>(e.codec);
  le::Put64(out, kEntStoredSum, e.stored_checksum);
  le::Put64(out, kEntRawSum, e.raw_checksum);
}

// A coded chunk on its way into the pack: its buffer is reused chunk after
// chunk, so memory is bounded by the slots (EncodeInParallel's window).
struct ChunkSlot {
  std::vector<uint8_t> out;
  ChunkEntry entry;
  std::optional<ChunkPlan> plan;  // payload already moved into `out`
  uint64_t hash = 0;
  bool hole = false;  // a zero chunk never read (kPackFlagHoles)
};

struct PackSource {
  Env* env;
  int fd;
  uint64_t size;
  uint32_t chunk_size;
  const ChunkEncoderOptions* opts;
  std::span<const TensorRange> tensors;
};

// The content hash of `len` zero bytes (the meta block's hash of a hole
// chunk), computed once per length: a file's holes all share it.
uint64_t ZeroContentHash(size_t len) {
  static std::mutex mu;
  static std::map<size_t, uint64_t> known;
  std::lock_guard lk(mu);
  auto it = known.find(len);
  if (it != known.end()) return it->second;
  const std::vector<uint8_t> zeros(len);
  return known.emplace(len, ChunkContentHash(zeros)).first->second;
}

// Where the source's data lies, asked of the file system (Env::SeekData)
// as the chunks go by, one worker's chunks at a time: a chunk inside a
// hole is stored as a zero chunk without being read. One look per hole
// and per data chunk, so a sparse file costs its extents, not its size.
class HoleCursor {
 public:
  // Whether [off, off + len) holds no data. When the file system cannot
  // say, the chunk is read: its zeros, if any, are found the old way.
  bool IsHole(const PackSource& src, uint64_t off, uint64_t len) {
    if (off < looked_at_ || off >= next_data_) {
      Result<uint64_t> data = src.env->SeekData(src.fd, off);
      looked_at_ = off;
      next_data_ = data.ok() ? *data : off;
    }
    return next_data_ - off >= len;
  }

 private:
  // No data in [looked_at_, next_data_).
  uint64_t looked_at_ = 1;
  uint64_t next_data_ = 0;
};

// Fills `s` for chunk i, of `len` bytes, that lies in a hole.
void FillHole(uint64_t len, ChunkSlot* s) {
  s->plan.reset();
  s->out.clear();
  s->hole = true;
  s->hash = ZeroContentHash(len);
  s->entry.codec = ChunkCodec::kZero;
  s->entry.raw_len = static_cast<uint32_t>(len);
  s->entry.raw_checksum = 0;  // not checked under kPackFlagHoles
}

// Codes a chunk no plan covers yet: as a delta where `planner` finds one that
// pays, else on its own (which the planner may ask for first, as the size a
// delta must beat; it is coded once either way).
void CodeUnplanned(const PackSource& src, uint64_t off, std::span<const uint8_t> raw,
                   std::span<const TensorRange> ranges, ChunkPlanner* planner, ChunkSlot* s) {
  bool coded = false;
  const std::function<size_t()> code_alone = [&] {
    if (!coded) {
      s->entry.codec = EncodeChunk(raw, *src.opts, &s->out, off, ranges);
      coded = true;
    }
    return s->out.size();
  };
  if (planner != nullptr) s->plan = planner->PlanDelta(off, raw, ranges, code_alone);
  if (!s->plan) code_alone();
}

// Reads chunk i into `in` and codes it: a plan against other packs when the
// planner has one, else on its own. Leaves offset and stored checksum to the
// appender.
Status EncodeChunkAt(const PackSource& src, uint64_t i, ChunkPlanner* planner, HoleCursor* holes,
                     std::vector<uint8_t>* in, ChunkSlot* s) {
  const uint64_t off = i * src.chunk_size;
  const size_t len = static_cast<size_t>(std::min<uint64_t>(src.chunk_size, src.size - off));
  s->hole = false;
  // A lossy planner sees every chunk (its CRC pass, its statistics).
  if ((planner == nullptr || !planner->Rewrites()) && holes->IsHole(src, off, len)) {
    FillHole(len, s);
    return Status::Ok();
  }
  in->resize(len);
  std::span<uint8_t> raw(in->data(), len);
  ASSIGN_OR_RETURN(size_t got, src.env->PRead(src.fd, raw, off));
  if (got != len) {
    // The source is shorter than the size we were asked to pack: it was
    // truncated while we read it. The caller should retry with a new size.
    return Status::Error(EAGAIN, "source shrank while packing: expected " + std::to_string(src.size) +
                                     " bytes, got end of file at " + std::to_string(off + got));
  }
  const std::span<const TensorRange> ranges = RangesOverlapping(src.tensors, off, off + len);
  s->plan.reset();
  if (planner != nullptr) {
    ASSIGN_OR_RETURN(s->plan, planner->TransformLossy(off, raw, ranges));
  }
  s->hash = ChunkContentHash(raw);  // of the bytes the pack holds
  // Zero chunks cost nothing on their own: never make them depend on a base.
  const bool plannable = !s->plan && planner != nullptr && !IsAllZero(raw);
  if (plannable) s->plan = planner->PlanRef(off, raw, s->hash, ranges);
  if (!s->plan) CodeUnplanned(src, off, raw, ranges, plannable ? planner : nullptr, s);
  if (s->plan) {
    s->entry.codec = s->plan->codec;
    s->out.swap(s->plan->payload);
  }
  s->entry.raw_len = static_cast<uint32_t>(len);
  s->entry.raw_checksum = Checksum64(raw, kSeedChunkRaw ^ i);
  return Status::Ok();
}

// Writes coded chunks into the pack, in file order, and records them in the
// table and the meta block.
class ChunkAppender {
 public:
  ChunkAppender(Env* env, int fd, PackStats* stats, std::span<uint8_t> table)
      : env_(env), fd_(fd), stats_(stats), table_(table), behind_(env, fd) {}

  Status Append(uint64_t i, ChunkSlot* s) {
    PackMeta& meta = stats_->meta;
    ChunkEntry e = s->entry;
    if (s->plan) {
      const ChunkPlan& plan = *s->plan;
      meta.chunk_depth[i] = plan.depth;
      if (plan.base != 0 && std::find(meta.bases.begin(), meta.bases.end(), plan.base) == meta.bases.end()) {
        meta.bases.push_back(plan.base);
      }
      needs_v5_ = needs_v5_ || (plan.base != 0 && BaseWindowLeads(le::Get64(s->out, 8)));
      ++(e.codec == ChunkCodec::kRef     ? stats_->ref_chunks
         : e.codec == ChunkCodec::kDelta ? stats_->delta_chunks
                                         : stats_->lossy_chunks);
    }
    needs_v5_ = needs_v5_ || e.codec == ChunkCodec::kLossy;  // lossy chunks are written as version 2
    holes_ = holes_ || s->hole;
    meta.chunk_hash[i] = s->hash;
    e.offset = pos_;
    e.stored_len = static_cast<uint32_t>(s->out.size());
    e.stored_checksum = Checksum64(s->out, kSeedChunkStored ^ i);
    if (!s->out.empty()) RETURN_IF_ERROR(env_->PWriteAll(fd_, s->out, pos_));
    pos_ += s->out.size();
    behind_.Wrote(pos_);
    EncodeEntry(e, table_.subspan(i * kPackTableEntrySize, kPackTableEntrySize));
    return Status::Ok();
  }
  uint64_t pos() const { return pos_; }
  // Whether a chunk's base window starts before its base, or a chunk is
  // lossy (version 2 of the lossy chunk): both need pack version 5.
  bool needs_v5() const { return needs_v5_; }
  // Whether a chunk was a hole never read (kPackFlagHoles).
  bool holes() const { return holes_; }

 private:
  Env* env_;
  int fd_;
  PackStats* stats_;
  std::span<uint8_t> table_;
  uint64_t pos_ = kPackHeaderSize;
  bool needs_v5_ = false;
  bool holes_ = false;
  WriteBehind behind_;
};

Status Cancelled(const std::atomic<bool>* cancel) {
  if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
    return Status::Error(ECANCELED, "pack write cancelled");
  }
  return Status::Ok();
}

Status EncodeInOrder(const PackSource& src, uint64_t count, const std::atomic<bool>* cancel, ChunkPlanner* planner,
                     ChunkAppender* out) {
  std::vector<uint8_t> in;
  ChunkSlot slot;
  HoleCursor holes;
  for (uint64_t i = 0; i < count; ++i) {
    RETURN_IF_ERROR(Cancelled(cancel));
    RETURN_IF_ERROR(EncodeChunkAt(src, i, planner, &holes, &in, &slot));
    RETURN_IF_ERROR(out->Append(i, &slot));
  }
  return Status::Ok();
}

// Chunks cost unequal work (a delta decodes its base first), so a worker
// whose chunk is coded before an earlier one leaves it waiting here and
// goes on with the next chunk. Each worker has kSlotsPerWorker slots: it
// takes a free slot before it takes a chunk, so the chunks in flight (coded
// or not) never outnumber the slots, and the oldest is always being coded
// by a worker that holds a slot, so the pack always moves on. Whoever hands
// in the chunk next in file order appends it, and every waiting one after
// it, outside the lock.
class InOrderAppends {
 public:
  static constexpr unsigned kSlotsPerWorker = 2;

  InOrderAppends(ChunkAppender* out, unsigned workers)
      : out_(out), slots_(workers * kSlotsPerWorker), ring_(slots_.size()), free_(workers) {
    for (size_t k = 0; k < slots_.size(); ++k) free_[k % workers].push_back(&slots_[k]);
  }

  // A free slot of worker t's; nullptr once the pack has failed.
  ChunkSlot* TakeSlot(unsigned t) {
    std::unique_lock lk(mu_);
    turn_.wait(lk, [&] { return failed_ || !free_[t].empty(); });
    if (failed_) return nullptr;
    ChunkSlot* s = free_[t].back();
    free_[t].pop_back();
    return s;
  }

  // Chunk i is coded into `slot` by worker t (or failed with `s`).
  void HandIn(uint64_t i, unsigned t, ChunkSlot* slot, Status s) {
    std::unique_lock lk(mu_);
    ring_[i % ring_.size()] = Waiting{slot, t, std::move(s), true};
    while (!appending_ && !failed_ && ring_[appended_ % ring_.size()].ready) AppendNext(lk);
  }

  // The first failure in file order, or Ok.
  Status FirstError() {
    std::lock_guard lk(mu_);
    return failed_ ? first_error_ : Status::Ok();
  }

 private:
  struct Waiting {
    ChunkSlot* slot = nullptr;
    unsigned owner = 0;
    Status status;
    bool ready = false;
  };

  void AppendNext(std::unique_lock<std::mutex>& lk) {
    Waiting w = std::move(ring_[appended_ % ring_.size()]);
    ring_[appended_ % ring_.size()].ready = false;
    appending_ = true;
    lk.unlock();
    if (w.status.ok()) w.status = out_->Append(appended_, w.slot);
    lk.lock();
    appending_ = false;
    free_[w.owner].push_back(w.slot);
    if (w.status.ok()) {
      ++appended_;
    } else {
      failed_ = true;
      first_error_ = std::move(w.status);
    }
    turn_.notify_all();
  }

  ChunkAppender* out_;
  std::mutex mu_;
  std::condition_variable turn_;
  std::vector<ChunkSlot> slots_;
  std::vector<Waiting> ring_;                  // chunk i waits at i % size
  std::vector<std::vector<ChunkSlot*>> free_;  // per worker
  uint64_t appended_ = 0;
  bool appending_ = false;
  bool failed_ = false;
  Status first_error_;
};

// Workers take chunks in file order and code them at the same time
// (InOrderAppends). The pack is byte for byte what EncodeInOrder writes, and
// the first failure in file order is what the caller gets.
Status EncodeInParallel(const PackSource& src, uint64_t count, const std::atomic<bool>* cancel,
                        std::span<ChunkPlanner* const> planners, unsigned workers, ChunkAppender* out) {
  std::atomic<uint64_t> next{0};
  InOrderAppends appends(out, workers);
  auto work = [&](unsigned t) {
    ChunkPlanner* planner = planners.empty() ? nullptr : planners[t];
    std::vector<uint8_t> in;
    HoleCursor holes;
    for (ChunkSlot* slot; (slot = appends.TakeSlot(t)) != nullptr;) {
      const uint64_t i = next.fetch_add(1);
      if (i >= count) return;
      Status s = Cancelled(cancel);
      if (s.ok()) s = EncodeChunkAt(src, i, planner, &holes, &in, slot);
      appends.HandIn(i, t, slot, std::move(s));
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 1; t < workers; ++t) {
    try {
      threads.emplace_back(work, t);
    } catch (const std::system_error&) {
      break;  // fewer threads than asked: the ones running take every chunk
    }
  }
  work(0);
  for (std::thread& th : threads) th.join();
  return appends.FirstError();
}

}  // namespace

Result<PackStats> WritePack(Env* env, int src_fd, uint64_t size, int dst_fd, uint32_t chunk_size,
                            const ChunkEncoderOptions& opts, const std::atomic<bool>* cancel,
                            std::span<const TensorRange> tensors, ChunkPlanner* planner) {
  ChunkPlanner* const one[] = {planner};
  return WritePack(
      env, src_fd, size, dst_fd, chunk_size, opts, cancel, tensors,
      PackWorkers{1, planner != nullptr ? std::span<ChunkPlanner* const>(one) : std::span<ChunkPlanner* const>()});
}

Result<PackStats> WritePack(Env* env, int src_fd, uint64_t size, int dst_fd, uint32_t chunk_size,
                            const ChunkEncoderOptions& opts, const std::atomic<bool>* cancel,
                            std::span<const TensorRange> tensors, const PackWorkers& workers) {
  if (chunk_size == 0) return Status::InvalidArgument("pack chunk size must be positive");
  const unsigned n = std::max(1u, workers.count);
  if (!workers.planners.empty() && workers.planners.size() != n) {
    return Status::InvalidArgument("pack writer: need one planner per worker");
  }
  PackHeader header;
  header.chunk_size = chunk_size;
  header.logical_size = size;
  header.chunk_count = ChunkCount(size, chunk_size);
  if (header.chunk_count > kMaxPackChunks) {
    return Status::Error(EFBIG, std::to_string(size) + " bytes is more than a pack holds (" +
                                    std::to_string(kMaxPackChunks) + " chunks of " + std::to_string(chunk_size) + ")");
  }

  std::array<uint8_t, kPackHeaderSize> hdr;
  EncodeHeader(header, hdr);
  RETURN_IF_ERROR(env->PWriteAll(dst_fd, hdr, 0));

  // Bounded memory: per worker, one raw chunk in, one encoded chunk out and
  // one proposal; and the table and meta (about 50 bytes per chunk).
  std::vector<uint8_t> table(header.chunk_count * kPackTableEntrySize);
  PackStats stats;
  PackMeta& meta = stats.meta;
  meta.tensors.assign(tensors.begin(), tensors.end());
  meta.chunk_hash.resize(header.chunk_count);
  meta.chunk_depth.resize(header.chunk_count);
  const PackSource src{env, src_fd, size, chunk_size, &opts, tensors};
  ChunkAppender appender(env, dst_fd, &stats, table);
  if (n == 1 || header.chunk_count < 2) {
    RETURN_IF_ERROR(EncodeInOrder(src, header.chunk_count, cancel,
                                  workers.planners.empty() ? nullptr : workers.planners[0], &appender));
  } else {
    RETURN_IF_ERROR(EncodeInParallel(src, header.chunk_count, cancel, workers.planners,
                                     static_cast<unsigned>(std::min<uint64_t>(n, header.chunk_count)), &appender));
  }
  uint64_t pos = appender.pos();
  ChunkPlanner* const planner = workers.planners.empty() ? nullptr : workers.planners[0];

  meta.sealed_ns = env->WallTimeNs();
  if (planner != nullptr) planner->FinishMeta(&meta);
  const std::vector<uint8_t> meta_bytes = EncodePackMeta(meta);
  header.meta_offset = pos;
  header.meta_len = static_cast<uint32_t>(meta_bytes.size());
  RETURN_IF_ERROR(env->PWriteAll(dst_fd, meta_bytes, pos));
  pos += meta_bytes.size();
  header.version = appender.needs_v5() ? kPackFormatVersion : kPackPlainVersion;
  header.flags = appender.holes() ? kPackFlagHoles : 0;
  EncodeHeader(header, hdr);
  RETURN_IF_ERROR(env->PWriteAll(dst_fd, hdr, 0));

  const uint64_t table_offset = pos;
  if (!table.empty()) RETURN_IF_ERROR(env->PWriteAll(dst_fd, table, pos));
  pos += table.size();

  std::array<uint8_t, kPackFooterSize> footer{};
  le::Put64(footer, kFtTableOffset, table_offset);
  le::Put64(footer, kFtCount, header.chunk_count);
  le::Put64(footer, kFtTableSum, Checksum64(table, kSeedTable));
  std::memcpy(footer.data() + kFtMagic, kPackFooterMagic, sizeof(kPackFooterMagic));
  RETURN_IF_ERROR(env->PWriteAll(dst_fd, footer, pos));
  pos += footer.size();

  RETURN_IF_ERROR(env->Fdatasync(dst_fd));
  stats.logical_size = size;
  stats.stored_size = pos;
  stats.chunk_count = header.chunk_count;
  return stats;
}

}  // namespace ckptfs
