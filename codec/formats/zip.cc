#include "codec/formats/zip.h"

#include <algorithm>
#include <array>
#include <optional>

#include "codec/formats/limits.h"
#include "base/le.h"

namespace ckptfs::formats {
namespace {

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEocdSig = 0x06054b50;
constexpr uint32_t kZip64EocdSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr uint32_t kDescriptorSig = 0x08074b50;
constexpr uint64_t kEocdSize = 22;
constexpr uint64_t kLocatorSize = 20;
constexpr uint64_t kZip64EocdSize = 56;
constexpr uint64_t kCentralSize = 46;
constexpr uint64_t kLocalSize = 30;
constexpr uint64_t kLocalCrcField = 14;
constexpr uint64_t kCentralCrcField = 16;

struct Eocd {
  uint64_t pos = 0;  // absolute offset of the EOCD (or zip64 EOCD) record
  uint64_t entries = 0;
  uint64_t cd_size = 0;
  uint64_t cd_offset = 0;           // relative to the archive base
  std::optional<uint64_t> z64_rel;  // locator's archive-relative offset of the zip64 EOCD
};

Result<Eocd> ReadEocdAt(const ByteSource& src, uint64_t pos) {
  std::array<uint8_t, kEocdSize> b;
  RETURN_IF_ERROR(src.ReadAt(pos, b));
  if (le::Get32(b, 0) != kEocdSig) return Malformed("zip: no end of central directory");
  if (le::Get16(b, 4) != 0 || le::Get16(b, 6) != 0) return Malformed("zip: multi-disk archive");
  Eocd e;
  e.pos = pos;
  e.entries = le::Get16(b, 10);
  e.cd_size = le::Get32(b, 12);
  e.cd_offset = le::Get32(b, 16);
  return e;
}

// Replaces the 16/32-bit EOCD fields by the zip64 record when a locator
// precedes the EOCD. Torch always writes one, even for tiny files.
Result<Eocd> ApplyZip64(const ByteSource& src, Eocd e) {
  if (e.pos < kLocatorSize + kZip64EocdSize) return e;
  std::array<uint8_t, kLocatorSize> loc;
  RETURN_IF_ERROR(src.ReadAt(e.pos - kLocatorSize, loc));
  if (le::Get32(loc, 0) != kZip64LocatorSig) return e;
  // The locator's offset is archive-relative; the record itself normally
  // sits right before the locator, which is what we read.
  uint64_t z64pos = e.pos - kLocatorSize - kZip64EocdSize;
  std::array<uint8_t, kZip64EocdSize> z;
  RETURN_IF_ERROR(src.ReadAt(z64pos, z));
  if (le::Get32(z, 0) != kZip64EocdSig) return Malformed("zip: zip64 locator without adjacent zip64 EOCD");
  if (le::Get64(z, 4) != kZip64EocdSize - 12) return Malformed("zip: zip64 EOCD with extensible data");
  Eocd r;
  r.pos = z64pos;
  r.entries = le::Get64(z, 32);
  r.cd_size = le::Get64(z, 40);
  r.cd_offset = le::Get64(z, 48);
  r.z64_rel = le::Get64(loc, 8);
  return r;
}

Result<uint64_t> FindEocd(const ByteSource& src, uint64_t end, bool allow_comment) {
  if (end < kEocdSize) return Malformed("zip: too small");
  if (!allow_comment) return end - kEocdSize;
  // A comment is at most 64 KiB; scan backwards for a signature whose
  // comment length reaches exactly to `end`.
  uint64_t span = std::min<uint64_t>(end, kEocdSize + 0xFFFF);
  ASSIGN_OR_RETURN(std::vector<uint8_t> tail, ReadBounded(src, end - span, span, "zip tail"));
  for (uint64_t i = span - kEocdSize + 1; i-- > 0;) {
    if (le::Get32(tail, i) == kEocdSig && i + kEocdSize + le::Get16(tail, i + 20) == span) return end - span + i;
  }
  return Malformed("zip: no end of central directory");
}

// Fields the central directory stores as 0xFFFF.. live in the zip64 extra
// (id 1), in a fixed order, present only for the saturated ones.
Status ApplyZip64Extra(std::span<const uint8_t> extra, uint64_t* uncomp, uint64_t* comp, uint64_t* local) {
  size_t i = 0;
  while (i + 4 <= extra.size()) {
    uint16_t id = le::Get16(extra, i), len = le::Get16(extra, i + 2);
    if (i + 4 + len > extra.size()) return Malformed("zip: extra field overruns");
    if (id == 1) {
      auto body = extra.subspan(i + 4, len);
      size_t p = 0;
      for (uint64_t* v : {uncomp, comp, local}) {
        if (*v != 0xFFFFFFFFu) continue;
        if (p + 8 > body.size()) return Malformed("zip: short zip64 extra");
        *v = le::Get64(body, p);
        p += 8;
      }
      return Status::Ok();
    }
    i += 4 + len;
  }
  if (*uncomp == 0xFFFFFFFFu || *comp == 0xFFFFFFFFu || *local == 0xFFFFFFFFu) {
    return Malformed("zip: saturated size without zip64 extra");
  }
  return Status::Ok();
}

// Data starts after the *local* header's name and extra, which differ from
// the central directory's (torch pads with an 'FB' extra only locally).
Result<uint64_t> LocalDataOffset(const ByteSource& src, uint64_t local_abs, uint64_t limit) {
  std::array<uint8_t, kLocalSize> h;
  if (!InRange(local_abs, kLocalSize, limit)) return Malformed("zip: local header outside archive");
  RETURN_IF_ERROR(src.ReadAt(local_abs, h));
  if (le::Get32(h, 0) != kLocalSig) return Malformed("zip: bad local header signature");
  return local_abs + kLocalSize + le::Get16(h, 26) + le::Get16(h, 28);
}

// The descriptor's signature is optional, so which 4 bytes hold its CRC is
// decided by matching the central directory's CRC. A descriptor repeating
// neither is left alone: zip readers take the CRC from the directory.
std::optional<uint64_t> DescriptorCrcOffset(const ByteSource& src, uint64_t data_end, uint64_t limit, uint32_t crc) {
  if (!InRange(data_end, 4, limit)) return std::nullopt;
  std::array<uint8_t, 8> b{};
  bool sig_room = InRange(data_end, 8, limit);
  if (!src.ReadAt(data_end, std::span(b).first(sig_room ? 8 : 4)).ok()) return std::nullopt;
  bool sig = sig_room && le::Get32(b, 0) == kDescriptorSig;
  if (sig && le::Get32(b, 4) == crc) return data_end + 4;
  if (le::Get32(b, 0) == crc) return data_end;
  if (sig) return data_end + 4;
  return std::nullopt;
}

// locals: read each entry's local header for its exact data offset (else
// data_offset is the local header's offset, and no descriptor is looked for).
Result<ZipEntry> ParseCentral(const ByteSource& src, std::span<const uint8_t> cd, size_t* pos, uint64_t base,
                              uint64_t cd_abs, bool locals) {
  size_t p = *pos;
  if (cd.size() - p < kCentralSize || le::Get32(cd, p) != kCentralSig) return Malformed("zip: bad central entry");
  ZipEntry e;
  e.flags = le::Get16(cd, p + 8);
  e.method = le::Get16(cd, p + 10);
  e.crc32 = le::Get32(cd, p + kCentralCrcField);
  e.central_entry_offset = cd_abs + p;
  uint64_t comp = le::Get32(cd, p + 20), uncomp = le::Get32(cd, p + 24), local = le::Get32(cd, p + 42);
  size_t n = le::Get16(cd, p + 28), x = le::Get16(cd, p + 30), c = le::Get16(cd, p + 32);
  if (cd.size() - p - kCentralSize < n + x + c) return Malformed("zip: central entry overruns directory");
  e.name.assign(reinterpret_cast<const char*>(cd.data() + p + kCentralSize), n);
  RETURN_IF_ERROR(ApplyZip64Extra(cd.subspan(p + kCentralSize + n, x), &uncomp, &comp, &local));
  e.comp_size = comp;
  e.uncomp_size = uncomp;
  auto local_abs = CheckedAdd(base, local);
  if (!local_abs) return Malformed("zip: local offset overflows");
  e.local_header_offset = *local_abs;
  e.data_offset = *local_abs;
  if (locals) {
    ASSIGN_OR_RETURN(e.data_offset, LocalDataOffset(src, *local_abs, cd_abs));
  }
  // Entry data must end before the central directory starts.
  if (!InRange(e.data_offset, e.comp_size, cd_abs)) return Malformed("zip: entry data outside archive: " + e.name);
  if (locals && (e.flags & 8))
    e.descriptor_crc_offset = DescriptorCrcOffset(src, e.data_offset + e.comp_size, cd_abs, e.crc32);
  *pos = p + kCentralSize + n + x + c;
  return e;
}

}  // namespace

bool HasEocdEndingAt(const ByteSource& src, uint64_t end) {
  if (end < kEocdSize || end > src.size()) return false;
  std::array<uint8_t, 4> b;
  return src.ReadAt(end - kEocdSize, b).ok() && le::Get32(b, 0) == kEocdSig;
}

namespace {

Result<ZipArchive> ReadZipImpl(const ByteSource& src, uint64_t end, bool allow_comment, bool locals) {
  if (end > src.size()) return Malformed("zip: end past file");
  ASSIGN_OR_RETURN(uint64_t eocd_pos, FindEocd(src, end, allow_comment));
  ASSIGN_OR_RETURN(Eocd e, ReadEocdAt(src, eocd_pos));
  ASSIGN_OR_RETURN(e, ApplyZip64(src, e));
  if (e.entries > kMaxEntries) return Malformed("zip: too many entries");
  if (e.cd_size > e.pos) return Malformed("zip: central directory larger than file");
  if (e.entries * kCentralSize > e.cd_size) return Malformed("zip: central directory too small for its entries");
  // The directory sits right before the EOCD; where it claims to be (an
  // archive-relative offset) then tells where the archive begins.
  uint64_t cd_abs = e.pos - e.cd_size;
  if (e.cd_offset > cd_abs) return Malformed("zip: central directory offset past its position");
  ZipArchive z;
  z.base = cd_abs - e.cd_offset;
  z.end = end;
  if (e.z64_rel && *e.z64_rel != e.pos - z.base) return Malformed("zip: zip64 locator disagrees with layout");
  ASSIGN_OR_RETURN(std::vector<uint8_t> cd, ReadBounded(src, cd_abs, e.cd_size, "zip central directory"));
  z.entries.reserve(e.entries);
  size_t pos = 0;
  for (uint64_t i = 0; i < e.entries; ++i) {
    ASSIGN_OR_RETURN(ZipEntry entry, ParseCentral(src, cd, &pos, z.base, cd_abs, locals));
    z.entries.push_back(std::move(entry));
  }
  return z;
}

}  // namespace

Result<ZipArchive> ReadZip(const ByteSource& src, uint64_t end, bool allow_comment) {
  return ReadZipImpl(src, end, allow_comment, /*locals=*/true);
}

Result<ZipArchive> ReadZipDirectory(const ByteSource& src, uint64_t end) {
  return ReadZipImpl(src, end, /*allow_comment=*/false, /*locals=*/false);
}

void AppendZipCrcFields(const ZipArchive& z, std::span<const TensorRegion> tensors, std::vector<ZipCrcField>* out) {
  std::vector<uint64_t> starts;
  starts.reserve(tensors.size());
  for (const TensorRegion& t : tensors) starts.push_back(t.offset);
  std::sort(starts.begin(), starts.end());
  for (const ZipEntry& e : z.entries) {
    if (e.method != 0 || e.comp_size != e.uncomp_size || e.comp_size == 0) continue;
    auto it = std::lower_bound(starts.begin(), starts.end(), e.data_offset);
    if (it == starts.end() || *it - e.data_offset >= e.comp_size) continue;
    ZipCrcField f{e.data_offset, e.comp_size, {e.central_entry_offset + kCentralCrcField}};
    // With a data descriptor (flag bit 3, as torch writes) the local header's
    // CRC is zero by the spec and stays so: it names no data.
    if ((e.flags & 0x8) == 0) f.field_offsets.push_back(e.local_header_offset + kLocalCrcField);
    if (e.descriptor_crc_offset) f.field_offsets.push_back(*e.descriptor_crc_offset);
    out->push_back(std::move(f));
  }
}

void SortZipCrcFields(std::vector<ZipCrcField>* fields) {
  std::sort(fields->begin(), fields->end(), [](const ZipCrcField& a, const ZipCrcField& b) {
    return a.data_offset != b.data_offset ? a.data_offset < b.data_offset : a.data_length < b.data_length;
  });
  std::vector<ZipCrcField> kept;
  kept.reserve(fields->size());
  for (ZipCrcField& f : *fields) {
    ZipCrcField* last = kept.empty() ? nullptr : &kept.back();
    if (last && last->data_offset == f.data_offset && last->data_length == f.data_length) {
      last->field_offsets.insert(last->field_offsets.end(), f.field_offsets.begin(), f.field_offsets.end());
    } else if (!last || f.data_offset - last->data_offset >= last->data_length) {
      kept.push_back(std::move(f));
    }
  }
  for (ZipCrcField& f : kept) {
    std::sort(f.field_offsets.begin(), f.field_offsets.end());
    f.field_offsets.erase(std::unique(f.field_offsets.begin(), f.field_offsets.end()), f.field_offsets.end());
  }
  *fields = std::move(kept);
}

}  // namespace ckptfs::formats
