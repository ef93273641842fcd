// `ckptfs inspect FILE`: what the content-based format parsers
// (codec/formats/, DetectLayout) make of a file: format, note, and the
// tensor regions with the label and role (weight, optimizer moment) lossy
// mode would give them, and for a file a mount sealed lossily the budget it
// got (its user.ckptfs.lossy.* attributes). Works on any file, inside a
// mount or not. A file of unknown format is also matched against the
// TensorFlow bundle indexes of its directory, as the store does at seal
// time (seal/tf_shards.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/unique_fd.h"
#include "codec/formats/layout.h"
#include "codec/lossy/roles.h"
#include "mount-tools/commands.h"
#include "seal/ocdbt_data.h"
#include "seal/onnx_external.h"
#include "seal/tf_shards.h"

namespace ckptfs {
namespace {

std::string ShapeString(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// What the store recorded when it sealed the file lossily: its read-only
// user.ckptfs.lossy.* attributes (docs/SEMANTICS.md: the measure, each
// role's target, the budget in steps, the largest errors), empty for a file
// outside a mount or stored losslessly.
std::vector<std::pair<std::string, std::string>> StoredLossyAttributes(int fd) {
  static constexpr std::string_view kPrefix = "user.ckptfs.lossy.";
  std::vector<std::pair<std::string, std::string>> out;
  const ssize_t n = ::flistxattr(fd, nullptr, 0);
  if (n <= 0) return out;
  std::string names(static_cast<size_t>(n), '\0');
  const ssize_t got = ::flistxattr(fd, names.data(), names.size());
  if (got <= 0) return out;
  names.resize(static_cast<size_t>(got));
  for (size_t at = 0; at < names.size();) {
    const std::string name(names.c_str() + at);
    at += name.size() + 1;
    if (!name.starts_with(kPrefix)) continue;
    char value[256];
    const ssize_t len = ::fgetxattr(fd, name.c_str(), value, sizeof(value));
    if (len >= 0) out.emplace_back(name.substr(kPrefix.size()), std::string(value, static_cast<size_t>(len)));
  }
  return out;
}

// An open file read through FdSource, owning its fd.
class OwnedFdSource : public ByteSource {
 public:
  explicit OwnedFdSource(UniqueFd fd) : fd_(std::move(fd)), src_(fd_.get()) {}
  uint64_t size() const override { return src_.size(); }
  Status ReadAt(uint64_t off, std::span<uint8_t> out) const override { return src_.ReadAt(off, out); }

 private:
  UniqueFd fd_;
  FdSource src_;
};

// The other regular files of the inspected file's directory.
class DirectorySiblings : public SiblingSource {
 public:
  explicit DirectorySiblings(const std::filesystem::path& file) : file_(file) {}
  std::vector<std::string> Candidates() override {
    std::vector<std::string> out;
    std::error_code ec;
    const std::filesystem::path dir = file_.has_parent_path() ? file_.parent_path() : ".";
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      if (e.is_regular_file(ec) && !std::filesystem::equivalent(e.path(), file_, ec)) out.push_back(e.path());
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  Result<std::shared_ptr<const ByteSource>> Open(const std::string& name) override {
    UniqueFd fd(::open(name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd.valid()) return Status::FromErrno("open " + name);
    return std::shared_ptr<const ByteSource>(std::make_shared<OwnedFdSource>(std::move(fd)));
  }
  Result<std::shared_ptr<const ByteSource>> OpenInParent(const std::string& name) override {
    const std::filesystem::path dir = std::filesystem::absolute(file_).parent_path();
    return Open((dir.parent_path() / name).string());
  }
  std::string OwnName() override { return file_.filename(); }
  std::string DirName() override { return std::filesystem::absolute(file_).parent_path().filename(); }

 private:
  std::filesystem::path file_;
};

FileLayout InspectLayout(const std::string& path, const ByteSource& src) {
  FileLayout layout = DetectLayout(src);
  if (layout.format != "unknown") return layout;
  DirectorySiblings siblings(path);
  if (std::optional<FileLayout> tf = TfDataLayoutFromSiblings(src, siblings, std::chrono::milliseconds(0))) return *tf;
  if (std::optional<FileLayout> onnx = OnnxExternalLayoutFromSiblings(src, siblings, std::chrono::milliseconds(0)))
    return *onnx;
  if (std::optional<FileLayout> zarr = ZarrChunkLayoutFromSiblings(src, siblings)) return *zarr;
  std::optional<FileLayout> ocdbt = OcdbtDataLayoutFromSiblings(src, siblings, std::chrono::milliseconds(0));
  return ocdbt ? std::move(*ocdbt) : layout;
}

}  // namespace

int RunInspect(const std::string& path, bool json, bool with_roles) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    std::cerr << "ckptfs inspect: " << path << ": " << std::strerror(errno) << "\n";
    return 2;
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    std::cerr << "ckptfs inspect: " << path << ": " << std::strerror(errno) << "\n";
    return 2;
  }
  if (!S_ISREG(st.st_mode)) {
    std::cerr << "ckptfs inspect: " << path << ": not a regular file\n";
    return 2;
  }
  FdSource src(fd.get());
  const FileLayout layout = InspectLayout(path, src);
  const std::vector<lossy::RoleAssignment> roles = lossy::AssignRoles(layout);
  uint64_t tensor_bytes = 0;
  for (const auto& t : layout.tensors) tensor_bytes += t.length;

  if (json) {
    nlohmann::json out = {{"path", path},
                          {"size", src.size()},
                          {"format", layout.format},
                          {"note", layout.note},
                          {"lossy_allowed", layout.lossy_allowed},
                          {"optimizer_state", layout.optimizer_state},
                          {"tensor_bytes", tensor_bytes},
                          {"tensors", nlohmann::json::array()}};
    for (size_t i = 0; i < layout.tensors.size(); ++i) {
      const TensorRegion& t = layout.tensors[i];
      nlohmann::json j = {{"name", t.name},
                          {"dtype", std::string(DTypeName(t.dtype))},
                          {"shape", t.shape},
                          {"offset", t.offset},
                          {"length", t.length}};
      if (with_roles) {
        j["label"] = t.label;
        j["order"] = t.order;
        j["role"] = lossy::TensorRoleName(roles[i].role);
        j["partner_v"] = roles[i].partner_v;  // index into "tensors", or -1
        j["module_entry"] = t.module_entry;
        j["optimizer_entry"] = t.optimizer_entry;
      }
      out["tensors"].push_back(std::move(j));
    }
    const auto stored = StoredLossyAttributes(fd.get());
    if (!stored.empty()) {
      out["stored_lossy"] = nlohmann::json::object();
      for (const auto& [k, v] : stored) out["stored_lossy"][k] = v;
    }
    // Names come from the file: never let invalid UTF-8 make dump() throw.
    std::cout << out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  }
  std::printf("file:          %s\n", path.c_str());
  std::printf("size:          %llu\n", static_cast<unsigned long long>(src.size()));
  std::printf("format:        %s\n", layout.format.c_str());
  std::printf("lossy_allowed: %s\n", layout.lossy_allowed ? "yes" : "no");
  std::printf("note:          %s\n", layout.note.empty() ? "-" : layout.note.c_str());
  std::printf("tensors:       %zu (%llu bytes)\n", layout.tensors.size(),
              static_cast<unsigned long long>(tensor_bytes));
  for (const auto& [k, v] : StoredLossyAttributes(fd.get())) std::printf("stored lossy:  %s = %s\n", k.c_str(), v.c_str());
  if (!layout.tensors.empty()) {
    std::printf("%14s %14s  %-8s %-20s %-6s %s  %s\n", "offset", "length", "dtype", "shape", "role", "name", "label");
    for (size_t i = 0; i < layout.tensors.size(); ++i) {
      const TensorRegion& t = layout.tensors[i];
      std::printf("%14llu %14llu  %-8s %-20s %-6s %s  %s\n", static_cast<unsigned long long>(t.offset),
                  static_cast<unsigned long long>(t.length), std::string(DTypeName(t.dtype)).c_str(),
                  ShapeString(t.shape).c_str(), lossy::TensorRoleName(roles[i].role), t.name.c_str(),
                  t.label.empty() ? "-" : t.label.c_str());
    }
  }
  return 0;
}

}  // namespace ckptfs
