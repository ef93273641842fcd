// A file's bytes as a ByteSource (base/byte_source.h) read through Env,
// so that the codec's reads of a file being sealed meet injected faults as
// the store's own reads do.
#pragma once

#include <cstdint>
#include <span>

#include "base/byte_source.h"
#include "base/env.h"
#include "base/status.h"
namespace ckptfs {

// Does not own the fd; `size` is the file's size as the caller knows it:
// past it is past the file as the caller snapshotted it, even if it has
// grown since.
class EnvSource : public BoundedSource {
 public:
  EnvSource(Env* env, int fd, uint64_t size) : BoundedSource(size, "file"), env_(env), fd_(fd) {}

 private:
  Status ReadWithin(uint64_t off, std::span<uint8_t> out) const override { return env_->PReadExact(fd_, out, off); }
  Env* env_;
  int fd_;
};

}  // namespace ckptfs
