#include "mount-tools/mount_helper.h"

#include <algorithm>
#include <array>

namespace ckptfs {
namespace {

constexpr std::string_view kSourcePrefix = "ckptfs#";

// The words of a comma-separated option list, empty ones left out.
std::vector<std::string> SplitOptions(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = std::min(list.find(',', start), list.size());
    if (end > start) out.push_back(list.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// The flags mount(8) passes to helpers: -s sloppy, -f fake, -n no mtab, -v verbose.
Status ApplyFlags(std::string_view flags, bool* sloppy, bool* fake) {
  for (char c : flags) {
    if (c == 's') *sloppy = true;
    else if (c == 'f') *fake = true;
    else if (c != 'n' && c != 'v')
      return Status::InvalidArgument(std::string("mount helper: unknown flag -") + c +
                                     " (mount(8) passes -s, -f, -n, -v, -o and -t)");
  }
  return Status::Ok();
}

struct RawCall {
  std::vector<std::string> operands;
  std::vector<std::string> options;
  bool sloppy = false;
  bool fake = false;
};

// Splits the arguments into operands, options and flags, in any order.
Result<RawCall> SplitArgs(const std::vector<std::string>& args) {
  RawCall raw;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 2 || a[0] != '-') {
      raw.operands.push_back(a);
      continue;
    }
    const char flag = a[1];
    if (flag == 'o' || flag == 't' || flag == 'N') {
      if (a.size() == 2 && i + 1 == args.size())
        return Status::InvalidArgument("mount helper: -" + std::string(1, flag) + " needs a value");
      const std::string value = a.size() > 2 ? a.substr(2) : args[++i];
      if (flag == 'N') return Status::InvalidArgument("mount helper: -N (another mount namespace) is not supported");
      if (flag == 'o')
        for (std::string& o : SplitOptions(value)) raw.options.push_back(std::move(o));
      continue;  // -t: the type is what brought mount(8) here
    }
    RETURN_IF_ERROR(ApplyFlags(std::string_view(a).substr(1), &raw.sloppy, &raw.fake));
  }
  if (raw.operands.size() != 2)
    return Status::InvalidArgument("mount helper: expected STORE MOUNTPOINT [-o OPTIONS], got " +
                                   std::to_string(raw.operands.size()) + " operand(s)");
  return raw;
}

}  // namespace

bool IsMountHelperName(std::string_view argv0) {
  const size_t slash = argv0.rfind('/');
  const std::string_view base = slash == std::string_view::npos ? argv0 : argv0.substr(slash + 1);
  return base == "mount.ckptfs" || base == "mount.fuse.ckptfs";
}

bool IsMountFuseCall(const std::vector<std::string>& args, const std::vector<std::string>& subcommands) {
  return args.size() >= 2 && !args[0].empty() && args[0][0] != '-' && !args[1].empty() && args[1][0] != '-' &&
         std::find(subcommands.begin(), subcommands.end(), args[0]) == subcommands.end();
}

bool IsFstabOnlyOption(std::string_view option) {
  static constexpr std::array<std::string_view, 10> kWords = {"defaults", "auto",  "noauto", "user",  "users",
                                                              "nouser",   "owner", "group",  "_netdev", "nofail"};
  for (std::string_view w : kWords)
    if (option == w) return true;
  return option.rfind("x-", 0) == 0 || option.rfind("comment=", 0) == 0;
}

Result<HelperCall> ParseHelperCall(const std::vector<std::string>& args) {
  ASSIGN_OR_RETURN(RawCall raw, SplitArgs(args));
  HelperCall call;
  call.fake = raw.fake;
  call.mount.backing = raw.operands[0];
  if (call.mount.backing.rfind(kSourcePrefix, 0) == 0) call.mount.backing.erase(0, kSourcePrefix.size());
  call.mount.mountpoint = raw.operands[1];
  for (const std::string& option : raw.options) {
    if (IsFstabOnlyOption(option)) {
      call.dropped.push_back(option);
      continue;
    }
    // Tried on a copy first, so that -s leaves out an unknown option whole.
    MountOptions tried = call.mount;
    Status st = ParseMountOptions(option, &tried);
    if (st.ok()) {
      call.mount = std::move(tried);
    } else if (raw.sloppy) {
      call.dropped.push_back(option);
    } else {
      return st;
    }
  }
  return call;
}

}  // namespace ckptfs
