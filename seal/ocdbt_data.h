// Orbax data files (`.../ocdbt.process_0/d/<32 hex digits>`) have no
// header: their tensors are known only from the OCDBT database around them,
// the B+tree nodes a commit writes after its values (at the end of the
// file or of a sibling data file) and manifest.ocdbt one directory up,
// written last. The store finds them through the file's siblings and lets
// the tree decide (formats::OcdbtDataLayout); see codec/formats/ocdbt.h.
#pragma once

#include <chrono>
#include <cstdint>
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
// within `wait` of SiblingSource::WaitingSince (and while WaitForMore
// allows; a postponed seal returns at once).
std::optional<FileLayout> OcdbtDataLayoutFromSiblings(const ByteSource& file, SiblingSource& siblings,
                                                      std::chrono::milliseconds wait = kOcdbtNodeWait);

// Where the B+tree node ending `file` (before the zeros padding it)
// starts; nothing when the file ends otherwise.
std::optional<uint64_t> OcdbtTailNodeStart(const ByteSource& file);

// Where the bytes of `file` begin that a lossy seal leaves as written, when
// it ends with a B+tree node, or holds one followed by the next commit's
// values (formats::OcdbtLastNode: TensorStore reads that node back before
// it writes the nodes describing those values, as with a tail node): the
// start of the page (kOcdbtTailPage) that holds the node's first byte. A commit of TensorStore's writer may put the
// next commit's values before its own node, and the next commit reads that
// node back before it writes the nodes describing those values; reads from
// there on of a closed file therefore need not wait for its lossy seal
// (docs/SEMANTICS.md), and the seal keeps every tensor overlapping them
// exact (KeepOcdbtTailExact). The page, not the node: the kernel asks the
// daemon for whole pages, so a node that starts mid-page (a 40-byte bias
// just before it) is read from the page's start; were that read to wait
// for the seal, the seal would wait for nodes TensorStore writes only once
// the read returns, and find none.
std::optional<uint64_t> OcdbtTailReadableFrom(const ByteSource& file);
inline constexpr uint64_t kOcdbtTailPage = 4096;

// Drops from `layout` the tensors overlapping [OcdbtTailReadableFrom, size)
// of `file`, so that no lossy seal changes a byte a reader may have been
// served before it. Returns how many were dropped.
size_t KeepOcdbtTailExact(const ByteSource& file, FileLayout* layout);

// A B+tree node anywhere in a data file, not only its last: TensorStore may
// write a commit's node, then more of the next commit's values after it
// than OcdbtLastNode searches (4.2 MB in the Orbax series), and read that
// node back before it writes the nodes describing those values. Such a
// read waited for the seal, the seal for those nodes, and after
// kOcdbtNodeWait the file was sealed without its layout. Nodes up to this
// size are served before the seal.
inline constexpr uint64_t kOcdbtReadableNodeBytes = 1u << 20;

// Whether every page (kOcdbtTailPage) of [off, off + length) of `file`
// holds bytes of a B+tree node of at most kOcdbtReadableNodeBytes. A lossy
// seal leaves those pages as they are (KeepOcdbtNodePagesExact), so a read
// of them need not wait for it. False when `file` cannot be read.
bool OcdbtNodePagesCover(const ByteSource& file, uint64_t off, uint64_t length);

// Drops from `layout` the tensors that share a page with a B+tree node of
// at most kOcdbtReadableNodeBytes found in the bytes no tensor covers (a
// node is never a value, so it lies there). Returns how many were dropped.
Result<size_t> KeepOcdbtNodePagesExact(const ByteSource& file, FileLayout* layout);

// The chunk size a pack of a file with `layout` is cut into, given the
// mount's: at most kOcdbtChunkSize for an OCDBT data file of several
// arrays. TensorStore puts a save's arrays in a data file in the order its
// writes completed, different at every save, and a chunk is stored against
// one window of one predecessor: in a chunk that straddles two arrays,
// the array the window is not aligned to is predicted from the wrong
// bytes. Smaller chunks straddle less (the Orbax series,
// bench/history/2026-12-08-codec-table.md).
// Every pack records its own chunk size, so no format changes.
inline constexpr uint32_t kOcdbtChunkSize = 1u << 20;
uint32_t PackChunkSizeFor(const FileLayout& layout, uint32_t configured);

// The layout of `file` as a chunk of Orbax's legacy per-array zarr layout
// (formats::ZarrChunkFileLayout), from the `.zarray` beside it and the name
// of its directory (the array's tree path). Nothing when the file is not
// named like a chunk or no such `.zarray` is a file of the same save.
std::optional<FileLayout> ZarrChunkLayoutFromSiblings(const ByteSource& file, SiblingSource& siblings);

}  // namespace ckptfs
