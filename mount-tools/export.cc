// `ckptfs export STORE [PATH] DEST`
#include <nlohmann/json.hpp>

#include <iostream>

#include "mount-tools/private_mount.h"
#include "mount-tools/progress.h"
#include "mount-tools/transfer.h"
#include "mount-tools/tree_copy.h"

namespace ckptfs {
namespace {

Result<CopyTotals> ExportThrough(const PrivateMount& mount, const std::string& path, const std::string& dest,
                                 double* seconds) {
  const std::string from = path.empty() ? mount.path() : mount.path() + "/" + path;
  ASSIGN_OR_RETURN(uint64_t total, TreeBytes(from));
  Progress progress("export", total, ShouldShowProgress());
  CopyTotals totals;
  RETURN_IF_ERROR(CopyTree(from, dest, &progress, &totals));
  progress.Finish();
  *seconds = progress.seconds();
  return totals;
}

}  // namespace

int RunExport(const std::string& store, const std::string& path, const std::string& dest, bool json) {
  if (path.find("..") != std::string::npos || (!path.empty() && path[0] == '/')) {
    std::cerr << "ckptfs export: PATH " << path << " must be relative to the store's root, without ..\n";
    return 2;
  }
  // ro: nothing an export does may change the store.
  auto mount = PrivateMount::Open(store, "ro");
  if (!mount.ok()) {
    std::cerr << "ckptfs export: " << mount.status().message() << "\n";
    return 2;
  }
  double seconds = 0;
  auto totals = ExportThrough(**mount, path, dest, &seconds);
  if (!totals.ok()) totals = Status::Error(totals.status().code(), (*mount)->InStoreTerms(totals.status().message()));
  const Status closed = (*mount)->Close();
  if (!totals.ok() || !closed.ok()) {
    std::cerr << "ckptfs export: " << (totals.ok() ? closed : totals.status()).message() << "\n";
    return 2;
  }
  if (json) {
    std::cout << nlohmann::json{{"files", totals->files},       {"directories", totals->directories},
                                {"symlinks", totals->symlinks}, {"skipped", totals->skipped},
                                {"bytes", totals->bytes},       {"seconds", seconds}}
                     .dump(2)
              << "\n";
  } else {
    std::cout << "export: " << totals->files << " files, " << HumanBytes(totals->bytes) << " to " << dest << "\n";
  }
  return 0;
}

}  // namespace ckptfs
