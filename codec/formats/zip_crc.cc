#include "codec/formats/zip_crc.h"

#include <zlib.h>

#include <algorithm>
#include <limits>

namespace ckptfs::formats {
namespace {

// Byte by byte because a field may straddle chunks; offsets near 2^64 in a
// hostile layout must not wrap into the chunk.
void PatchField(uint64_t chunk_offset, std::span<uint8_t> chunk, uint64_t field, uint32_t crc) {
  for (uint64_t i = 0; i < 4; ++i) {
    uint64_t at = field + i;
    if (at < field) return;
    if (at < chunk_offset || at - chunk_offset >= chunk.size()) continue;
    chunk[at - chunk_offset] = static_cast<uint8_t>(crc >> (8 * i));
  }
}

}  // namespace

uint32_t Crc32(std::span<const uint8_t> data, uint32_t crc) {
  // zlib answers a null buffer with the initial value, dropping `crc`.
  if (data.empty()) return crc;
  return static_cast<uint32_t>(crc32_z(crc, data.data(), data.size()));
}

void PatchCrcFields(uint64_t chunk_offset, std::span<uint8_t> chunk, std::span<const ZipCrcField> fields,
                    std::span<const uint32_t> crcs) {
  size_t n = std::min(fields.size(), crcs.size());
  for (size_t i = 0; i < n; ++i) {
    for (uint64_t off : fields[i].field_offsets) PatchField(chunk_offset, chunk, off, crcs[i]);
  }
}

ZipCrcTracker::ZipCrcTracker(std::span<const ZipCrcField> fields) {
  members_.reserve(fields.size());
  for (const ZipCrcField& f : fields) {
    Member m;
    m.begin = m.next = f.data_offset;
    // A range running past 2^64 cannot be fed; mark it rather than wrap.
    m.gap = f.data_length > std::numeric_limits<uint64_t>::max() - f.data_offset;
    m.end = m.gap ? m.next : f.data_offset + f.data_length;
    members_.push_back(m);
  }
}

void ZipCrcTracker::Fold(Member* m, uint64_t abs_offset, std::span<const uint8_t> bytes) {
  uint64_t end = abs_offset + std::min<uint64_t>(bytes.size(), std::numeric_limits<uint64_t>::max() - abs_offset);
  uint64_t lo = std::max(abs_offset, m->next), hi = std::min(end, m->end);
  if (m->gap || lo >= hi) return;
  if (lo > m->next) {
    m->gap = true;
    return;
  }
  m->crc = Crc32(bytes.subspan(lo - abs_offset, hi - lo), m->crc);
  m->next = hi;
}

void ZipCrcTracker::Feed(uint64_t abs_offset, std::span<const uint8_t> bytes) {
  uint64_t end = abs_offset + std::min<uint64_t>(bytes.size(), std::numeric_limits<uint64_t>::max() - abs_offset);
  while (first_live_ < members_.size() && members_[first_live_].end <= abs_offset) ++first_live_;
  // Members are sorted and disjoint, so the scan stops at the first one
  // starting past this call's bytes.
  for (size_t i = first_live_; i < members_.size() && members_[i].begin < end; ++i) {
    Fold(&members_[i], abs_offset, bytes);
  }
}

bool ZipCrcTracker::Complete() const {
  return std::all_of(members_.begin(), members_.end(), [](const Member& m) { return !m.gap && m.next == m.end; });
}

std::vector<uint32_t> ZipCrcTracker::Crcs() const {
  std::vector<uint32_t> out;
  out.reserve(members_.size());
  for (const Member& m : members_) out.push_back(m.crc);
  return out;
}

}  // namespace ckptfs::formats
