// Large reads of immutable pack files that bypass the page cache.
//
// On the VMs the benches run on, every page-cache page a read brings in is
// a fresh allocation that costs more CPU than the copy out of it: reading
// a cold 2 GB file cost 1.4-3.1 s of system CPU buffered and 0.06 s with
// O_DIRECT. A pack chunk is read once per decode and its decoded bytes are
// what the caches keep, so the stored bytes gain nothing from the page
// cache. Small reads (headers, tables, base references) stay buffered.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>

#include "base/status.h"
#include "base/unique_fd.h"
#include "base/env.h"

namespace ckptfs {

// A growable buffer aligned for O_DIRECT (DirectReader::kAlign), on huge
// pages from 2 MiB (base/huge_pages.h: the read pins it page by page). Its
// bytes are not zeroed: a vector's resize up would memset what a read then
// overwrites.
class AlignedBuffer {
 public:
  // The first n bytes, grown (contents lost) as needed; empty when out of memory.
  std::span<uint8_t> Get(size_t n);

 private:
  // FreeBuffer of `bytes`, as AllocateBuffer gave them.
  struct Free {
    void operator()(uint8_t* p) const;
    size_t bytes;
  };
  std::unique_ptr<uint8_t, Free> bytes_{nullptr, Free{0}};
  size_t cap_ = 0;
};

class DirectReader {
 public:
  // Reads shorter than this go through the page cache.
  static constexpr size_t kMinDirectRead = 256 << 10;
  static constexpr size_t kAlign = 4096;

  // Opens `fd`'s file again with O_DIRECT; where the file system refuses
  // (tmpfs before Linux 6.6, some FUSE file systems), or `fd` is -1, reads
  // stay buffered.
  DirectReader(Env* env, int fd);

  // Whether a read of `len` bytes should come through ReadExact (O_DIRECT).
  bool Covers(size_t len) const { return direct_.get() >= 0 && len >= kMinDirectRead; }
  // Reads exactly out.size() bytes at `off` through the O_DIRECT handle,
  // by way of an aligned per-thread buffer. Callers check Covers first.
  Status ReadExact(std::span<uint8_t> out, uint64_t off) const;

  // Bytes ReadIn needs for a read of `len`: the read is widened to the
  // kAlign grid on both sides.
  static size_t RoomFor(size_t len) { return len + 2 * kAlign; }
  // Reads exactly `len` bytes at `off` into `room` (kAlign-aligned, at
  // least RoomFor(len) bytes) and returns where in it they landed: no copy
  // out of a bounce buffer. Callers check Covers first.
  Result<std::span<const uint8_t>> ReadIn(std::span<uint8_t> room, uint64_t off, size_t len) const;

 private:
  Env* env_;
  UniqueFd direct_;
};

}  // namespace ckptfs
