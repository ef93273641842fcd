// What the CPU running the codec can do, asked once. Hot loops have SSSE3
// and AVX2 versions beside the portable ones, chosen at run time, so that
// one build runs on every x86-64 machine and decodes to the same bytes.
#pragma once

#include <atomic>

namespace ckptfs {

// Off, every loop chosen at run time takes its baseline version (scalar,
// or SSE2, which every x86-64 CPU has) even where the CPU has more: tests
// check both on machines that have both.
inline std::atomic<bool>& CpuVectorLoopsAllowed() {
  static std::atomic<bool> allowed{true};
  return allowed;
}

#if defined(__x86_64__)
inline bool CpuHasSsse3() {
  static const bool have = __builtin_cpu_supports("ssse3");
  return have && CpuVectorLoopsAllowed().load(std::memory_order_relaxed);
}
inline bool CpuHasAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have && CpuVectorLoopsAllowed().load(std::memory_order_relaxed);
}
#else
inline bool CpuHasSsse3() { return false; }
inline bool CpuHasAvx2() { return false; }
#endif

// Turns the vector loops off while it lives (tests).
class ScopedPortableLoops {
 public:
  ScopedPortableLoops() : was_(CpuVectorLoopsAllowed().exchange(false)) {}
  ~ScopedPortableLoops() { CpuVectorLoopsAllowed().store(was_); }
  ScopedPortableLoops(const ScopedPortableLoops&) = delete;
  ScopedPortableLoops& operator=(const ScopedPortableLoops&) = delete;

 private:
  bool was_;
};

}  // namespace ckptfs
