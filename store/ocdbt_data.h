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

// Where the bytes of `file` begin that a lossy seal leaves as written,
// when it ends with a B+tree node (and the zeros padding it): the node,
// and nothing before it. A commit of TensorStore's writer may put the next
// commit's values before its own node, and the next commit reads that node
// back before it writes the nodes describing those values; reads inside
// [start, size) of a closed file therefore need not wait for its lossy
// seal (docs/SEMANTICS.md), and the seal keeps every tensor overlapping
// them exact (KeepOcdbtTailExact). Nothing when the file ends otherwise.
std::optional<uint64_t> OcdbtTailNodeStart(const ByteSource& file);

// Drops from `layout` the tensors overlapping [OcdbtTailNodeStart, size)
// of `file`, so that no lossy seal changes a byte a reader may have been
// served before it. Returns how many were dropped.
size_t KeepOcdbtTailExact(const ByteSource& file, FileLayout* layout);

}  // namespace ckptfs
