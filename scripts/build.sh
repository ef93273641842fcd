#!/usr/bin/env bash
# Configures (RelWithDebInfo) into ./build and builds with at most 2 jobs.
# Extra arguments are passed to the cmake configure step.
# JOBS=N overrides the job count.
set -euo pipefail
# ccache hashes the build directory into objects with debug info unless told
# not to; without this, ./build's objects never serve ./build-norados.
export CCACHE_NOHASHDIR=1

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
JOBS="${JOBS:-2}"
BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}"

if [[ ! -f build/CMakeCache.txt ]] || (($#)); then
  echo "build: configuring ($BUILD_TYPE)" >&2
  clog="$(mktemp)"
  if ! cmake -S . -B build -DCMAKE_BUILD_TYPE="$BUILD_TYPE" "$@" >"$clog" 2>&1; then
    cat "$clog" >&2; rm -f "$clog"; echo "build: configure FAILED" >&2; exit 1
  fi
  rm -f "$clog"
fi

echo "build: compiling with -j$JOBS" >&2
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! cmake --build build -j"$JOBS" >"$log" 2>&1; then
  cat "$log" >&2
  echo "build: FAILED" >&2
  exit 1
fi
# Surface compiler warnings without the progress noise.
grep -E 'warning:' "$log" | sort -u | head -50 >&2 || true
test -x build/ckptfs || { echo "build: build/ckptfs was not produced" >&2; exit 1; }
# Whether the CUDA device was built (it is when CMake finds nvcc).
if [[ -f build/gpu/CMakeFiles/ckptfs_gpu.dir/kernels.cu.o ]]; then
  echo "build: CUDA device built ($(grep -m1 -o 'arch=compute_[0-9]*,code=\[[^]]*\]' build/gpu/CMakeFiles/ckptfs_gpu.dir/flags.make || echo 'nvcc'))" >&2
else
  echo "build: no nvcc found: built without the CUDA device (every job runs on the CPU)" >&2
fi
echo "build: ok (build/ckptfs)" >&2
