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
#include "base/le.h"
#include "codec/delta_chunk.h"
#include "codec/lossy/lossy_chunk.h"

namespace ckptfs {
namespace {

// The field offsets the pack reader and writer share (pack_format.h).
using namespace pack_layout;

constexpr uint64_t kReadWholeBelow = 8u << 20;

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
// thread at most, instead of an allocation per read. Aligned, so that a
// direct read (store/direct_read.h) lands in it without a bounce buffer.
AlignedBuffer& ScratchBuffer() {
  thread_local AlignedBuffer buf;
  return buf;
}

}  // namespace

namespace {

// Corruption errors about one pack: "<ctx>: <what>".
auto CorruptionIn(const std::string& ctx) {
  return [&ctx](const std::string& what) { return Status::Corruption(ctx + ": " + what); };
}

// The header, checked on its own: magic, checksum, a version this build
// reads, and fields that agree with each other.
Result<PackHeader> ReadPackHeader(const PackBytes& src, const std::string& ctx) {
  const auto corrupt = CorruptionIn(ctx);
  std::array<uint8_t, kPackHeaderSize> hdr;
  if (Status s = src.ReadExact(hdr, 0); !s.ok()) return s.WithContext(ctx);
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
  h.flags = le::Get32(hdr, kHdrFlags);
  if ((h.flags & ~kPackKnownFlags) != 0) return corrupt("unknown header flags");
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
Result<ChunkTable> ReadChunkTable(const PackBytes& src, uint64_t size, const PackHeader& h, const std::string& ctx) {
  const auto corrupt = CorruptionIn(ctx);
  std::array<uint8_t, kPackFooterSize> ft;
  if (Status s = src.ReadExact(ft, size - kPackFooterSize); !s.ok()) return s.WithContext(ctx);
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
  if (Status s = src.ReadExact(table.bytes, table_offset); !s.ok()) return s.WithContext(ctx);
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
void ReadMetaBlock(const PackBytes& src, const PackHeader& h, const std::string& ctx, PackMeta* meta,
                   Status* meta_status) {
  if (h.version < 3) return;
  std::vector<uint8_t> mb(h.meta_len);
  if (Status s = src.ReadExact(mb, h.meta_offset); !s.ok()) {
    *meta_status = s.WithContext(ctx + ": meta block");
  } else if (Result<PackMeta> m = DecodePackMeta(mb, h.chunk_count); !m.ok()) {
    *meta_status = m.status().WithContext(ctx + ": meta block");
  } else {
    *meta = std::move(m).value();
  }
}

}  // namespace

Result<std::shared_ptr<PackReader>> PackReader::Open(std::unique_ptr<PackBytes> source, std::string name) {
  const std::string ctx = "pack " + name;
  const auto corrupt = CorruptionIn(ctx);

  Result<uint64_t> st = source->Size();
  if (!st.ok()) return st.status().WithContext(ctx);
  const uint64_t size = *st;
  if (size < kPackHeaderSize + kPackFooterSize) {
    return corrupt("file is " + std::to_string(size) + " bytes, too short for a header and footer");
  }
  ASSIGN_OR_RETURN(const PackHeader h, ReadPackHeader(*source, ctx));
  ASSIGN_OR_RETURN(const ChunkTable table, ReadChunkTable(*source, size, h, ctx));
  ASSIGN_OR_RETURN(std::vector<ChunkEntry> chunks, DecodeChunkTable(h, table, ctx));
  PackMeta meta;
  Status meta_status = Status::Ok();
  ReadMetaBlock(*source, h, ctx, &meta, &meta_status);

  // A small pack (a delta or a file of references) is read whole up front:
  // otherwise every chunk's few stored bytes cost a disk round trip of their own.
  const uint64_t payload_end = PayloadEnd(h, table);
  if (payload_end <= kReadWholeBelow) source->Prefetch(0, payload_end);
  std::shared_ptr<PackReader> r(new PackReader(std::move(source), std::move(name)));
  r->header_ = h;
  r->chunks_ = std::move(chunks);
  r->meta_ = std::move(meta);
  r->meta_status_ = std::move(meta_status);
  r->stored_size_ = size;
  r->ahead_ = std::make_unique<ChunkReadAhead>(r->source_.get(), r->chunks_.size());
  return r;
}

Status BaseSource::UsePackRange(ObjectId pack, uint64_t offset, uint64_t len,
                                const std::function<Status(std::span<const uint8_t>)>& use) {
  std::vector<uint8_t> bytes(len);
  RETURN_IF_ERROR(ReadPackRange(pack, offset, bytes));
  return use(bytes);
}

Status BaseSource::ReadBaseWindow(ObjectId pack, uint64_t offset, std::span<uint8_t> out, bool once) {
  const uint64_t lead = BaseWindowLead(offset);
  if (lead == 0) return once ? ReadPackRangeOnce(pack, offset, out) : ReadPackRange(pack, offset, out);
  if (lead >= out.size()) {
    return Status::Corruption("base window of " + std::to_string(out.size()) + " bytes starts " + std::to_string(lead) +
                              " bytes before pack " + ObjectIdHex(pack));
  }
  std::fill_n(out.begin(), lead, uint8_t{0});
  return once ? ReadPackRangeOnce(pack, 0, out.subspan(lead)) : ReadPackRange(pack, 0, out.subspan(lead));
}

Status PackReader::ReadChunk(uint64_t index, std::vector<uint8_t>* out, BaseSource* bases) const {
  if (index < chunks_.size()) out->resize(chunks_[index].raw_len);
  Status s = ReadChunkInto(index, *out, bases);
  if (!s.ok()) out->clear();  // never hand back bytes that failed verification
  return s;
}

Status PackReader::ReadChunkInto(uint64_t index, std::span<uint8_t> out, BaseSource* bases) const {
  if (index >= chunks_.size()) {
    return Status::InvalidArgument("pack " + name_ + ": chunk " + std::to_string(index) + " out of range (" +
                                   std::to_string(chunks_.size()) + " chunks)");
  }
  const ChunkEntry& e = chunks_[index];
  const std::string ctx = "pack " + name_ + ": chunk " + std::to_string(index) + " (offset " +
                          std::to_string(index * header_.chunk_size) + ")";
  if (out.size() != e.raw_len) {
    return Status::InvalidArgument(ctx + ": buffer of " + std::to_string(out.size()) + " bytes for " +
                                   std::to_string(e.raw_len));
  }
  // Chunks stored against a base read that base first, which may recurse
  // into this thread's scratch buffer: they keep their payload locally.
  const bool needs_base = StoredAgainstBase(e.codec);
  AlignedBuffer local;
  Result<std::span<const uint8_t>> read = ReadStored(index, needs_base ? local : ScratchBuffer());
  if (!read.ok()) return read.status().WithContext(ctx);
  const std::span<const uint8_t> stored = *read;
  if (!ChecksumMatches(Checksum64(stored, kSeedChunkStored ^ index), e.stored_checksum)) {
    return Status::Corruption(ctx + ": stored checksum mismatch");
  }
  Status decoded = needs_base ? DecodeAgainstBase(e.codec, stored, out, bases) : DecodeChunk(e.codec, stored, out);
  if (!decoded.ok()) return decoded.WithContext(ctx);
  // A hole (kPackFlagHoles) is zeros by its table entry: nothing to check.
  if (e.codec == ChunkCodec::kZero && (header_.flags & kPackFlagHoles) != 0) return Status::Ok();
  if (!ChecksumMatches(Checksum64(out, kSeedChunkRaw ^ index), e.raw_checksum)) {
    return Status::Corruption(ctx + ": raw checksum mismatch");
  }
  return Status::Ok();
}

namespace {

// A delta or lossy chunk's payload against its base bytes.
Status DecodeWithBase(ChunkCodec codec, std::span<const uint8_t> payload, std::span<const uint8_t> base,
                      std::span<uint8_t> out) {
  if (codec == ChunkCodec::kLossy) return lossy::DecodeLossyChunk(payload, base, out);
  return DecodeDeltaChunk(payload, base, out);
}

}  // namespace

Status PackReader::DecodeAgainstBase(ChunkCodec codec, std::span<const uint8_t> stored, std::span<uint8_t> out,
                                     BaseSource* bases) const {
  const ObjectId base = le::Get64(stored, 0);
  if (codec == ChunkCodec::kLossy && base == 0) {
    return lossy::DecodeLossyChunk(stored.subspan(kBaseRefSize), {}, out).WithContext("lossy keyframe chunk");
  }
  if (bases == nullptr)
    return Status::InvalidArgument("chunk is stored against another pack; no store to read it from");
  const uint64_t off = le::Get64(stored, 8);
  // Before version 5 such an offset is past any pack, and the read fails.
  const bool leads = header_.version >= kPackLeadingBaseVersion && BaseWindowLeads(off);
  const std::string what = std::string(ChunkCodecName(codec)) + " chunk against pack " + ObjectIdHex(base) +
                           " offset " + (leads ? "-" + std::to_string(BaseWindowLead(off)) : std::to_string(off));
  const std::span<const uint8_t> payload = stored.subspan(kBaseRefSize);
  if (leads) {
    if (codec == ChunkCodec::kRef) return bases->ReadBaseWindow(base, off, out).WithContext(what);
    // Rare (a file whose tensors all moved back): the window is a copy.
    std::vector<uint8_t> window(out.size());
    RETURN_IF_ERROR(bases->ReadBaseWindow(base, off, window).WithContext(what));
    return DecodeWithBase(codec, payload, window, out).WithContext(what);
  }
  if (codec == ChunkCodec::kRef) return bases->ReadPackRange(base, off, out).WithContext(what);
  return bases
      ->UsePackRange(
          base, off, out.size(),
          [&](std::span<const uint8_t> base_bytes) { return DecodeWithBase(codec, payload, base_bytes, out); })
      .WithContext(what);
}

Result<std::pair<ObjectId, uint64_t>> PackReader::ChunkBase(uint64_t index) const {
  if (index >= chunks_.size()) return Status::InvalidArgument("chunk index out of range");
  const ChunkEntry& e = chunks_[index];
  if (!StoredAgainstBase(e.codec)) return Status::Error(ENOENT, "chunk has no base");
  std::array<uint8_t, kBaseRefSize> ref;
  RETURN_IF_ERROR(source_->ReadExact(ref, e.offset));
  if (le::Get64(ref, 0) == 0) return Status::Error(ENOENT, "lossy keyframe chunk has no base");
  return std::make_pair(le::Get64(ref, 0), le::Get64(ref, 8));
}

Result<std::span<const uint8_t>> PackReader::ReadStored(uint64_t index, AlignedBuffer& buf) const {
  const ChunkEntry& e = chunks_[index];
  const std::span<uint8_t> room = buf.Get(source_->RoomFor(e.stored_len));
  if (room.empty() && e.stored_len > 0) {
    return Status::Error(ENOMEM, "no memory for " + std::to_string(e.stored_len) + " stored bytes");
  }
  if (ahead_->TakeInto(index, room.first(e.stored_len))) return std::span<const uint8_t>(room.first(e.stored_len));
  return source_->ReadIn(room, e.offset, e.stored_len);
}

void PackReader::ReadAhead(uint64_t index) const {
  if (index >= chunks_.size() || chunks_[index].stored_len == 0) return;
  ahead_->Start(index, chunks_[index].offset, chunks_[index].stored_len);
}

void PackReader::Prefetch(uint64_t index) const {
  if (index >= chunks_.size() || chunks_[index].stored_len == 0) return;
  source_->Prefetch(chunks_[index].offset, chunks_[index].stored_len);
}

Status PackReader::VerifyAll(BaseSource* bases) const {
  std::vector<uint8_t> buf;
  for (uint64_t i = 0; i < chunks_.size(); ++i) RETURN_IF_ERROR(ReadChunk(i, &buf, bases));
  return Status::Ok();
}

}  // namespace ckptfs
