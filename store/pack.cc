#include "store/pack.h"

#include <fcntl.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>

#include "base/hash.h"
#include "codec/delta_chunk.h"
#include "codec/lossy/lossy_chunk.h"
#include "base/le.h"

namespace ckptfs {
namespace {

// Header (64 B): 0 magic[8] | 8 u32 version | 12 u32 header_size |
//   16 u32 chunk_size | 20 u32 flags | 24 u64 logical_size |
//   32 u64 chunk_count | 40 u64 meta_offset | 48 u32 meta_len | 52..55 reserved (0) |
//   56 u64 Checksum64(0..55, kSeedHeader). Versions 1 and 2 have 0 at 40..55.
constexpr size_t kHdrVersion = 8, kHdrHeaderSize = 12, kHdrChunkSize = 16, kHdrFlags = 20, kHdrLogical = 24,
                 kHdrCount = 32, kHdrMetaOffset = 40, kHdrMetaLen = 48, kHdrChecksum = 56;
// Table entry (40 B): 0 u64 offset | 8 u32 stored_len | 12 u32 raw_len |
//   16 u8 codec | 17..23 pad (0) | 24 u64 stored_checksum | 32 u64 raw_checksum
constexpr size_t kEntOffset = 0, kEntStoredLen = 8, kEntRawLen = 12, kEntCodec = 16, kEntStoredSum = 24,
                 kEntRawSum = 32;
// Footer (32 B): 0 u64 table_offset | 8 u64 chunk_count |
//   16 u64 Checksum64(table, kSeedTable) | 24 magic[8]
constexpr size_t kFtTableOffset = 0, kFtCount = 8, kFtTableSum = 16, kFtMagic = 24;

constexpr uint64_t kReadWholeBelow = 8u << 20;

uint64_t ChunkCount(uint64_t logical, uint32_t chunk_size) {
  return logical / chunk_size + (logical % chunk_size != 0 ? 1 : 0);
}

void EncodeHeader(const PackHeader& h, std::span<uint8_t, kPackHeaderSize> out) {
  std::fill(out.begin(), out.end(), 0);
  std::memcpy(out.data(), kPackMagic, sizeof(kPackMagic));
  le::Put32(out, kHdrVersion, h.version);
  le::Put32(out, kHdrHeaderSize, kPackHeaderSize);
  le::Put32(out, kHdrChunkSize, h.chunk_size);
  le::Put32(out, kHdrFlags, 0);
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

ChunkEntry DecodeEntry(std::span<const uint8_t> in) {
  ChunkEntry e;
  e.offset = le::Get64(in, kEntOffset);
  e.stored_len = le::Get32(in, kEntStoredLen);
  e.raw_len = le::Get32(in, kEntRawLen);
  e.codec = static_cast<ChunkCodec>(in[kEntCodec]);
  e.stored_checksum = le::Get64(in, kEntStoredSum);
  e.raw_checksum = le::Get64(in, kEntRawSum);
  return e;
}

// Stored bytes are read into a per-thread buffer: one chunk per FUSE worker
// thread at most, instead of an allocation per read.
std::vector<uint8_t>& ScratchBuffer() {
  thread_local std::vector<uint8_t> buf;
  return buf;
}

}  // namespace

namespace {

// One worker's chunk: its buffers are reused chunk after chunk, so memory
// is one chunk in and one out per worker.
struct ChunkSlot {
  std::vector<uint8_t> in;
  std::vector<uint8_t> out;
  ChunkEntry entry;
  std::optional<ChunkPlan> plan;  // payload already moved into `out`
  uint64_t hash = 0;
};

struct PackSource {
  Env* env;
  int fd;
  uint64_t size;
  uint32_t chunk_size;
  const ChunkEncoderOptions* opts;
  std::span<const TensorRange> tensors;
};

// Reads chunk i and codes it: a plan against other packs when the planner
// has one, else on its own. Leaves offset and stored checksum to the appender.
Status EncodeChunkAt(const PackSource& src, uint64_t i, ChunkPlanner* planner, ChunkSlot* s) {
  const uint64_t off = i * src.chunk_size;
  const size_t len = static_cast<size_t>(std::min<uint64_t>(src.chunk_size, src.size - off));
  s->in.resize(len);
  std::span<uint8_t> raw(s->in.data(), len);
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
  if (!s->plan) {
    s->entry.codec = EncodeChunk(raw, *src.opts, &s->out, off, ranges);
    if (plannable) s->plan = planner->PlanDelta(off, raw, ranges, s->out.size());
  }
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
      : env_(env), fd_(fd), stats_(stats), table_(table) {}

  Status Append(uint64_t i, ChunkSlot* s) {
    PackMeta& meta = stats_->meta;
    ChunkEntry e = s->entry;
    if (s->plan) {
      const ChunkPlan& plan = *s->plan;
      meta.chunk_depth[i] = plan.depth;
      if (plan.base != 0 && std::find(meta.bases.begin(), meta.bases.end(), plan.base) == meta.bases.end()) {
        meta.bases.push_back(plan.base);
      }
      ++(e.codec == ChunkCodec::kRef     ? stats_->ref_chunks
         : e.codec == ChunkCodec::kDelta ? stats_->delta_chunks
                                         : stats_->lossy_chunks);
    }
    meta.chunk_hash[i] = s->hash;
    e.offset = pos_;
    e.stored_len = static_cast<uint32_t>(s->out.size());
    e.stored_checksum = Checksum64(s->out, kSeedChunkStored ^ i);
    if (!s->out.empty()) RETURN_IF_ERROR(env_->PWriteAll(fd_, s->out, pos_));
    pos_ += s->out.size();
    EncodeEntry(e, table_.subspan(i * kPackTableEntrySize, kPackTableEntrySize));
    return Status::Ok();
  }
  uint64_t pos() const { return pos_; }

 private:
  Env* env_;
  int fd_;
  PackStats* stats_;
  std::span<uint8_t> table_;
  uint64_t pos_ = kPackHeaderSize;
};

Status Cancelled(const std::atomic<bool>* cancel) {
  if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
    return Status::Error(ECANCELED, "pack write cancelled");
  }
  return Status::Ok();
}

Status EncodeInOrder(const PackSource& src, uint64_t count, const std::atomic<bool>* cancel, ChunkPlanner* planner,
                     ChunkAppender* out) {
  ChunkSlot slot;
  for (uint64_t i = 0; i < count; ++i) {
    RETURN_IF_ERROR(Cancelled(cancel));
    RETURN_IF_ERROR(EncodeChunkAt(src, i, planner, &slot));
    RETURN_IF_ERROR(out->Append(i, &slot));
  }
  return Status::Ok();
}

// Workers take chunks in file order and code them at the same time; each
// appends its chunk once every earlier one is in. The pack is byte for
// byte what EncodeInOrder writes, and the first failure in file order is
// what the caller gets.
Status EncodeInParallel(const PackSource& src, uint64_t count, const std::atomic<bool>* cancel,
                        std::span<ChunkPlanner* const> planners, unsigned workers, ChunkAppender* out) {
  std::atomic<uint64_t> next{0};
  std::mutex mu;
  std::condition_variable turn;
  uint64_t appended = 0;
  bool failed = false;
  Status first_error;
  auto work = [&](unsigned t) {
    ChunkPlanner* planner = planners.empty() ? nullptr : planners[t];
    ChunkSlot slot;
    for (uint64_t i; (i = next.fetch_add(1)) < count;) {
      Status s = Cancelled(cancel);
      if (s.ok()) s = EncodeChunkAt(src, i, planner, &slot);
      std::unique_lock lk(mu);
      turn.wait(lk, [&] { return appended == i || failed; });
      if (failed) return;
      if (s.ok()) s = out->Append(i, &slot);
      if (!s.ok()) {
        failed = true;
        first_error = s;
      } else {
        ++appended;
      }
      turn.notify_all();
      if (failed) return;
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
  return failed ? first_error : Status::Ok();
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

namespace {

// Corruption errors about one pack: "<ctx>: <what>".
auto CorruptionIn(const std::string& ctx) {
  return [&ctx](const std::string& what) { return Status::Corruption(ctx + ": " + what); };
}

// The header, checked on its own: magic, checksum, a version this build
// reads, and fields that agree with each other.
Result<PackHeader> ReadPackHeader(Env* env, int fd, const std::string& ctx) {
  const auto corrupt = CorruptionIn(ctx);
  std::array<uint8_t, kPackHeaderSize> hdr;
  if (Status s = env->PReadExact(fd, hdr, 0); !s.ok()) return s.WithContext(ctx);
  if (std::memcmp(hdr.data(), kPackMagic, sizeof(kPackMagic)) != 0) return corrupt("bad header magic");
  if (!ChecksumMatches(Checksum64(std::span<const uint8_t>(hdr.data(), kHdrChecksum), kSeedHeader),
                       le::Get64(hdr, kHdrChecksum))) {
    return corrupt("header checksum mismatch");
  }
  PackHeader h;
  h.version = le::Get32(hdr, kHdrVersion);
  h.chunk_size = le::Get32(hdr, kHdrChunkSize);
  h.logical_size = le::Get64(hdr, kHdrLogical);
  h.chunk_count = le::Get64(hdr, kHdrCount);
  h.meta_offset = le::Get64(hdr, kHdrMetaOffset);
  h.meta_len = le::Get32(hdr, kHdrMetaLen);
  if (h.version < kPackMinReadableVersion || h.version > kPackFormatVersion) {
    return corrupt("format version " + std::to_string(h.version) + " is not supported (this build reads " +
                   std::to_string(kPackMinReadableVersion) + " to " + std::to_string(kPackFormatVersion) + ")");
  }
  if (le::Get32(hdr, kHdrHeaderSize) != kPackHeaderSize) return corrupt("unexpected header size");
  if (le::Get32(hdr, kHdrFlags) != 0) return corrupt("unknown header flags");
  if (h.chunk_size == 0) return corrupt("chunk size is 0");
  if (h.version < 3 && (h.meta_offset != 0 || h.meta_len != 0)) return corrupt("meta block in a version < 3 pack");
  if (h.version >= 3 && h.meta_len == 0) return corrupt("version 3 pack without a meta block");
  if (h.chunk_count != ChunkCount(h.logical_size, h.chunk_size)) {
    return corrupt("chunk count " + std::to_string(h.chunk_count) + " does not match logical size " +
                   std::to_string(h.logical_size));
  }
  return h;
}

struct ChunkTable {
  uint64_t offset = 0;
  std::vector<uint8_t> bytes;
};

// The chunk table the footer points at, just before the footer, checked
// against the footer's checksum.
Result<ChunkTable> ReadChunkTable(Env* env, int fd, uint64_t size, const PackHeader& h, const std::string& ctx) {
  const auto corrupt = CorruptionIn(ctx);
  std::array<uint8_t, kPackFooterSize> ft;
  if (Status s = env->PReadExact(fd, ft, size - kPackFooterSize); !s.ok()) return s.WithContext(ctx);
  if (std::memcmp(ft.data() + kFtMagic, kPackFooterMagic, sizeof(kPackFooterMagic)) != 0) {
    return corrupt("bad footer magic (truncated pack?)");
  }
  const uint64_t table_offset = le::Get64(ft, kFtTableOffset);
  if (le::Get64(ft, kFtCount) != h.chunk_count) return corrupt("footer and header disagree on the chunk count");
  if (h.chunk_count > (size - kPackHeaderSize - kPackFooterSize) / kPackTableEntrySize) {
    return corrupt("chunk table larger than the file");
  }
  const uint64_t table_bytes = h.chunk_count * kPackTableEntrySize;
  if (table_offset < kPackHeaderSize || table_offset != size - kPackFooterSize - table_bytes) {
    return corrupt("table offset " + std::to_string(table_offset) + " is inconsistent with file size " +
                   std::to_string(size));
  }
  ChunkTable table{table_offset, std::vector<uint8_t>(table_bytes)};
  if (Status s = env->PReadExact(fd, table.bytes, table_offset); !s.ok()) return s.WithContext(ctx);
  if (!ChecksumMatches(Checksum64(table.bytes, kSeedTable), le::Get64(ft, kFtTableSum))) {
    return corrupt("chunk table checksum mismatch");
  }
  return table;
}

// What an entry's codec requires of its stored length, and which pack
// versions may hold it. `at` names the chunk.
Status CheckEntryCodec(const ChunkEntry& e, uint32_t version, const std::string& at, const std::string& ctx) {
  const auto corrupt = CorruptionIn(ctx);
  switch (e.codec) {
    case ChunkCodec::kZero:
      if (e.stored_len != 0) return corrupt(at + "zero chunk with stored bytes");
      break;
    case ChunkCodec::kRaw:
      if (e.stored_len != e.raw_len) return corrupt(at + "raw chunk stored length differs from raw length");
      break;
    case ChunkCodec::kZstd:
      if (e.stored_len == 0) return corrupt(at + "empty zstd payload");
      break;
    case ChunkCodec::kTensor:
      if (version < 2) return corrupt(at + "tensor chunk in a version 1 pack");
      if (e.stored_len == 0) return corrupt(at + "empty tensor payload");
      break;
    case ChunkCodec::kRef:
    case ChunkCodec::kDelta:
      if (version < 3) return corrupt(at + "base reference in a version " + std::to_string(version) + " pack");
      if (e.stored_len < kBaseRefSize) return corrupt(at + "base reference shorter than 16 bytes");
      if (e.codec == ChunkCodec::kRef && e.stored_len != kBaseRefSize)
        return corrupt(at + "ref chunk with extra bytes");
      break;
    case ChunkCodec::kLossy:
      if (version < 4) return corrupt(at + "lossy chunk in a version " + std::to_string(version) + " pack");
      if (e.stored_len <= kBaseRefSize) return corrupt(at + "lossy chunk shorter than its base reference");
      break;
    default:
      return corrupt(at + "unknown codec " + std::to_string(static_cast<int>(e.codec)));
  }
  return Status::Ok();
}

// Where the chunk payloads end: at the meta block from version 3 on,
// otherwise at the chunk table.
uint64_t PayloadEnd(const PackHeader& h, const ChunkTable& table) {
  return h.version >= 3 ? h.meta_offset : table.offset;
}

// With the table trusted, check that the chunks tile the payload area and
// the logical file exactly: no byte of the pack escapes a checksum.
Result<std::vector<ChunkEntry>> DecodeChunkTable(const PackHeader& h, const ChunkTable& table, const std::string& ctx) {
  const auto corrupt = CorruptionIn(ctx);
  std::vector<ChunkEntry> chunks(h.chunk_count);
  const uint64_t payload_end = PayloadEnd(h, table);
  if (h.version >= 3 && (h.meta_offset < kPackHeaderSize || h.meta_offset + h.meta_len != table.offset)) {
    return corrupt("meta block at " + std::to_string(h.meta_offset) + " (" + std::to_string(h.meta_len) +
                   " bytes) does not end where the chunk table starts");
  }
  uint64_t pos = kPackHeaderSize;
  for (uint64_t i = 0; i < h.chunk_count; ++i) {
    ChunkEntry e =
        DecodeEntry(std::span<const uint8_t>(table.bytes).subspan(i * kPackTableEntrySize, kPackTableEntrySize));
    const std::string at = "chunk " + std::to_string(i) + ": ";
    const uint64_t want_raw = std::min<uint64_t>(h.chunk_size, h.logical_size - i * h.chunk_size);
    if (e.raw_len != want_raw) {
      return corrupt(at + "raw length " + std::to_string(e.raw_len) + ", expected " + std::to_string(want_raw));
    }
    if (e.offset != pos) {
      return corrupt(at + "payload offset " + std::to_string(e.offset) + ", expected " + std::to_string(pos));
    }
    RETURN_IF_ERROR(CheckEntryCodec(e, h.version, at, ctx));
    pos += e.stored_len;
    if (pos > payload_end) return corrupt(at + "payload runs into the chunk table");
    chunks[i] = e;
  }
  if (pos != payload_end) {
    return corrupt("payloads end at " + std::to_string(pos) + ", expected " + std::to_string(payload_end));
  }
  return chunks;
}

// The meta block is an index over the chunks, not part of the content:
// when it cannot be read the chunks still can, so the reader opens and
// says so in meta_status(); who needs the references (recovery, gc,
// fsck) must check it.
void ReadMetaBlock(Env* env, int fd, const PackHeader& h, const std::string& ctx, PackMeta* meta, Status* meta_status) {
  if (h.version < 3) return;
  std::vector<uint8_t> mb(h.meta_len);
  if (Status s = env->PReadExact(fd, mb, h.meta_offset); !s.ok()) {
    *meta_status = s.WithContext(ctx + ": meta block");
  } else if (Result<PackMeta> m = DecodePackMeta(mb, h.chunk_count); !m.ok()) {
    *meta_status = m.status().WithContext(ctx + ": meta block");
  } else {
    *meta = std::move(m).value();
  }
}

}  // namespace

Result<std::shared_ptr<PackReader>> PackReader::Open(Env* env, UniqueFd fd, std::string name) {
  const std::string ctx = "pack " + name;
  const auto corrupt = CorruptionIn(ctx);

  Result<struct stat> st = env->Fstat(fd.get());
  if (!st.ok()) return st.status().WithContext(ctx);
  const uint64_t size = static_cast<uint64_t>(st->st_size);
  if (size < kPackHeaderSize + kPackFooterSize) {
    return corrupt("file is " + std::to_string(size) + " bytes, too short for a header and footer");
  }
  ASSIGN_OR_RETURN(const PackHeader h, ReadPackHeader(env, fd.get(), ctx));
  ASSIGN_OR_RETURN(const ChunkTable table, ReadChunkTable(env, fd.get(), size, h, ctx));
  ASSIGN_OR_RETURN(std::vector<ChunkEntry> chunks, DecodeChunkTable(h, table, ctx));
  PackMeta meta;
  Status meta_status = Status::Ok();
  ReadMetaBlock(env, fd.get(), h, ctx, &meta, &meta_status);

  // A small pack (a delta or a file of references) is read whole up front:
  // otherwise every chunk's few stored bytes cost a disk round trip of their own.
  const uint64_t payload_end = PayloadEnd(h, table);
  if (payload_end <= kReadWholeBelow) {
    (void)env->Fadvise(fd.get(), 0, payload_end, POSIX_FADV_WILLNEED);
  }
  std::shared_ptr<PackReader> r(new PackReader(env, std::move(fd), std::move(name)));
  r->header_ = h;
  r->chunks_ = std::move(chunks);
  r->meta_ = std::move(meta);
  r->meta_status_ = std::move(meta_status);
  r->stored_size_ = size;
  return r;
}

Status PackReader::ReadChunk(uint64_t index, std::vector<uint8_t>* out, BaseSource* bases) const {
  if (index >= chunks_.size()) {
    return Status::InvalidArgument("pack " + name_ + ": chunk " + std::to_string(index) + " out of range (" +
                                   std::to_string(chunks_.size()) + " chunks)");
  }
  const ChunkEntry& e = chunks_[index];
  const std::string ctx = "pack " + name_ + ": chunk " + std::to_string(index) + " (offset " +
                          std::to_string(index * header_.chunk_size) + ")";
  auto fail = [&](const Status& s) {
    out->clear();  // never hand back bytes that failed verification
    return s;
  };

  // Chunks stored against a base read that base first, which may recurse
  // into this thread's scratch buffer: they keep their payload locally.
  const bool needs_base = StoredAgainstBase(e.codec);
  std::vector<uint8_t> local;
  std::vector<uint8_t>& stored = needs_base ? local : ScratchBuffer();
  stored.resize(e.stored_len);
  if (Status s = env_->PReadExact(fd_.get(), stored, e.offset); !s.ok()) return fail(s.WithContext(ctx));
  if (!ChecksumMatches(Checksum64(stored, kSeedChunkStored ^ index), e.stored_checksum)) {
    return fail(Status::Corruption(ctx + ": stored checksum mismatch"));
  }
  out->resize(e.raw_len);
  Status decoded = needs_base ? DecodeAgainstBase(e.codec, stored, *out, bases) : DecodeChunk(e.codec, stored, *out);
  if (!decoded.ok()) return fail(decoded.WithContext(ctx));
  if (!ChecksumMatches(Checksum64(*out, kSeedChunkRaw ^ index), e.raw_checksum)) {
    return fail(Status::Corruption(ctx + ": raw checksum mismatch"));
  }
  return Status::Ok();
}

Status PackReader::DecodeAgainstBase(ChunkCodec codec, std::span<const uint8_t> stored, std::span<uint8_t> out,
                                     BaseSource* bases) const {
  const ObjectId base = le::Get64(stored, 0);
  if (codec == ChunkCodec::kLossy && base == 0) {
    return lossy::DecodeLossyChunk(stored.subspan(kBaseRefSize), {}, out).WithContext("lossy keyframe chunk");
  }
  if (bases == nullptr)
    return Status::InvalidArgument("chunk is stored against another pack; no store to read it from");
  const uint64_t off = le::Get64(stored, 8);
  const std::string what = std::string(ChunkCodecName(codec)) + " chunk against pack " + ObjectIdHex(base) +
                           " offset " + std::to_string(off);
  if (codec == ChunkCodec::kRef) return bases->ReadPackRange(base, off, out).WithContext(what);
  std::vector<uint8_t> base_bytes(out.size());
  RETURN_IF_ERROR(bases->ReadPackRange(base, off, base_bytes).WithContext(what));
  if (codec == ChunkCodec::kLossy) {
    return lossy::DecodeLossyChunk(stored.subspan(kBaseRefSize), base_bytes, out).WithContext(what);
  }
  return DecodeDeltaChunk(stored.subspan(kBaseRefSize), base_bytes, out).WithContext(what);
}

Result<std::pair<ObjectId, uint64_t>> PackReader::ChunkBase(uint64_t index) const {
  if (index >= chunks_.size()) return Status::InvalidArgument("chunk index out of range");
  const ChunkEntry& e = chunks_[index];
  if (!StoredAgainstBase(e.codec)) return Status::Error(ENOENT, "chunk has no base");
  std::array<uint8_t, kBaseRefSize> ref;
  RETURN_IF_ERROR(env_->PReadExact(fd_.get(), ref, e.offset));
  if (le::Get64(ref, 0) == 0) return Status::Error(ENOENT, "lossy keyframe chunk has no base");
  return std::make_pair(le::Get64(ref, 0), le::Get64(ref, 8));
}

void PackReader::Prefetch(uint64_t index) const {
  if (index >= chunks_.size() || chunks_[index].stored_len == 0) return;
  (void)env_->Fadvise(fd_.get(), chunks_[index].offset, chunks_[index].stored_len, POSIX_FADV_WILLNEED);
}

Status PackReader::VerifyAll(BaseSource* bases) const {
  std::vector<uint8_t> buf;
  for (uint64_t i = 0; i < chunks_.size(); ++i) RETURN_IF_ERROR(ReadChunk(i, &buf, bases));
  return Status::Ok();
}

}  // namespace ckptfs
