// The read-only extended attributes that say how a file is stored, shown
// through the mount (docs/SEMANTICS.md "Usage attributes"): what
// `ckptfs stats` reports of one file, for programs that can read the mount
// but not the backing store (python/ckptfs). Unlike user.ckptfs.lossy.*,
// listxattr does not list them: they describe this store's copy, so
// `cp --preserve=xattr` and `rsync -X` must not carry them to another one.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "store/store.h"

namespace ckptfs {

// On regular files: user.ckptfs.state, logical, stored, depth, pack, base
// and codecs (below).
inline constexpr std::string_view kUsageXattrPrefix = "user.ckptfs.";
// On directories and files: the policy (codec/lossy/policy.h's text form)
// that a file sealed there now would get, wherever it comes from.
inline constexpr const char* kEffectivePolicyXattr = "user.ckptfs.effective_policy";

// Whether `name` is a usage attribute or kEffectivePolicyXattr: setting or
// removing one through the mount fails with EPERM.
bool IsUsageXattr(std::string_view name);

// The value of usage attribute `name` (IsUsageXattr, not the policy) for a
// file: nothing where it has none (pack and codecs of a staged file, base of
// a file stored on its own). Decimal numbers, pack ids as 16 hex digits, the
// codecs as space-separated NAME:CHUNKS:RAW_BYTES:STORED_BYTES.
std::optional<std::string> UsageXattr(const FileUsage& u, std::string_view name);

}  // namespace ckptfs
