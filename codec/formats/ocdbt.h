// Orbax checkpoints (orbax-checkpoint's standard CheckpointManager) are
// TensorStore OCDBT databases: `manifest.ocdbt` names the root of the latest
// B+tree version, and the tree's leaves map keys ("params.dense.kernel/0.0",
// "params.dense.kernel/.zarray") to values stored inline or at an offset of
// a data file `d/<32 hex digits>`. A data file holds values one after another
// (zarr chunks), often followed by tree nodes; nothing in it says where one
// value ends. Its tensors are found from the manifest and tree beside it
// (tensorstore's docs, kvstore/ocdbt "Storage format"; docs/ARCHITECTURE.md).
//
// Chunks Orbax compresses (its default: zarr2 with zstd, or zarr3's zstd
// codec) stay bytes; chunks written uncompressed (use_compression=False)
// are tensor regions, each labelled with its array's tree path (README:
// the recommended Orbax setting).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "codec/formats/layout.h"

namespace ckptfs::formats {

// Where a node or value lies: a data file by its path from the database's
// root ("d/0123..."), a byte range in it.
struct OcdbtRef {
  std::string path;
  uint64_t offset = 0;
  uint64_t length = 0;
  // For a node: the path prefix of the data files its own table names
  // (OCDBT's transitive path: the referring table's base path).
  std::string base;
};

// The latest version's B+tree root, from manifest.ocdbt.
struct OcdbtRoot {
  OcdbtRef node;
  uint8_t height = 0;
};
Result<OcdbtRoot> ReadOcdbtManifest(const ByteSource& manifest);

// One key of a leaf: its value inline, or where it lies.
struct OcdbtEntry {
  std::string key;
  std::optional<OcdbtRef> ref;  // out-of-line value
  std::string value;            // inline value
};

// A decoded B+tree node: leaf entries (height 0) or children, each with the
// key prefix every key below it starts with.
struct OcdbtChild {
  std::string prefix;
  OcdbtRef node;
};
struct OcdbtNode {
  uint8_t height = 0;
  std::vector<OcdbtEntry> entries;
  std::vector<OcdbtChild> children;
};
// `encoded` is one node as stored; keys come out prefixed with `prefix`,
// data file paths with `base_path` (OcdbtRef::base of the node's ref).
Result<OcdbtNode> DecodeOcdbtNode(std::span<const uint8_t> encoded, const std::string& prefix,
                                  const std::string& base_path);

// Opens a file of the database by its path from the root ("d/...").
using OcdbtOpener = std::function<Result<std::shared_ptr<const ByteSource>>(const std::string& path)>;

// Every key of the latest version, in key order. Bounded by kMaxEntries
// keys and kMaxLayoutBytes of decoded nodes.
Result<std::vector<OcdbtEntry>> ListOcdbt(const OcdbtRoot& root, const OcdbtOpener& open);

// The layout of data file `self` (its path from the root, "d/...") from the
// database's keys: each uncompressed zarr chunk stored in it is a tensor
// region named by its key and labelled by its array path plus the chunk's
// place ("opt_state.0.mu.params.Dense_0.kernel/0.0"). Array metadata
// (.zarray, zarr.json) stored out of line is read through `open`. A file
// no key points into is an error; one whose chunks are all compressed is a
// layout without tensors, with a note saying so.
Result<FileLayout> OcdbtDataLayout(const std::vector<OcdbtEntry>& keys, const std::string& self, uint64_t self_size,
                                   const OcdbtOpener& open);

// A B+tree node that ends where `src` ends, or where the zeros padding it
// begin (a commit's data file often holds its values, then the tree's new
// nodes), found from the end within kMaxTailNodeSearch bytes and checked by
// its CRC32C; `path` names `src` in the database. The manifest is written
// only after the data, so this root is what a data file's seal can read at
// once.
inline constexpr uint64_t kMaxTailNodeSearch = 4u << 20;
// TensorStore may pad a data file with zeros after its last node (seen with
// orbax-checkpoint 0.12.8: large files rounded up to a multiple of 4 KiB);
// fewer than this many.
inline constexpr uint64_t kMaxOcdbtPadding = 4096;
Result<OcdbtRoot> OcdbtTailNode(const ByteSource& src, const std::string& path);

// The last B+tree node within the last kMaxTailNodeSearch bytes of `src`,
// whatever follows it: TensorStore may write a commit's nodes, then the
// next commit's values after them in the same file (seen with
// orbax-checkpoint 0.12.8: a 361-byte root, then 40 KB of values, then
// zeros), and writes the nodes describing those values only after reading
// this node back.
Result<OcdbtRoot> OcdbtLastNode(const ByteSource& src, const std::string& path);

// The B+tree nodes (magic and CRC32C agree, and they decode) of at most
// `max_length` bytes that start in [from, to) of `src`, by offset; each
// may end past `to`, not past the end of `src`.
Result<std::vector<OcdbtRef>> FindOcdbtNodes(const ByteSource& src, uint64_t from, uint64_t to, uint64_t max_length);

// A data file's name as OCDBT writes them: 32 lowercase hex digits.
bool LooksLikeOcdbtDataName(std::string_view name);

// Whether the file starts with a B+tree or version node rather than values
// (such files hold only tree nodes: nothing to wait for).
bool StartsWithOcdbtNode(const ByteSource& src);

// Orbax's legacy per-array layout (PyTreeCheckpointHandler(use_ocdbt=False),
// still written by orbax-checkpoint 0.12.8): each array is a zarr v2
// directory named by its tree path, holding `.zarray` and one file per
// chunk named by its grid position ("0.0", dimension_separator "."). The
// layout of chunk file `key` (size `size`) of array `array`, given its
// `.zarray` text: one tensor region labelled "<array>/<key>" when the
// chunk is raw little-endian C-order elements of the full chunk size
// (zarr v2 pads edge chunks); format "zarr-chunk", lossy_allowed false
// (a lone chunk file says nothing of the optimizer state beside it). An
// error when `key` is not a chunk name of that array; a layout without
// tensors, with a note, when the chunk is compressed or filtered.
Result<FileLayout> ZarrChunkFileLayout(std::string_view zarray, const std::string& array, const std::string& key,
                                       uint64_t size);

// Whether `name` reads as a zarr v2 chunk file name ("0", "3.1.0").
bool LooksLikeZarrChunkName(std::string_view name);

}  // namespace ckptfs::formats
