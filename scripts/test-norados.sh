#!/usr/bin/env bash
# The build without RADOS (-DCKPTFS_WITH_RADOS=OFF, store/cluster/README.md):
# configures ./build-norados afresh (nothing from ./build is reused),
# builds every target, checks that `ckptfs --version` says -rados,
# and runs every unit test there (the RADOS packs run on the in-memory fake
# pool, tests/unit/fake_rados.h, so they run here too; what needs the real
# client checks the none-backend's refusal instead). The only source that
# differs from ./build is the RADOS client (librados_client_none.cc).
# scripts/test.sh runs this after the other unit tests. Extra arguments go
# to ctest, e.g. -R 'Store|Cluster|Membership|GcLease|PinFile|Rados' for the
# suites that reach cluster mode (15 s instead of 100 s).
set -euo pipefail
# ccache hashes the build directory into objects with debug info unless told
# not to; without this, ./build's objects never serve ./build-norados.
export CCACHE_NOHASHDIR=1

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
JOBS="${JOBS:-2}"
DIR=build-norados

if [[ ! -f $DIR/CMakeCache.txt ]]; then
  echo "norados: configuring $DIR" >&2
  clog="$(mktemp)"
  if ! cmake -S . -B "$DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTFS_WITH_RADOS=OFF \
      >"$clog" 2>&1; then
    cat "$clog" >&2; rm -f "$clog"; echo "norados: configure FAILED" >&2; exit 1
  fi
  rm -f "$clog"
fi
# Every target, the fuzzers too: ctest runs them all (with ccache, only
# what differs from ./build compiles).
echo "norados: compiling with -j$JOBS" >&2
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! cmake --build "$DIR" -j"$JOBS" >"$log" 2>&1; then
  cat "$log" >&2
  echo "norados: build FAILED" >&2
  exit 1
fi
if ! "$DIR/ckptfs" --version | grep -qx 'features: -rados.*'; then
  "$DIR/ckptfs" --version >&2
  echo "norados: ckptfs --version does not say -rados" >&2
  exit 1
fi
ctest --test-dir "$DIR" --output-on-failure -j"$JOBS" --timeout 900 "$@"
