#include "codec/formats/torch.h"

#include <algorithm>
#include <unordered_map>

#include "codec/formats/limits.h"
#include "codec/formats/pickle_scan.h"
#include "base/le.h"

namespace ckptfs::formats {
namespace {

constexpr uint8_t kLegacyMagic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
constexpr uint64_t kMaxArchives = 1u << 16;

// "<archive>/data.pkl" where <archive> has no slash; returns the prefix
// including the slash.
std::optional<std::string> ArchivePrefix(const ZipArchive& z) {
  static constexpr std::string_view kPkl = "/data.pkl";
  for (const ZipEntry& e : z.entries) {
    const std::string& n = e.name;
    if (n.size() > kPkl.size() && n.ends_with(kPkl) && n.find('/') == n.size() - kPkl.size()) {
      return n.substr(0, n.size() - kPkl.size() + 1);
    }
  }
  return std::nullopt;
}

const ZipEntry* FindEntry(const ZipArchive& z, const std::string& name) {
  for (const ZipEntry& e : z.entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

using RefMap = std::unordered_map<std::string, StorageRef>;

// Storage dtypes come from data.pkl. If it cannot be read the records are
// still storages, just of unknown type, so this only adds a note.
// What the pickle says about the whole file (optimizer state, parameter
// names) goes to `facts`.
RefMap ScanDataPkl(const ByteSource& src, const ZipArchive& z, const std::string& prefix, std::string* note,
                   FileLayout* facts) {
  RefMap refs;
  const ZipEntry* pkl = FindEntry(z, prefix + "data.pkl");
  if (pkl->method != 0) {
    *note += (note->empty() ? "" : "; ") + std::string("data.pkl is compressed; storage dtypes unknown");
    return refs;
  }
  auto bytes = ReadBounded(src, pkl->data_offset, pkl->comp_size, "data.pkl");
  auto scan = bytes.ok() ? ScanPickle(*bytes) : Result<PickleScan>(bytes.status());
  if (!scan.ok()) {
    *note +=
        (note->empty() ? "" : "; ") + ("data.pkl unreadable (" + scan.status().message() + "); storage dtypes unknown");
    return refs;
  }
  for (StorageRef& s : scan->storages) refs.emplace(s.key, std::move(s));
  facts->optimizer_state |= scan->optimizer_state;
  facts->param_names.insert(facts->param_names.end(), scan->param_names.begin(), scan->param_names.end());
  facts->state_names.insert(facts->state_names.end(), scan->state_names.begin(), scan->state_names.end());
  facts->group_lrs.insert(facts->group_lrs.end(), scan->group_lrs.begin(), scan->group_lrs.end());
  facts->group_eps.insert(facts->group_eps.end(), scan->group_eps.begin(), scan->group_eps.end());
  return refs;
}

// The pickle's shape when it describes exactly the region's elements, else
// one flat dimension.
std::vector<uint64_t> ShapeOf(const TensorRegion& r, const StorageRef* ref) {
  const uint64_t n = r.length / DTypeSize(r.dtype);
  if (ref == nullptr || ref->shape.empty() || ref->dtype != r.dtype) return {n};
  uint64_t product = 1;
  for (uint64_t d : ref->shape) {
    auto p = CheckedMul(product, d);
    if (!p) return {n};
    product = *p;
  }
  return product == n ? ref->shape : std::vector<uint64_t>{n};
}

// A record's dtype holds only if its size matches what the pickle says.
TensorRegion RecordRegion(const ZipEntry& e, const StorageRef* ref) {
  TensorRegion r;
  r.name = e.name;
  r.offset = e.data_offset;
  r.length = e.comp_size;
  r.dtype = DType::kU8;
  if (ref && ref->dtype != DType::kUnknown && ref->elsize != 0) {
    auto want = CheckedMul(ref->numel, ref->elsize);
    unsigned es = DTypeSize(ref->dtype);
    if (want && *want == e.comp_size && es != 0 && e.comp_size % es == 0) r.dtype = ref->dtype;
  }
  if (ref) {
    r.label = ref->label;
    r.order = ref->index;
    r.module_entry = ref->module_entry;
    r.optimizer_entry = ref->optimizer_entry;
  }
  r.shape = ShapeOf(r, ref);
  return r;
}

Status AppendArchiveRegions(const ByteSource& src, const ZipArchive& z, std::vector<TensorRegion>* out,
                            std::string* note, FileLayout* facts) {
  std::optional<std::string> prefix = ArchivePrefix(z);
  if (!prefix) return Malformed("zip has no <archive>/data.pkl");
  RefMap refs = ScanDataPkl(src, z, *prefix, note, facts);
  const std::string data_dir = *prefix + "data/";
  size_t skipped = 0;
  for (const ZipEntry& e : z.entries) {
    if (!e.name.starts_with(data_dir) || e.name.size() == data_dir.size() || e.comp_size == 0) continue;
    if (e.method != 0 || e.comp_size != e.uncomp_size) {
      ++skipped;
      continue;
    }
    if (out->size() >= kMaxEntries) return Malformed("too many storages");
    auto it = refs.find(e.name.substr(data_dir.size()));
    out->push_back(RecordRegion(e, it == refs.end() ? nullptr : &it->second));
  }
  if (skipped) *note += (note->empty() ? "" : "; ") + std::to_string(skipped) + " compressed records kept as metadata";
  return Status::Ok();
}

// --- legacy format

// Scans the five leading pickles from a prefix of the file, growing the
// prefix while the pickles run past it.
Result<std::vector<PickleScan>> ScanLegacyPickles(const ByteSource& src) {
  uint64_t cap = std::min<uint64_t>(src.size(), kMaxMetadataBytes);
  for (uint64_t window = std::min<uint64_t>(cap, 1 << 20);; window = std::min(cap, window * 4)) {
    ASSIGN_OR_RETURN(std::vector<uint8_t> head, ReadBounded(src, 0, window, "legacy pickles"));
    std::vector<PickleScan> scans;
    uint64_t pos = 0;
    Status st;
    while (scans.size() < 5) {
      auto r = ScanPickle(std::span<const uint8_t>(head).subspan(pos));
      if (!r.ok()) {
        st = r.status();
        break;
      }
      pos += r->end;
      r->end = pos;
      scans.push_back(std::move(r).value());
    }
    if (scans.size() == 5) return scans;
    if (st.code() != ENODATA || window == cap) return st;
  }
}

}  // namespace

bool IsTorchArchive(const ZipArchive& z) { return ArchivePrefix(z).has_value(); }

Result<FileLayout> ParseTorchZip(const ByteSource& src, const ZipArchive& z) {
  FileLayout l;
  l.format = "torch-zip";
  RETURN_IF_ERROR(AppendArchiveRegions(src, z, &l.tensors, &l.note, &l));
  AppendZipCrcFields(z, l.tensors, &l.zip_crcs);
  SortZipCrcFields(&l.zip_crcs);
  return l;
}

Result<FileLayout> ParseDcp(const ByteSource& src) {
  FileLayout l;
  uint64_t end = src.size();
  uint64_t archives = 0;
  while (end > 0 && archives < kMaxArchives && HasEocdEndingAt(src, end)) {
    size_t first_tensor = l.tensors.size();
    auto z = ReadZip(src, end, /*allow_comment=*/false);
    Status st = z.ok() ? AppendArchiveRegions(src, *z, &l.tensors, &l.note, &l) : z.status();
    if (!st.ok()) {
      // The last archive must parse; an earlier failure means the EOCD-like
      // bytes belong to a BYTE_IO item, which stays metadata.
      if (archives == 0) return st;
      break;
    }
    AppendZipCrcFields(*z, std::span(l.tensors).subspan(first_tensor), &l.zip_crcs);
    ++archives;
    end = z->base;
  }
  if (archives == 0) return Malformed("no torch archive at end of file");
  SortZipCrcFields(&l.zip_crcs);
  l.format = (archives == 1 && end == 0) ? "torch-zip" : "dcp";
  return l;
}

bool LooksLikeLegacyTorch(std::span<const uint8_t> head) {
  return head.size() >= sizeof(kLegacyMagic) &&
         std::equal(std::begin(kLegacyMagic), std::end(kLegacyMagic), head.begin());
}

// After the pickles: for each key of the fifth pickle, an int64 LE element
// count and then the storage's bytes, back to back.
Result<FileLayout> ParseTorchLegacy(const ByteSource& src) {
  ASSIGN_OR_RETURN(std::vector<PickleScan> scans, ScanLegacyPickles(src));
  std::unordered_map<std::string, const StorageRef*> refs;
  for (const StorageRef& s : scans[3].storages) refs.emplace(s.key, &s);
  const std::vector<std::string>& keys = scans[4].str_list;
  if (keys.size() != refs.size()) return Malformed("legacy torch: key list does not match storages");
  FileLayout l;
  l.format = "torch-legacy";
  l.optimizer_state = scans[3].optimizer_state;
  l.param_names = scans[3].param_names;
  l.state_names = scans[3].state_names;
  l.group_lrs = scans[3].group_lrs;
  l.group_eps = scans[3].group_eps;
  uint64_t pos = scans[4].end;
  for (const std::string& key : keys) {
    auto it = refs.find(key);
    if (it == refs.end()) return Malformed("legacy torch: key without storage: " + key);
    const StorageRef& ref = *it->second;
    uint8_t hdr[8];
    if (!InRange(pos, 8, src.size())) return Malformed("legacy torch: truncated before storage " + key);
    RETURN_IF_ERROR(src.ReadAt(pos, hdr));
    uint64_t numel = le::Get64(hdr, 0);
    auto nbytes = CheckedMul(numel, ref.elsize);
    if (ref.elsize == 0 || !nbytes || !InRange(pos + 8, *nbytes, src.size())) {
      return Malformed("legacy torch: storage " + key + " extends past end of file");
    }
    TensorRegion r;
    r.name = key;
    r.dtype = ref.dtype == DType::kUnknown || *nbytes % DTypeSize(ref.dtype) != 0 ? DType::kU8 : ref.dtype;
    r.offset = pos + 8;
    r.length = *nbytes;
    r.shape = ShapeOf(r, &ref);
    r.label = ref.label;
    r.order = ref.index;
    r.module_entry = ref.module_entry;
    r.optimizer_entry = ref.optimizer_entry;
    if (r.length > 0) l.tensors.push_back(std::move(r));
    pos += 8 + *nbytes;
  }
  return l;
}

}  // namespace ckptfs::formats
