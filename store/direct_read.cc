#include "store/direct_read.h"

#include <fcntl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/huge_pages.h"

namespace ckptfs {
namespace {

// O_DIRECT wants the buffer aligned as well as the offset and length. One
// buffer per thread, grown as needed: the readers are the FUSE and
// decode-ahead threads, each holding one chunk at a time.
std::span<uint8_t> AlignedScratch(size_t n) {
  thread_local AlignedBuffer buf;
  return buf.Get(n);
}

}  // namespace

void AlignedBuffer::Free::operator()(uint8_t* p) const { FreeBuffer(p, bytes); }

std::span<uint8_t> AlignedBuffer::Get(size_t n) {
  if (n > cap_) {
    const size_t rounded = (n + DirectReader::kAlign - 1) / DirectReader::kAlign * DirectReader::kAlign;
    bytes_.reset();
    bytes_ = std::unique_ptr<uint8_t, Free>(static_cast<uint8_t*>(AllocateBuffer(rounded, DirectReader::kAlign)),
                                            Free{rounded});
    cap_ = bytes_ ? rounded : 0;
    if (!bytes_) return {};
  }
  return {bytes_.get(), n};
}

DirectReader::DirectReader(Env* env, int fd) : env_(env) {
  if (fd < 0) return;
  Result<UniqueFd> d = env->OpenAt(AT_FDCWD, ProcFdPath(fd), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (d.ok()) direct_ = std::move(*d);
}

Status DirectReader::ReadExact(std::span<uint8_t> out, uint64_t off) const {
  std::span<uint8_t> room = AlignedScratch(RoomFor(out.size()));
  if (room.empty()) {
    return Status::Error(ENOMEM, "no memory for a direct read of " + std::to_string(RoomFor(out.size())) + " bytes");
  }
  ASSIGN_OR_RETURN(const std::span<const uint8_t> got, ReadIn(room, off, out.size()));
  std::memcpy(out.data(), got.data(), out.size());
  return Status::Ok();
}

Result<std::span<const uint8_t>> DirectReader::ReadIn(std::span<uint8_t> room, uint64_t off, size_t len) const {
  const uint64_t begin = off / kAlign * kAlign;
  const uint64_t end = (off + len + kAlign - 1) / kAlign * kAlign;
  if (room.size() < end - begin || reinterpret_cast<uintptr_t>(room.data()) % kAlign != 0) {
    return Status::InvalidArgument("direct read of " + std::to_string(len) + " bytes into " +
                                   std::to_string(room.size()) + " unaligned or too few bytes");
  }
  // The last block may run past the end of the file: a short read is fine
  // as long as it covers what was asked for.
  ASSIGN_OR_RETURN(size_t got, env_->PRead(direct_.get(), room.first(end - begin), begin));
  const uint64_t lead = off - begin;
  if (got < lead + len) {
    const uint64_t got_asked = got - std::min<uint64_t>(got, lead);
    return Status::Error(EIO, "short read from " + FdPathForLog(direct_.get()) + " at offset " + std::to_string(off) +
                                  ": got " + std::to_string(got_asked) + " of " + std::to_string(len) + " bytes");
  }
  return std::span<const uint8_t>(room.data() + lead, len);
}

}  // namespace ckptfs
