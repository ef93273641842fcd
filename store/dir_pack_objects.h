// Packs as files in the store directory: BACKING/packs/XX/ID.pack, XX the
// first two hex digits of ID. Publishing renames the finished tmp file
// into place and fsyncs packs/XX/ (docs/FORMAT.md, "Publishing and recovery").
#pragma once

#include "base/env.h"
#include "store/pack_objects.h"

namespace ckptfs {

class DirPackObjects : public PackObjects {
 public:
  // `packs_fd` is BACKING/packs/, held open by the caller for as long as
  // this lives. `direct_reads`: read large chunks with O_DIRECT.
  DirPackObjects(Env* env, int packs_fd, bool direct_reads = true)
      : env_(env), packs_fd_(packs_fd), direct_reads_(direct_reads) {}

  std::string Where(ObjectId id) const override;
  std::string Describe() const override { return "packs/"; }
  Status Publish(ObjectId id, int tmp_dir_fd, const std::string& tmp_name, int tmp_fd) override;
  Result<std::unique_ptr<PackBytes>> Open(ObjectId id) override;
  Status Delete(ObjectId id) override;
  Result<uint64_t> Size(ObjectId id) override;
  Result<PackListing> List(ListDetail detail) override;

 private:
  Result<UniqueFd> PackDir(ObjectId id, bool create);
  void ListSubdir(const DirEntry& d, ListDetail detail, PackListing* out);

  Env* env_;
  int packs_fd_;
  bool direct_reads_;
};

}  // namespace ckptfs
