// Packs as objects in a RADOS pool (-o packs=rados:POOL), in the store's
// own RADOS namespace (recorded in the superblock): object ID.pack holds
// the bytes of packs/XX/ID.pack, all of them when the pack is at most
// kRadosStripeBytes, else its first stripe, and ID.pack.1, ID.pack.2, ...
// the following ones (OSDs refuse objects over osd_max_object_size, 128 MiB
// by default, and BlueStore any over 4 GiB). RADOS has no rename, so a
// pack is published by writing its objects in pieces, ID.pack last; its
// last piece sets the xattr kCompleteXattr in the same atomic operation,
// and objects without it are a publish that never finished
// (docs/FORMAT.md, "Packs in RADOS").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/env.h"
#include "store/pack_objects.h"
#include "store/cluster/rados_client.h"

namespace ckptfs {

// Set on a pack's object by the write of its last piece; the value is the
// pack's size in bytes, in decimal.
inline constexpr char kCompleteXattr[] = "ckptfs.published";
// A publish writes the pack this many bytes at a time (one buffer of it).
inline constexpr uint64_t kRadosPieceBytes = 4u << 20;
// The most bytes of a pack one object holds.
inline constexpr uint64_t kRadosStripeBytes = 64u << 20;

class RadosPackObjects : public PackObjects {
 public:
  // `location` is "rados:POOL", for messages.
  RadosPackObjects(Env* env, std::unique_ptr<RadosClient> client, std::string location,
                   uint64_t stripe_bytes = kRadosStripeBytes)
      : env_(env), client_(std::move(client)), location_(std::move(location)), stripe_bytes_(stripe_bytes) {}

  std::string Where(ObjectId id) const override;
  std::string Describe() const override { return location_; }
  Status Publish(ObjectId id, int tmp_dir_fd, const std::string& tmp_name, int tmp_fd) override;
  Result<std::unique_ptr<PackBytes>> Open(ObjectId id) override;
  Status Delete(ObjectId id) override;
  Result<uint64_t> Size(ObjectId id) override;
  Result<PackListing> List(ListDetail detail) override;

 private:
  Status WriteStripe(ObjectId id, uint64_t stripe, int tmp_fd, uint64_t size, std::vector<uint8_t>* piece);
  // `created`: how many objects after the head exist (were written) so far.
  Status WriteStripes(ObjectId id, int tmp_fd, uint64_t size, uint64_t* created);
  Status RemoveStripes(ObjectId id, uint64_t stripes, bool with_head);
  // The pack's size, from its completion mark.
  Result<uint64_t> MarkedSize(ObjectId id);
  void ListPack(ObjectId id, const std::vector<std::string>& objects, bool head, ListDetail detail,
                PackListing* out);

  Env* env_;
  std::unique_ptr<RadosClient> client_;
  std::string location_;
  uint64_t stripe_bytes_;
};

}  // namespace ckptfs
