// A file's bytes as a ByteSource (codec/formats/layout.h) read through Env,
// so that the codec's reads of a file being sealed meet injected faults as
// the store's own reads do.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"
#include "codec/formats/layout.h"
#include "base/env.h"

namespace ckptfs {

// Does not own the fd; `size` is the file's size as the caller knows it.
class EnvSource : public ByteSource {
 public:
  EnvSource(Env* env, int fd, uint64_t size) : env_(env), fd_(fd), size_(size) {}
  uint64_t size() const override { return size_; }
  Status ReadAt(uint64_t off, std::span<uint8_t> out) const override {
    // Past `size` is past the file as the caller snapshotted it, even if it has grown since.
    if (off > size_ || size_ - off < out.size()) return Status::Error(EIO, "read past end of file");
    return env_->PReadExact(fd_, out, off);
  }

 private:
  Env* env_;
  int fd_;
  uint64_t size_;
};

}  // namespace ckptfs
