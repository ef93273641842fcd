#include "store/usage_xattrs.h"

#include <algorithm>
#include <array>

#include "codec/chunk_codec.h"
#include "store/object_id.h"

namespace ckptfs {
namespace {

constexpr std::array<std::string_view, 7> kFields = {"state", "logical", "stored", "depth", "pack", "base", "codecs"};

std::string Codecs(const FileUsage& u) {
  std::string out;
  for (const CodecUsage& c : u.codecs) {
    if (!out.empty()) out += ' ';
    out += std::string(ChunkCodecName(c.codec)) + ':' + std::to_string(c.chunks) + ':' + std::to_string(c.raw) + ':' +
           std::to_string(c.stored);
  }
  return out;
}

}  // namespace

bool IsUsageXattr(std::string_view name) {
  if (name == kEffectivePolicyXattr) return true;
  if (!name.starts_with(kUsageXattrPrefix)) return false;
  name.remove_prefix(kUsageXattrPrefix.size());
  return std::find(kFields.begin(), kFields.end(), name) != kFields.end();
}

std::optional<std::string> UsageXattr(const FileUsage& u, std::string_view name) {
  if (!name.starts_with(kUsageXattrPrefix)) return std::nullopt;
  name.remove_prefix(kUsageXattrPrefix.size());
  if (name == "state") return u.staged ? "staged" : "sealed";
  if (name == "logical") return std::to_string(u.logical);
  if (name == "stored") return std::to_string(u.stored);
  if (name == "depth") return std::to_string(u.depth);
  if (u.staged) return std::nullopt;
  if (name == "pack" && u.pack != 0) return ObjectIdHex(u.pack);
  if (name == "base" && u.base != 0) return ObjectIdHex(u.base);
  if (name == "codecs") return Codecs(u);
  return std::nullopt;
}

}  // namespace ckptfs
