#!/usr/bin/env bash
# Soak: runs the crash, power-loss, lifetime and seal-order suites N times
# beside CPU hogs, to catch a test that depends on timing before CI does
# (issue 40: a crash matrix failed under ThreadSanitizer on a loaded
# machine). Not in CI.
#
#   bench/soak_tests.sh [N, default 20]
#
# Each round runs, in turn:
#   plain   build/tests/unit_tests       --gtest_filter=$SOAK_FILTER
#   tsan    build-tsan/tests/unit_tests  --gtest_filter=$SOAK_FILTER (as scripts/test-tsan.sh runs it)
#   pytest  tests/integration/test_seal_order.py and test_lifetime.py (real FUSE mounts, needs root;
#           the daemon is build/ckptfs, or $CKPTFS_BIN as for the integration tests)
# with $SOAK_HOGS busy loops (default 2) spinning for the whole soak.
# SOAK_PARTS picks the parts (default "plain tsan pytest"); SOAK_FILTER the
# unit suites (default: crash, power loss, lifetime).
# Builds nothing: bash scripts/build.sh makes build/, and
#   bash scripts/test-tsan.sh --gtest_filter='LifetimeTest.*'
# makes build-tsan/. Prints a line per run and a tally per part; the log
# of every failed run is kept in bench/out/soak/. Exits 1 if any run failed.
set -euo pipefail

N=${1:-20}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PARTS=${SOAK_PARTS:-plain tsan pytest}
HOGS=${SOAK_HOGS:-2}
FILTER=${SOAK_FILTER:-CrashTest*:PowerLossTest.*:LifetimeTest.*}
PYTHON=${SOAK_PYTHON:-$ROOT/.venv-debian/bin/python}
OUT=$ROOT/bench/out/soak
mkdir -p "$OUT"

for part in $PARTS; do
  case $part in
    plain) need=build/tests/unit_tests ;;
    tsan) need=build-tsan/tests/unit_tests ;;
    pytest) need=${CKPTFS_BIN:-build/ckptfs} ;;
    *) echo "soak: unknown part $part (plain, tsan, pytest)" >&2; exit 2 ;;
  esac
  [[ -x $need ]] || { echo "soak: $need is missing (see the header of $0)" >&2; exit 2; }
done
[[ " $PARTS " != *" pytest "* || -x $PYTHON ]] || { echo "soak: no $PYTHON (SOAK_PYTHON)" >&2; exit 2; }

hogs=()
stop_hogs() {
  for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap stop_hogs EXIT
for ((h = 0; h < HOGS; h++)); do
  (while :; do :; done) &
  hogs+=($!)
done

# As scripts/test-tsan.sh: race reports fail the run; lower ASLR entropy
# where the kernel gives more than TSan maps.
tsan_run=(./unit_tests)
if [[ "$(sysctl -n vm.mmap_rnd_bits 2>/dev/null || echo 28)" -gt 28 ]] && command -v setarch >/dev/null; then
  tsan_run=(setarch "$(uname -m)" -R ./unit_tests)
fi

# As scripts/test.sh: backing stores need a disk file system, not tmpfs.
pytest_args=(-q -p no:cacheprovider)
if [[ "$(stat -f -c %T /tmp 2>/dev/null)" == "tmpfs" ]]; then
  pytest_args+=(--basetemp "$ROOT/build/pytest-tmp")
fi

run_part() {
  local part=$1 log=$2
  case $part in
    plain) (cd build/tests && ./unit_tests --gtest_brief=1 --gtest_filter="$FILTER") ;;
    tsan)
      (cd build-tsan/tests &&
        TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$ROOT/tests/tsan.supp ${TSAN_OPTIONS:-}" \
          "${tsan_run[@]}" --gtest_brief=1 --gtest_filter="$FILTER") ;;
    pytest)
      PYTHONDONTWRITEBYTECODE=1 "$PYTHON" -m pytest "${pytest_args[@]}" \
        tests/integration/test_seal_order.py tests/integration/test_lifetime.py ;;
  esac >"$log" 2>&1
}

declare -A passed failed secs
for part in $PARTS; do passed[$part]=0 failed[$part]=0 secs[$part]=0; done
echo "soak: $N round(s) of [$PARTS] beside $HOGS CPU hog(s), unit filter $FILTER"
for ((r = 1; r <= N; r++)); do
  for part in $PARTS; do
    log=$OUT/$part-$r.log
    start=$SECONDS
    if run_part "$part" "$log"; then
      passed[$part]=$((passed[$part] + 1))
      result=pass
      rm -f "$log"
    else
      failed[$part]=$((failed[$part] + 1))
      result="FAIL (log: ${log#"$ROOT"/})"
    fi
    took=$((SECONDS - start))
    secs[$part]=$((secs[$part] + took))
    echo "round $r/$N $part: $result, ${took} s"
  done
done

echo
echo "| part | runs | passed | failed | seconds per run |"
echo "|---|---|---|---|---|"
status=0
for part in $PARTS; do
  runs=$((passed[$part] + failed[$part]))
  echo "| $part | $runs | ${passed[$part]} | ${failed[$part]} | $((secs[$part] / (runs > 0 ? runs : 1))) |"
  ((failed[$part] == 0)) || status=1
done
exit $status
