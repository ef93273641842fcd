// TensorFlow tensor bundles (tf.train.Checkpoint / tf.train.Saver V2).
//
// A bundle is `<prefix>.index` plus shards `<prefix>.data-SSSSS-of-NNNNN`.
// The .index file is a LevelDB-format SSTable (footer with two varint
// BlockHandles + magic 0xdb4775248b80fb57, blocks of prefix-compressed keys
// with a restart array and a 5-byte trailer: compression type + masked
// CRC32C). Key "" holds a BundleHeaderProto; every other key is a tensor
// name whose value is a BundleEntryProto saying where in which .data shard
// the tensor's bytes lie. The data shards have no header and cannot be told
// apart from arbitrary bytes by content, so their layout comes from the
// index (TfDataLayout). TF checks every tensor's CRC32C on restore, so
// bundles are never coded lossily.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "codec/formats/layout.h"

namespace ckptfs::formats {

// CRC32C (Castagnoli), and LevelDB/TF's masking of stored CRCs.
uint32_t Crc32c(std::span<const uint8_t> data, uint32_t crc = 0);
inline uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline uint32_t UnmaskCrc32c(uint32_t masked) {
  uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

// TF DataType enum value -> our element type; kUnknown for DT_STRING,
// DT_RESOURCE, DT_VARIANT, 4-bit types and anything unknown.
DType TfDTypeToDType(int64_t tf_dtype);

// One BundleEntryProto. offset/size locate the bytes in data shard
// `shard_id`, not in the index file.
struct TfBundleEntry {
  std::string name;  // the SSTable key (slice entries have binary keys)
  int64_t tf_dtype = 0;
  DType dtype = DType::kUnknown;
  std::vector<uint64_t> shape;  // outermost first; empty for a scalar
  bool shape_known = true;      // false: unknown_rank or a negative (unknown) dim
  uint32_t shard_id = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  // As stored: MaskCrc32c(Crc32c(data bytes)). For DT_STRING TF hashes each
  // length as a u32, not the varint that is on disk.
  uint32_t masked_crc32c = 0;
  bool has_slices = false;  // a partitioned tensor; its data is in the slice entries
};

struct TfBundleIndex {
  uint32_t num_shards = 1;
  bool big_endian = false;
  int64_t producer = 0;                // VersionDef.producer
  std::vector<TfBundleEntry> entries;  // key order, without the header entry
};

// Probe: the SSTable magic in the last 8 bytes of a file of >= 48 bytes.
bool HasTfIndexFooter(const ByteSource& src);

// Reads a whole .index file, verifying every block's CRC32C, key order and
// every BundleEntryProto. Malformed input fails with Corruption. A block
// that is compressed (type != 0; TF never writes one) fails with ENOTSUP:
// the file is a bundle index we cannot read, not a corrupt one.
Result<TfBundleIndex> ReadTfBundleIndex(const ByteSource& src);

// Layout of the .index file: format "tf-bundle-index", no tensor regions
// (the whole file is metadata), lossy_allowed=false, note "N tensors in M
// shards". A compressed table still yields "tf-bundle-index", with a note.
Result<FileLayout> ParseTfIndex(const ByteSource& src);

// Layout of data shard `shard_id` (a file of `data_size` bytes) described
// by `index`: format "tf-bundle-data", lossy_allowed=false, one region per
// entry of that shard with a known fixed-size dtype whose size matches its
// shape and which lies inside the file. Strings, variants, sliced parents
// and big-endian bundles stay metadata (the note counts them).
FileLayout TfDataLayout(const TfBundleIndex& index, uint32_t shard_id, uint64_t data_size);

// Which shard of `index` the bytes of `data` are, judged by content alone:
// the shard's entries must end exactly at the end of `data`, and the
// CRC32C of its smallest fixed-size entries (at least one, up to
// kTfShardCheckBytes of them) must match the index. Nothing when no shard
// fits, or when a shard has no entry whose CRC can be checked (strings).
inline constexpr uint64_t kTfShardCheckBytes = 4u << 20;
std::optional<uint32_t> MatchTfDataShard(const TfBundleIndex& index, const ByteSource& data);

// The layout of `data` as a data shard of the first of `indexes` (parsed
// index files, each with a name for the note) whose shard it matches.
struct NamedTfIndex {
  std::string name;
  TfBundleIndex index;
};
std::optional<FileLayout> TfDataLayoutFromIndexes(const ByteSource& data, const std::vector<NamedTfIndex>& indexes);

// A name TensorFlow gives data shards ("ckpt-1.data-00000-of-00001", also
// with a ".tempstate123" suffix while written). Only a hint for how long
// to look for the index, which is written after the data: recognition is
// by content (MatchTfDataShard).
bool LooksLikeTfDataShardName(std::string_view name);

}  // namespace ckptfs::formats
