#include "base/byte_source.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ckptfs {

Status BoundedSource::ReadAt(uint64_t off, std::span<uint8_t> out) const {
  if (off > size_ || out.size() > size_ - off) {
    return Status::Error(EIO, "read of " + std::to_string(out.size()) + " bytes at offset " + std::to_string(off) +
                                  " past the end of the " + what_ + " (" + std::to_string(size_) + " bytes)");
  }
  return ReadWithin(off, out);
}

Status SpanSource::ReadWithin(uint64_t off, std::span<uint8_t> out) const {
  if (!out.empty()) std::memcpy(out.data(), bytes_.data() + off, out.size());
  return Status::Ok();
}

namespace {

uint64_t FileSize(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 && st.st_size > 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

}  // namespace

FdSource::FdSource(int fd) : BoundedSource(FileSize(fd), "file"), fd_(fd) {}

Status FdSource::ReadWithin(uint64_t off, std::span<uint8_t> out) const {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(off + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno("pread");
    if (n == 0) return Status::Error(EIO, "file shrank while reading");
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace ckptfs
