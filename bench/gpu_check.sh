#!/usr/bin/env bash
# The GPU check (issue 6), for a machine with one GPU, such as the `device`
# tool's H200. Under 8 minutes there.
#
#   bash bench/gpu_check.sh --prepare   on the build machine: builds gpu-kit/
#       (Release unit_tests and gpu_bench for sm_90 + PTX, stripped, with the
#       shared libraries a bare CUDA image lacks), to carry to the GPU machine
#   bash bench/gpu_check.sh             on the GPU machine: the GPU's name and
#       driver, the device unit tests (parity included), then gpu_bench's
#       table: GB/s end to end, GPU against all cores, lossless and lossy
#
# Without gpu-kit/ it builds there with cmake and nvcc, which needs the
# Debian -dev packages that scripts/install-deps.sh installs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
KIT=gpu-kit
JOBS=$(nproc)

build() {
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build-gpu -j"$JOBS" --target unit_tests gpu_bench
}

if [[ "${1:-}" == --prepare ]]; then
  build
  rm -rf "$KIT"
  mkdir -p "$KIT/bin" "$KIT/lib"
  cp build-gpu/tests/unit_tests build-gpu/bench/gpu_bench "$KIT/bin/"
  strip "$KIT"/bin/*
  # Everything but glibc itself travels: the image may lack or differ.
  for lib in $(ldd "$KIT"/bin/* | awk '/=> \//{print $3}' | sort -u); do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux*) ;;
      *) cp -L "$lib" "$KIT/lib/" ;;
    esac
  done
  du -sh "$KIT"
  exit 0
fi

if [[ -x "$KIT/bin/gpu_bench" ]]; then
  BIN="$KIT/bin"
  export LD_LIBRARY_PATH="$PWD/$KIT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  echo "== no $KIT/: building (needs the packages of scripts/install-deps.sh)"
  build >/dev/null
  BIN=build-gpu
  ln -sf "$PWD/build-gpu/tests/unit_tests" "$PWD/build-gpu/bench/gpu_bench" build-gpu/ 2>/dev/null || true
fi

echo "== GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader ||
  echo "nvidia-smi: not available"
echo "== device unit tests"
timeout 240 "$BIN/unit_tests" --gtest_filter='Device*:Pinned*'
echo "== gpu_bench"
timeout 240 "$BIN/gpu_bench" --mib "${GPU_BENCH_MIB:-2048}" --rounds 2
