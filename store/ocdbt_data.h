// Orbax data files (`.../ocdbt.process_0/d/<32 hex digits>`) have no
// header: their tensors are known only from the OCDBT database around them,
// the B+tree nodes a commit writes after its values (at the end of the
// file or of a sibling data file) and manifest.ocdbt one directory up,
// written last. The store finds them through the file's siblings and lets
// the tree decide (formats::OcdbtDataLayout); see codec/formats/ocdbt.h.
#pragma once

#include <chrono>
#include <optional>

#include "codec/formats/layout.h"
#include "codec/lossy/siblings.h"

namespace ckptfs {

// How long a data file's seal polls for the nodes that point into it. Short:
// under a lossy policy reads wait for seals, and the save that would write
// those nodes may itself be reading a file queued behind this seal.
inline constexpr std::chrono::milliseconds kOcdbtNodeWait{3000};

// The layout of `file` as an OCDBT data file: from a tree node ending the
// file or a sibling data file, else from the latest version the parent
// directory's manifest.ocdbt names. Nothing when the file is not named like
// a data file, holds only tree nodes, or no tree found points into it
// within `wait` (and while SiblingSource::WaitForMore allows).
std::optional<FileLayout> OcdbtDataLayoutFromSiblings(const ByteSource& file, SiblingSource& siblings,
                                                      std::chrono::milliseconds wait = kOcdbtNodeWait);

}  // namespace ckptfs
