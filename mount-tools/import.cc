// `ckptfs import SRC STORE [PATH]`
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>

#include "mount-tools/private_mount.h"
#include "mount-tools/progress.h"
#include "mount-tools/transfer.h"
#include "mount-tools/tree_copy.h"
#include "store/store.h"
#include "seal/seal_planner.h"

namespace ckptfs {
namespace {

Result<CopyTotals> ImportThrough(const PrivateMount& mount, const std::string& src, const std::string& path,
                                 double* seconds) {
  const std::filesystem::path to = std::filesystem::path(mount.path()) / path;
  std::error_code ec;
  std::filesystem::create_directories(to.parent_path(), ec);
  if (ec) return Status::Error(ec.value(), "cannot create " + to.parent_path().string() + ": " + ec.message());
  ASSIGN_OR_RETURN(uint64_t total, TreeBytes(src));
  Progress progress("import", total, ShouldShowProgress());
  CopyTotals totals;
  RETURN_IF_ERROR(CopyTree(src, to.string(), &progress, &totals));
  progress.Finish();
  *seconds = progress.seconds();
  return totals;
}

// What the imported files take in the store, now that they are sealed.
struct Stored {
  uint64_t logical = 0;
  uint64_t stored = 0;
  uint64_t deltas = 0;  // files stored against an earlier one
};

Result<Stored> StoredUnder(const std::string& store, const std::string& path) {
  StoreOptions so;
  so.planner = &FormatSealPlanner();
  so.create_if_missing = false;
  so.take_lock = false;
  ASSIGN_OR_RETURN(std::unique_ptr<Store> s, Store::Open(Env::Default(), store, so));
  ASSIGN_OR_RETURN(std::vector<FileUsage> files, s->Usage(path));
  Stored out;
  for (const FileUsage& f : files) {
    out.logical += f.logical;
    out.stored += f.stored;
    if (f.base != 0) ++out.deltas;
  }
  return out;
}

void PrintSummary(const CopyTotals& t, const Stored& s, double seconds, bool json) {
  if (json) {
    std::cout << nlohmann::json{{"files", t.files},       {"directories", t.directories}, {"symlinks", t.symlinks},
                                {"skipped", t.skipped},   {"bytes", t.bytes},             {"seconds", seconds},
                                {"logical", s.logical},   {"stored", s.stored},           {"delta_files", s.deltas}}
                     .dump(2)
              << "\n";
    return;
  }
  std::cout << "import: " << t.files << " files, " << HumanBytes(s.logical) << " stored in " << HumanBytes(s.stored)
            << " (" << s.deltas << " as deltas of earlier files)\n";
}

}  // namespace

int RunImport(const std::string& src, const std::string& store, const std::string& path, const std::string& options,
              bool json) {
  std::filesystem::path named = std::filesystem::path(src).lexically_normal();
  if (!named.has_filename()) named = named.parent_path();  // "dir/"
  const std::string dest = path.empty() ? named.filename().string() : path;
  if (dest.empty() || dest.find("..") != std::string::npos || dest[0] == '/') {
    std::cerr << "ckptfs import: PATH " << dest << " must be relative to the store's root, without ..\n";
    return 2;
  }
  auto mount = PrivateMount::Open(store, options);
  if (!mount.ok()) {
    std::cerr << "ckptfs import: " << mount.status().message() << "\n";
    return 2;
  }
  double seconds = 0;
  auto totals = ImportThrough(**mount, src, dest, &seconds);
  if (!totals.ok()) totals = Status::Error(totals.status().code(), (*mount)->InStoreTerms(totals.status().message()));
  if (ShouldShowProgress()) std::cerr << "import: sealing...\n";
  const Status closed = (*mount)->Close();
  if (!totals.ok() || !closed.ok()) {
    std::cerr << "ckptfs import: " << (totals.ok() ? closed : totals.status()).message() << "\n";
    return 2;
  }
  auto stored = StoredUnder(store, dest);
  if (!stored.ok()) {
    std::cerr << "ckptfs import: imported, but cannot read the store back: " << stored.status().message() << "\n";
    return 2;
  }
  PrintSummary(*totals, *stored, seconds, json);
  return 0;
}

}  // namespace ckptfs
