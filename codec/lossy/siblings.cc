#include "codec/lossy/siblings.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>

namespace ckptfs {

using lossy::TensorRole;

namespace {

// Indices of the tensors with `role`, in the file's logical order.
std::vector<size_t> InOrder(const FileLayout& layout, const std::vector<lossy::RoleAssignment>& roles,
                            TensorRole role) {
  std::vector<size_t> out;
  for (size_t i = 0; i < roles.size() && i < layout.tensors.size(); ++i) {
    if (roles[i].role != role) continue;
    if (role == TensorRole::kAdamV && layout.tensors[i].label.ends_with("max_exp_avg_sq")) continue;
    out.push_back(i);
  }
  std::stable_sort(out.begin(), out.end(),
                   [&](size_t a, size_t b) { return layout.tensors[a].order < layout.tensors[b].order; });
  return out;
}

// A parser that cannot tell a tensor's shape gives its element count alone.
bool ShapesAgree(const TensorRegion& a, const TensorRegion& b) {
  if (a.dtype != b.dtype || a.length != b.length) return false;
  return a.shape.size() <= 1 || b.shape.size() <= 1 || a.shape == b.shape;
}

// The parameter a second moment's label names, if any: "fc.weight" of
// "fc.weight.exp_avg_sq" or "state.fc.weight.exp_avg_sq"; empty for a bare
// "exp_avg_sq" (torch's optimizer state is keyed by parameter index).
std::string_view NamedParameter(std::string_view label) {
  constexpr std::string_view kV = "exp_avg_sq";
  if (!label.ends_with(kV) || label.size() <= kV.size() + 1) return {};
  label.remove_suffix(kV.size() + 1);
  if (label.starts_with("state.")) label.remove_prefix(6);
  return label;
}

std::string DescribeShape(const TensorRegion& t) {
  std::string out = "[";
  for (size_t k = 0; k < t.shape.size(); ++k) out += (k ? "," : "") + std::to_string(t.shape[k]);
  return out + "] " + std::string(DTypeName(t.dtype));
}

bool HoldsSecondMoments(const FileLayout& layout) {
  const std::vector<lossy::RoleAssignment> roles = lossy::AssignRoles(layout);
  return std::any_of(roles.begin(), roles.end(),
                     [](const lossy::RoleAssignment& r) { return r.role == TensorRole::kAdamV; });
}

}  // namespace

std::optional<SiblingMoments> ReadSiblingMoments(SiblingSource& siblings, const std::string& name) {
  Result<std::shared_ptr<const ByteSource>> src = siblings.Open(name);
  if (!src.ok()) return std::nullopt;
  FileLayout layout = DetectLayout(**src);  // a file still being written parses as unknown
  if (!HoldsSecondMoments(layout)) return std::nullopt;
  return SiblingMoments{name, std::move(src).value(), std::move(layout)};
}

Result<std::vector<std::pair<size_t, size_t>>> MatchSiblingMoments(const FileLayout& model, const FileLayout& sibling,
                                                                   lossy::LossyScope scope) {
  const std::vector<size_t> params = InOrder(model, lossy::AssignRoles(model, scope), TensorRole::kWeight);
  const std::vector<size_t> vs = InOrder(sibling, lossy::AssignRoles(sibling), TensorRole::kAdamV);
  auto mismatch = [](const std::string& why) { return Status::InvalidArgument(why); };
  if (vs.size() != params.size()) {
    return mismatch(std::to_string(vs.size()) + " second moments for " + std::to_string(params.size()) +
                    " parameters");
  }
  std::vector<std::pair<size_t, size_t>> pairs;
  if (!sibling.param_names.empty()) {
    // The optimizer names its parameters (torch >= 2.6): pair by name,
    // whatever order the model file stores its tensors in.
    if (sibling.param_names.size() != vs.size()) {
      return mismatch(std::to_string(sibling.param_names.size()) + " named parameters for " +
                      std::to_string(vs.size()) + " second moments");
    }
    std::unordered_map<std::string_view, size_t> by_name;  // label -> index into model.tensors
    for (size_t p : params) by_name.emplace(model.tensors[p].label, p);
    for (size_t k = 0; k < vs.size(); ++k) {
      auto it = by_name.find(sibling.param_names[k]);
      if (it == by_name.end()) {
        return mismatch("the optimizer's parameter " + sibling.param_names[k] + " is not in the model file");
      }
      const TensorRegion& w = model.tensors[it->second];
      const TensorRegion& v = sibling.tensors[vs[k]];
      if (!ShapesAgree(w, v)) {
        return mismatch("parameter " + w.label + " is " + DescribeShape(w) + ", its second moment " + DescribeShape(v));
      }
      pairs.emplace_back(it->second, vs[k]);
      by_name.erase(it);
    }
    return pairs;
  }
  for (size_t k = 0; k < params.size(); ++k) {
    const TensorRegion& w = model.tensors[params[k]];
    const TensorRegion& v = sibling.tensors[vs[k]];
    if (!ShapesAgree(w, v)) {
      return mismatch("parameter " + std::to_string(k) + " (" + w.label + ") is " + DescribeShape(w) +
                      ", its second moment " + DescribeShape(v));
    }
    const std::string_view named = NamedParameter(v.label);
    if (!named.empty() && !w.label.empty() && named != w.label && !named.ends_with("." + w.label) &&
        !std::string_view(w.label).ends_with("." + std::string(named))) {
      return mismatch("parameter " + std::to_string(k) + " is " + w.label + ", the second moment names " +
                      std::string(named));
    }
    pairs.emplace_back(params[k], vs[k]);
  }
  return pairs;
}

}  // namespace ckptfs
