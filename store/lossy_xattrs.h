// The extended attributes of lossy mode (docs/SEMANTICS.md "Lossy mode"):
// the policy a directory sets for its subtree (its text form is
// codec/lossy/policy.h's), and the read-only ones a lossy file shows
// through the mount: its policy and the errors measured when it was sealed,
// from its pack's meta block. In the user namespace, so that
// `cp --preserve=xattr` and `rsync -X` carry them to other file systems.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "codec/lossy/lossy_info.h"

namespace ckptfs {

// On a directory: the lossy policy of the files below it, unless a nearer
// directory has one (Store::PolicyFor).
inline constexpr const char* kPolicyXattr = "user.ckptfs.policy";
inline constexpr std::string_view kLossyXattrPrefix = "user.ckptfs.lossy.";

// Whether `name` is one of ours: setting or removing such a name through
// the mount fails with EPERM.
bool IsLossyXattr(std::string_view name);

// Name and value of each attribute, in listing order: fidelity, scope,
// sensitivity, then target.ROLE and error.ROLE for each role that has lossy
// elements (ROLE: weights, first_moments, second_moments). None for a file
// sealed losslessly.
std::vector<std::pair<std::string, std::string>> LossyXattrs(const std::optional<LossyInfo>& info);

}  // namespace ckptfs
