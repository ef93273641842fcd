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
    m.begin = f.data_offset;
    // A range running past 2^64 cannot be fed; mark it rather than wrap.
    m.gap = f.data_length > std::numeric_limits<uint64_t>::max() - f.data_offset;
    m.end = m.gap ? m.begin : f.data_offset + f.data_length;
    members_.push_back(std::move(m));
  }
}

// Adds the parts of [lo, hi) that no piece covers yet, so that bytes fed
// twice count once. Called with mu_ held.
void ZipCrcTracker::AddUncovered(Member* m, uint64_t lo, uint64_t hi, uint64_t abs_offset,
                                 std::span<const uint8_t> bytes) {
  auto it = m->pieces.upper_bound(lo);
  if (it != m->pieces.begin() && std::prev(it)->second.end > lo) lo = std::prev(it)->second.end;
  while (lo < hi) {
    const uint64_t stop = it == m->pieces.end() ? hi : std::min(hi, it->first);
    if (stop > lo) m->pieces[lo] = Piece{stop, Crc32(bytes.subspan(lo - abs_offset, stop - lo))};
    if (it == m->pieces.end()) break;
    lo = std::max(lo, it->second.end);
    ++it;
  }
}

void ZipCrcTracker::Fold(Member* m, uint64_t abs_offset, std::span<const uint8_t> bytes) {
  const uint64_t end = abs_offset + std::min<uint64_t>(bytes.size(), std::numeric_limits<uint64_t>::max() - abs_offset);
  const uint64_t lo = std::max(abs_offset, m->begin), hi = std::min(end, m->end);
  if (m->gap || lo >= hi) return;
  // The common case, a piece that overlaps nothing fed yet, is checksummed
  // outside the lock, so workers feed at the same time.
  const uint32_t crc = Crc32(bytes.subspan(lo - abs_offset, hi - lo));
  std::lock_guard lock(mu_);
  auto next = m->pieces.lower_bound(lo);
  const bool clear_after = next == m->pieces.end() || next->first >= hi;
  const bool clear_before = next == m->pieces.begin() || std::prev(next)->second.end <= lo;
  if (clear_after && clear_before) {
    m->pieces.emplace(lo, Piece{hi, crc});
  } else {
    AddUncovered(m, lo, hi, abs_offset, bytes);
  }
}

void ZipCrcTracker::Feed(uint64_t abs_offset, std::span<const uint8_t> bytes) {
  const uint64_t end = abs_offset + std::min<uint64_t>(bytes.size(), std::numeric_limits<uint64_t>::max() - abs_offset);
  // Members are sorted and disjoint: the first that ends past this call's
  // bytes, then on until one starts past them.
  auto first =
      std::partition_point(members_.begin(), members_.end(), [&](const Member& m) { return m.end <= abs_offset; });
  for (auto m = first; m != members_.end() && m->begin < end; ++m) Fold(&*m, abs_offset, bytes);
}

bool ZipCrcTracker::Covered(const Member& m) {
  if (m.gap) return false;
  uint64_t next = m.begin;
  for (const auto& [begin, p] : m.pieces) {
    if (begin != next) return false;
    next = p.end;
  }
  return next == m.end;
}

uint32_t ZipCrcTracker::Combined(const Member& m) {
  uLong crc = 0;
  for (const auto& [begin, p] : m.pieces) crc = crc32_combine(crc, p.crc, static_cast<z_off_t>(p.end - begin));
  return static_cast<uint32_t>(crc);
}

bool ZipCrcTracker::Complete() const {
  std::lock_guard lock(mu_);
  return std::all_of(members_.begin(), members_.end(), Covered);
}

std::vector<uint32_t> ZipCrcTracker::Crcs() const {
  std::lock_guard lock(mu_);
  std::vector<uint32_t> out;
  out.reserve(members_.size());
  for (const Member& m : members_) out.push_back(Combined(m));
  return out;
}

std::optional<uint32_t> ZipCrcTracker::Crc(size_t i) const {
  std::lock_guard lock(mu_);
  if (i >= members_.size() || !Covered(members_[i])) return std::nullopt;
  return Combined(members_[i]);
}

}  // namespace ckptfs::formats
