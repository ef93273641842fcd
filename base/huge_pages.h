// Large buffers on transparent huge pages: a mapping of their own, aligned
// to a huge page and marked with madvise(MADV_HUGEPAGE) (best effort: where
// huge pages are off, the buffer works as it is). The kernel pins such a
// buffer for every FUSE reply or O_DIRECT read it serves, and walks one
// page-table entry per 2 MiB instead of 512; a fresh one faults once per
// 2 MiB. Not malloc's heap: madvise marks a whole range, and on the heap
// the mark would outlive the buffer and let the kernel back small
// allocations there with huge pages.
#pragma once

#include <cstddef>

namespace ckptfs {

inline constexpr size_t kHugePage = size_t{2} << 20;

// `bytes` rounded up to whole huge pages.
inline size_t WholeHugePages(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }

// WholeHugePages(bytes) of memory aligned to kHugePage, or nullptr when
// none can be mapped.
void* MapHugePages(size_t bytes);
// Unmaps what MapHugePages(bytes) returned.
void UnmapHugePages(void* p, size_t bytes);

// A buffer of `bytes` aligned to `align` (a power of two up to kHugePage):
// from kHugePage up, MapHugePages'; below, the C heap's. nullptr when there
// is no memory. FreeBuffer(p, bytes) frees it whichever it is.
void* AllocateBuffer(size_t bytes, size_t align);
void FreeBuffer(void* p, size_t bytes);

}  // namespace ckptfs
