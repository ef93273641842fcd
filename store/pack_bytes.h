// Where a PackReader reads a pack's bytes from: a file through Env (the
// store directory's packs, so FaultEnv's faults reach them), or an object
// in a RADOS pool (store/cluster/rados_pack_objects.h). The bytes are the same.
#pragma once

#include <fcntl.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "base/status.h"
#include "base/unique_fd.h"
#include "store/direct_read.h"
#include "base/env.h"

namespace ckptfs {

// Positioned reads of one immutable pack. Safe to call from several
// threads at once.
class PackBytes {
 public:
  virtual ~PackBytes() = default;
  virtual Result<uint64_t> Size() = 0;
  // Reads exactly out.size() bytes at `off`, or fails (EIO "short read").
  virtual Status ReadExact(std::span<uint8_t> out, uint64_t off) const = 0;
  // Asks for [off, off+len) to be read ahead, so that a ReadExact of it
  // soon after finds it at hand. Advice only.
  virtual void Prefetch(uint64_t off, uint64_t len) const = 0;

  // The same read into `room` (aligned to DirectReader::kAlign, at least
  // RoomFor(len) bytes), returning where in it the bytes landed: a source
  // that reads on an alignment grid keeps them where they came in.
  virtual size_t RoomFor(size_t len) const { return len; }
  virtual Result<std::span<const uint8_t>> ReadIn(std::span<uint8_t> room, uint64_t off, size_t len) const {
    RETURN_IF_ERROR(ReadExact(room.first(len), off));
    return std::span<const uint8_t>(room.first(len));
  }
};

// A pack file held open; reads go through Env.
class FdPackBytes : public PackBytes {
 public:
  // `direct`: large reads bypass the page cache where the file system
  // allows it (store/direct_read.h).
  FdPackBytes(Env* env, UniqueFd fd, bool direct = true)
      : env_(env), fd_(std::move(fd)), direct_(env, direct ? fd_.get() : -1) {}
  Result<uint64_t> Size() override {
    ASSIGN_OR_RETURN(struct stat st, env_->Fstat(fd_.get()));
    return static_cast<uint64_t>(st.st_size);
  }
  Status ReadExact(std::span<uint8_t> out, uint64_t off) const override {
    return direct_.Covers(out.size()) ? direct_.ReadExact(out, off) : env_->PReadExact(fd_.get(), out, off);
  }
  // The kernel reads it into the page cache (where a direct read would
  // not look for it).
  void Prefetch(uint64_t off, uint64_t len) const override {
    if (!direct_.Covers(len)) (void)env_->Fadvise(fd_.get(), off, len, POSIX_FADV_WILLNEED);
  }
  size_t RoomFor(size_t len) const override { return direct_.Covers(len) ? DirectReader::RoomFor(len) : len; }
  Result<std::span<const uint8_t>> ReadIn(std::span<uint8_t> room, uint64_t off, size_t len) const override {
    return direct_.Covers(len) ? direct_.ReadIn(room, off, len) : PackBytes::ReadIn(room, off, len);
  }

 private:
  Env* env_;
  UniqueFd fd_;
  DirectReader direct_;
};

}  // namespace ckptfs
