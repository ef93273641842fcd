// Random-access input, so multi-GiB files never need to be in memory:
// parsers and codecs read files through it, whatever holds the bytes (a
// buffer, an fd, a staged file through Env, a sealed file's pack).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "base/status.h"

namespace ckptfs {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Fills `out` exactly from `off`, or fails (past the end, I/O error).
  virtual Status ReadAt(uint64_t off, std::span<uint8_t> out) const = 0;
};

// A source of a size known up front. Its reads are checked against that
// size here, once, so that every adapter fails a read past its end alike
// (EIO, naming what was read), and implementations read only in range.
class BoundedSource : public ByteSource {
 public:
  uint64_t size() const final { return size_; }
  Status ReadAt(uint64_t off, std::span<uint8_t> out) const final;

 protected:
  // `what` names the bytes in errors ("buffer", "file", "sibling file").
  BoundedSource(uint64_t size, const char* what) : size_(size), what_(what) {}
  // [off, off + out.size()) lies within size().
  virtual Status ReadWithin(uint64_t off, std::span<uint8_t> out) const = 0;

 private:
  uint64_t size_;
  const char* what_;
};

// Over memory that outlives the source (tests, fuzzing).
class SpanSource : public BoundedSource {
 public:
  explicit SpanSource(std::span<const uint8_t> bytes) : BoundedSource(bytes.size(), "buffer"), bytes_(bytes) {}

 private:
  Status ReadWithin(uint64_t off, std::span<uint8_t> out) const override;
  std::span<const uint8_t> bytes_;
};

// Over an open fd with pread; does not own the fd. The size is taken at
// construction (fstat), so a file growing meanwhile is read as it was.
// For tools and tests: the daemon reads through Env (store/env_source.h).
class FdSource : public BoundedSource {
 public:
  explicit FdSource(int fd);

 private:
  Status ReadWithin(uint64_t off, std::span<uint8_t> out) const override;
  int fd_;
};

// A window [base, base+len) of another source; offsets are window-relative.
// Lets a parser handle an embedded file (npz member, DCP item) unchanged.
class SubSource : public BoundedSource {
 public:
  SubSource(const ByteSource& parent, uint64_t base, uint64_t len)
      : BoundedSource(len, "window"), parent_(parent), base_(base) {}

 private:
  Status ReadWithin(uint64_t off, std::span<uint8_t> out) const override { return parent_.ReadAt(base_ + off, out); }
  const ByteSource& parent_;
  uint64_t base_;
};

}  // namespace ckptfs
