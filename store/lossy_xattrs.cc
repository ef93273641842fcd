#include "store/lossy_xattrs.h"

#include <fcntl.h>

#include <cstdio>

#include "store/store.h"

namespace ckptfs {
namespace {

// The same role names as `ckptfs stats --json`.
constexpr const char* kRoleNames[3] = {"weights", "first_moments", "second_moments"};

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

}  // namespace

bool IsLossyXattr(std::string_view name) { return name.starts_with(kLossyXattrPrefix); }

std::vector<std::pair<std::string, std::string>> LossyXattrs(const std::optional<LossyInfo>& info) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!info) return out;
  const std::string p(kLossyXattrPrefix);
  out.emplace_back(p + "fidelity", Number(info->fidelity));
  out.emplace_back(p + "scope", lossy::LossyScopeName(info->scope));
  out.emplace_back(p + "sensitivity", SensitivityRuleName(info->sensitivity));
  out.emplace_back(p + "measure", BudgetMeasureName(info->measure));
  for (size_t r = 0; r < 3; ++r) {
    if (info->roles[r].elements == 0) continue;
    out.emplace_back(p + "target." + kRoleNames[r], Number(info->roles[r].target));
    out.emplace_back(p + "error." + kRoleNames[r], Number(info->roles[r].max_error));
  }
  return out;
}

// Here rather than in store.cc: the attributes are this file's subject.
Result<std::optional<LossyInfo>> Store::LossyInfoOf(const std::string& stub_path) {
  ASSIGN_OR_RETURN(UniqueFd fd, env_->OpenAt(AT_FDCWD, stub_path, O_RDONLY | O_CLOEXEC));
  ASSIGN_OR_RETURN(StubRecord rec, ReadStub(env_, fd.get()));
  if (rec.state != StubState::kSealed || rec.object == 0) return std::optional<LossyInfo>{};
  ASSIGN_OR_RETURN(std::shared_ptr<PackReader> pack, OpenPack(rec.object));
  return pack->meta().lossy;
}

}  // namespace ckptfs
