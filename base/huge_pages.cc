#include "base/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace ckptfs {

void* MapHugePages(size_t bytes) {
  const size_t whole = WholeHugePages(bytes);
  // One huge page more than needed, then what lies before and after the
  // aligned range is unmapped.
  void* m = ::mmap(nullptr, whole + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const uintptr_t at = reinterpret_cast<uintptr_t>(m);
  const uintptr_t aligned = (at + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > at) ::munmap(m, aligned - at);
  if (const size_t after = at + whole + kHugePage - (aligned + whole); after > 0) {
    ::munmap(reinterpret_cast<void*>(aligned + whole), after);
  }
  void* p = reinterpret_cast<void*>(aligned);
  (void)::madvise(p, whole, MADV_HUGEPAGE);
  return p;
}

void UnmapHugePages(void* p, size_t bytes) {
  if (p != nullptr) ::munmap(p, WholeHugePages(bytes));
}

void* AllocateBuffer(size_t bytes, size_t align) {
  if (bytes >= kHugePage) return MapHugePages(bytes);
  // aligned_alloc wants a whole number of alignments, and at least one.
  return std::aligned_alloc(align, (std::max<size_t>(bytes, 1) + align - 1) / align * align);
}

void FreeBuffer(void* p, size_t bytes) {
  if (bytes >= kHugePage) return UnmapHugePages(p, bytes);
  std::free(p);
}

}  // namespace ckptfs
