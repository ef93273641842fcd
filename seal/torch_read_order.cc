#include "seal/torch_read_order.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <optional>
#include <string_view>
#include <vector>

#include "codec/formats/zip.h"

namespace ckptfs {
namespace {

// n in "<archive>/data/<n>" (digits only, at most 18 of them).
std::optional<uint64_t> StorageKey(std::string_view name) {
  const size_t slash = name.rfind("/data/");
  if (slash == std::string_view::npos) return std::nullopt;
  const std::string_view digits = name.substr(slash + 6);
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  uint64_t key = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), key);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return key;
}

}  // namespace

std::shared_ptr<const ReadOrder> TorchReadOrder(const ByteSource& file) {
  std::array<uint8_t, 4> magic{};
  if (file.size() < 64 || !file.ReadAt(0, magic).ok()) return nullptr;
  if (magic != std::array<uint8_t, 4>{'P', 'K', 3, 4}) return nullptr;
  auto zip = formats::ReadZipDirectory(file, file.size());
  if (!zip.ok()) return nullptr;
  std::vector<formats::ZipEntry>& entries = zip->entries;
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.local_header_offset < b.local_header_offset; });
  struct Keyed {
    uint64_t key;
    ReadOrder::Range range;
  };
  std::vector<Keyed> records;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::optional<uint64_t> key = StorageKey(entries[i].name);
    if (!key) continue;
    // A member reaches to the next one's local header (the last one: its
    // header, name, torch's alignment padding and data).
    const uint64_t begin = entries[i].local_header_offset;
    const uint64_t end =
        i + 1 < entries.size()
            ? entries[i + 1].local_header_offset
            : std::min<uint64_t>(file.size(), begin + 30 + entries[i].name.size() + 64 + 4 + entries[i].comp_size);
    records.push_back(Keyed{*key, {begin, std::max(begin, end)}});
  }
  if (records.size() < 2) return nullptr;
  std::sort(records.begin(), records.end(), [](const Keyed& a, const Keyed& b) { return a.key < b.key; });
  std::vector<ReadOrder::Range> ranges;
  ranges.reserve(records.size());
  for (const Keyed& r : records) ranges.push_back(r.range);
  return std::make_shared<const ReadOrder>(std::move(ranges));
}

}  // namespace ckptfs
