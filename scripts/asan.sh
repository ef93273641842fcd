#!/usr/bin/env bash
# The C++ unit tests under AddressSanitizer and UndefinedBehaviorSanitizer:
# builds only unit_tests into ./build-asan (-DCKPTFS_SANITIZE=address,undefined,
# which adds -fno-omit-frame-pointer; no CUDA) and runs them with ctest there.
# Any report (out-of-bounds access, use after free, leak, undefined
# behaviour) fails the run. Extra arguments go to ctest, e.g. -R 'CacheTest'.
# Not part of scripts/test.sh: a cold build of every library with these
# flags took over 40 min on the shared 2-core VM, which with the run does not
# fit CI's 90 min beside the ~31 min full run and the TSan step
# (bench/history/2026-12-08-asan.md has the run and what it found).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
JOBS="${JOBS:-2}"

if [[ ! -f build-asan/CMakeCache.txt ]]; then
  echo "asan: configuring build-asan" >&2
  clog="$(mktemp)"
  if ! cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTFS_SANITIZE=address,undefined \
      -DCKPTFS_WITH_CUDA=OFF >"$clog" 2>&1; then
    cat "$clog" >&2; rm -f "$clog"; echo "asan: configure FAILED" >&2; exit 1
  fi
  rm -f "$clog"
fi
echo "asan: compiling unit_tests with -j$JOBS" >&2
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! cmake --build build-asan -j"$JOBS" --target unit_tests >"$log" 2>&1; then
  cat "$log" >&2
  echo "asan: build FAILED" >&2
  exit 1
fi

# UBSan only prints and goes on unless told to halt; ASan halts on its own.
export ASAN_OPTIONS="detect_leaks=1 abort_on_error=0 strict_string_checks=1 ${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1 ${UBSAN_OPTIONS:-}"
ctest --test-dir build-asan --output-on-failure -j"$JOBS" --timeout 900 "$@"
