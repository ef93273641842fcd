// HDF5 files (h5py, Keras 3 `.weights.h5` and the `model.weights.h5` inside
// a `.keras` zip). The superblock (versions 0 to 3) sits at offset 0 or
// after a user block of 512, 1024, 2048... bytes. From the root group the
// parser walks object headers (versions 1 and 2), following old-style
// groups (symbol table: v1 B-tree + local heap) and new-style ones (link
// messages, compact or in a fractal heap's direct blocks), and reads each
// dataset's datatype, dataspace and layout:
//   - contiguous: one region;
//   - chunked: one region per stored chunk, found through the chunk index
//     (v1 B-tree for layout v3; single chunk, implicit and unpaged fixed
//     array for layout v4);
//   - filtered (a filter pipeline message: gzip, shuffle, ...), compact or
//     virtual datasets, extensible-array and v2-B-tree chunk indexes, and
//     dense groups whose heap has filters or indirect blocks below the root
//     give no region: their bytes stay metadata for the generic path, and
//     the note counts them.
// Every address is checked against the file and every walk is bounded, so a
// malformed file is "unknown", never an error for the writer.
#pragma once

#include <cstdint>
#include <optional>

#include "codec/formats/layout.h"
#include "codec/formats/zip.h"

namespace ckptfs::formats {

// Where the HDF5 signature is: offset 0, or a power of two from 512 up to
// the file size (a user block). Nothing when it is nowhere.
std::optional<uint64_t> FindHdf5Superblock(const ByteSource& src);

// Format "hdf5", one region per contiguous dataset or stored chunk of a
// little-endian integer or float dataset. lossy_allowed is false: an HDF5
// file is often a model's shipped output rather than a training checkpoint
// (docs/ARCHITECTURE.md, lossy scope).
Result<FileLayout> ParseHdf5(const ByteSource& src);

// A Keras `.keras` file: a zip whose stored member (model.weights.h5) is an
// HDF5 file. Format "keras", the member's regions at their offsets in the
// zip, with the member's CRC fields.
bool HoldsHdf5Member(const ByteSource& src, const ZipArchive& z);
Result<FileLayout> ParseZippedHdf5(const ByteSource& src, const ZipArchive& z);

}  // namespace ckptfs::formats
