// Packs as objects in a RADOS pool (-o packs=rados:POOL): object ID.pack,
// in the store's own RADOS namespace (recorded in the superblock), holds
// exactly the bytes of packs/XX/ID.pack. RADOS has no rename, so a pack is
// published by writing its object in pieces; the last piece sets the
// xattr kCompleteXattr in the same atomic operation, and an object without
// it is a publish that never finished (docs/FORMAT.md, "Packs in RADOS").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "store/env.h"
#include "store/pack_objects.h"
#include "store/rados_client.h"

namespace ckptfs {

// Set on a pack's object by the write of its last piece; the value is the
// pack's size in bytes, in decimal.
inline constexpr char kCompleteXattr[] = "ckptfs.published";
// A publish writes the pack this many bytes at a time (one buffer of it).
inline constexpr uint64_t kRadosPieceBytes = 4u << 20;

class RadosPackObjects : public PackObjects {
 public:
  // `location` is "rados:POOL", for messages.
  RadosPackObjects(Env* env, std::unique_ptr<RadosClient> client, std::string location)
      : env_(env), client_(std::move(client)), location_(std::move(location)) {}

  std::string Where(ObjectId id) const override;
  std::string Describe() const override { return location_; }
  Status Publish(ObjectId id, int tmp_dir_fd, const std::string& tmp_name, int tmp_fd) override;
  Result<std::unique_ptr<PackBytes>> Open(ObjectId id) override;
  Status Delete(ObjectId id) override;
  Result<uint64_t> Size(ObjectId id) override;
  Result<PackListing> List(ListDetail detail) override;

 private:
  Status WritePieces(const std::string& obj, int tmp_fd, uint64_t size);
  void ListObject(const std::string& name, ListDetail detail, PackListing* out);

  Env* env_;
  std::unique_ptr<RadosClient> client_;
  std::string location_;
};

}  // namespace ckptfs
