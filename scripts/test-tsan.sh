#!/usr/bin/env bash
# The C++ unit tests under ThreadSanitizer: builds only unit_tests into
# ./build-tsan (-DCKPTFS_SANITIZE=thread, no CUDA) and runs them; any race
# report fails the run. scripts/test.sh runs this after the plain unit tests.
# Extra arguments go to unit_tests, e.g. --gtest_filter='CacheTest.*'.
#
# What runs: every suite with threads in it or under it: seal workers,
# the chunk cache, the store (background GC, recovery), fault, crash and
# power-loss matrices (FileContent included), lineage, lossy, the compute
# devices. Left out (TSAN_EXCLUDED) are the single-threaded codec suites:
# format parsers, pickle scanning, the lossless plane codec (rANS, lanes,
# grid), tensor and delta chunks with their malformed-input sweeps, zip
# CRCs, the TF bundle reader, roles. They run no threads of their own, the
# threaded suites run the same code through the store, and under TSan they
# cost about 3 of the 8 minutes a full run takes on 2 busy cores. The full
# set is clean too: pass --gtest_filter='*' to run it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
JOBS="${JOBS:-2}"

TSAN_EXCLUDED="FormatsTest.*:FormatsRealFilesTest.*:PickleScanTest.*:PickleLabelTest.*:PlaneCodecTest.*:RansTest.*"
TSAN_EXCLUDED+=":EntropyTest.*:LanesTest.*:GridTest.*:GridHintTest.*:CutChunkTest.*:TensorChunkTest.*"
TSAN_EXCLUDED+=":TensorChunkMalformedTest.*:DeltaChunkTest.*:DeltaChunkMalformedTest.*:ZipCrcTest.*:TfBundleTest.*"
TSAN_EXCLUDED+=":TfBundleRealFilesTest.*:CodecTest.*:RolesTest.*:DTypeTest.*:FloatBits.*"

if [[ ! -f build-tsan/CMakeCache.txt ]]; then
  echo "tsan: configuring build-tsan" >&2
  clog="$(mktemp)"
  if ! cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTFS_SANITIZE=thread -DCKPTFS_WITH_CUDA=OFF \
      >"$clog" 2>&1; then
    cat "$clog" >&2; rm -f "$clog"; echo "tsan: configure FAILED" >&2; exit 1
  fi
  rm -f "$clog"
fi
echo "tsan: compiling unit_tests with -j$JOBS" >&2
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! cmake --build build-tsan -j"$JOBS" --target unit_tests >"$log" 2>&1; then
  cat "$log" >&2
  echo "tsan: build FAILED" >&2
  exit 1
fi

# halt_on_error: the first race fails the run, with its report last in the log.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$ROOT/tests/tsan.supp ${TSAN_OPTIONS:-}"
filter="-${TSAN_EXCLUDED}"
for a in "$@"; do [[ "$a" == --gtest_filter=* ]] && filter=""; done
args=()
[[ -n "$filter" ]] && args+=(--gtest_filter="$filter")
# From the test binary's directory, as ctest runs it (test data paths).
cd build-tsan/tests
run=(./unit_tests --gtest_brief=1 "${args[@]}" "$@")
# TSan needs the lower ASLR entropy of older kernels; setarch -R turns
# randomisation off for this process only, where the kernel gives more.
if [[ "$(sysctl -n vm.mmap_rnd_bits 2>/dev/null || echo 28)" -gt 28 ]] && command -v setarch >/dev/null; then
  run=(setarch "$(uname -m)" -R "${run[@]}")
fi
"${run[@]}"
