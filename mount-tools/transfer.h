// `ckptfs export` and `ckptfs import`: plain files out of, and into, a
// store that is not mounted, through a private mount of it
// (private_mount.h). Exit 0 done, 2 error (as every command).
#pragma once

#include <string>

namespace ckptfs {

// Writes the files under PATH ("" for all) of STORE to DEST as plain
// files: the bytes written for lossless files, the reconstruction for
// lossy ones (what a read through a mount gives).
int RunExport(const std::string& store, const std::string& path, const std::string& dest, bool json);
// Copies SRC (a checkpoint directory, or one file) into STORE at PATH ("":
// SRC's name), mounted with `options`; files reach it oldest first, so a
// series is stored as deltas. Returns once every file is sealed.
int RunImport(const std::string& src, const std::string& store, const std::string& path, const std::string& options,
              bool json);

}  // namespace ckptfs
