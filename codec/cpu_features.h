// What the CPU running the codec can do, asked once. Hot loops have SSSE3
// and AVX2 versions beside the portable ones, chosen at run time, so that
// one build runs on every x86-64 machine and decodes to the same bytes.
#pragma once

namespace ckptfs {

inline bool CpuHasSsse3() {
#if defined(__x86_64__)
  static const bool have = __builtin_cpu_supports("ssse3");
  return have;
#else
  return false;
#endif
}

inline bool CpuHasAvx2() {
#if defined(__x86_64__)
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
#else
  return false;
#endif
}

}  // namespace ckptfs
