// Where a store's packs live: files under BACKING/packs/ (dir_pack_objects.h)
// or objects in a RADOS pool (rados_pack_objects.h). Either holds exactly
// the bytes of the pack format (docs/FORMAT.md, "Pack"); the namespace,
// staging and tmp/ stay in the store directory. Everything that publishes,
// reads, lists or deletes packs goes through this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "store/object_id.h"
#include "store/pack_bytes.h"

namespace ckptfs {

struct PackObjectEntry {
  ObjectId id = 0;
  std::string where;  // as Where(id) says, or where the entry really is when misplaced
  uint64_t bytes = 0;     // with ListDetail::kSizes
  uint64_t mtime_ns = 0;  // last write, with ListDetail::kSizes
  // Named like a pack but not where Where(id) is (a file in the wrong
  // packs/XX/): reads of `id` do not find it.
  bool misplaced = false;
  // False for an object whose publish never finished (RADOS: no completion
  // mark): no stub names it, and it may still be being written by a seal.
  bool complete = true;
};

// A part of the listing that could not be read: its packs, or that
// pack's state, are unknown.
struct PackUnlisted {
  std::string where;
  Status status;
  bool directory = true;  // a packs/XX/ directory; else one pack
};

struct PackListing {
  std::vector<PackObjectEntry> packs;
  std::vector<std::string> unexpected;  // where each entry that is not a pack is
  std::vector<PackUnlisted> unlisted;
};

enum class ListDetail { kNames, kSizes };

class PackObjects {
 public:
  virtual ~PackObjects() = default;
  // "packs/ab/ab01…ef.pack", "rados:POOL/ab01…ef.pack": for messages.
  virtual std::string Where(ObjectId id) const = 0;
  // "packs/", "rados:POOL": where all packs are, for messages.
  virtual std::string Describe() const = 0;
  // Makes the finished pack file `tmp_name` in `tmp_dir_fd` (open as
  // `tmp_fd`, its bytes durable) pack `id`. When it returns Ok the pack is
  // durable and readable and the tmp file is gone; on error nothing named
  // `id` is left that could be taken for a published pack, and the caller
  // removes the tmp file.
  virtual Status Publish(ObjectId id, int tmp_dir_fd, const std::string& tmp_name, int tmp_fd) = 0;
  // The pack's bytes; ENOENT when there is no such pack.
  virtual Result<std::unique_ptr<PackBytes>> Open(ObjectId id) = 0;
  // Missing is fine.
  virtual Status Delete(ObjectId id) = 0;
  // The pack's size in bytes; ENOENT when there is no such pack.
  virtual Result<uint64_t> Size(ObjectId id) = 0;
  // Every pack. An error only when nothing at all could be listed.
  virtual Result<PackListing> List(ListDetail detail) = 0;
};

}  // namespace ckptfs
