#!/usr/bin/env bash
# towerpack: the test command. On a fresh Debian machine it installs the
# dependencies, then runs five phases, each logged in full under
# build/test-logs/<phase>.log:
#
#   normal    build (with the CUDA backend when nvcc is there) and every test
#   memcheck  valgrind memcheck on a tiny run of the main job (scripts/valgrind.sh)
#   asan      rebuild under AddressSanitizer + UndefinedBehaviorSanitizer, every test
#   tsan      rebuild under ThreadSanitizer, the concurrent suites
#   fuzz      a short libFuzzer run of every decoder (scripts/fuzz.sh)
#
# Its last line is the verdict. On success: the tests run and the time of
# each phase. On failure (exit 1): the phase, the failing tests and the log.
#
#   bash scripts/test.sh                   everything
#   TP_TEST_QUICK=1 bash scripts/test.sh   the normal phase only
#   TP_TEST_PHASES="normal asan" bash scripts/test.sh   these phases only
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=$(nproc 2>/dev/null || echo 2)
logs=$root/build/test-logs

bash scripts/install-deps.sh

werror=OFF
if [ -n "${CI:-}" ]; then werror=ON; fi
phases=${TP_TEST_PHASES:-normal memcheck asan tsan fuzz}
if [ -n "${TP_TEST_QUICK:-}" ]; then phases=normal; fi
mkdir -p "$logs"

summary=()    # one "phase: N tests, T s" entry per phase that passed
failed=""     # what failed: set by the phase that failed

# ctest in build dir $1 with env; sets `count` and, on failure, `failed`.
run_ctest() {
  local dir=$1 out rc
  shift
  out=$(cd "$dir" && env "$@" ctest --output-on-failure -j"$jobs" 2>&1) && rc=0 || rc=$?
  printf '%s\n' "$out"
  count=$(printf '%s\n' "$out" | sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' | tail -1)
  if [ $rc -ne 0 ]; then
    local names
    names=$(printf '%s\n' "$out" | sed -n '/The following tests FAILED/,$p' |
            sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\) .*/\1/p' | paste -sd' ' -)
    failed="tests ${names:-(ctest exit $rc, no test named)}"
    return 1
  fi
}

build() {  # build dir, cmake options...
  local dir=$1
  shift
  if ! cmake -S . -B "$dir" -DTP_WERROR=$werror "$@" || ! cmake --build "$dir" -j"$jobs"; then
    failed="the build of $dir"
    return 1
  fi
}

phase_normal() {
  build build -DTP_WITH_CUDA=AUTO || return 1
  run_ctest build
}

phase_memcheck() {
  if ! bash scripts/valgrind.sh; then
    failed="tp-train under valgrind memcheck"
    return 1
  fi
  count=1 unit=run
}

phase_asan() {
  build build-asan -DTP_WITH_CUDA=OFF -DTP_SANITIZE=address -DCMAKE_BUILD_TYPE=Debug ||
    return 1
  # Criterion forks per test; leak checking happens in each child.
  run_ctest build-asan ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
}

phase_tsan() {
  build build-tsan -DTP_WITH_CUDA=OFF -DTP_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug \
    -DTP_BUILD_TOOLS=OFF || return 1
  run_ctest build-tsan
}

phase_fuzz() {
  local out rc
  out=$(bash scripts/fuzz.sh 10 2>&1) && rc=0 || rc=$?
  printf '%s\n' "$out"
  count=$(printf '%s\n' "$out" | sed -n 's/.*no findings (\([0-9]*\) target.*/\1/p')
  unit=targets
  if [ $rc -ne 0 ]; then
    failed="fuzz targets $(printf '%s\n' "$out" | sed -n 's/.*findings in: \([^(]*\).*/\1/p')"
    return 1
  fi
}

for p in $phases; do
  declare -F "phase_$p" >/dev/null || { echo "test.sh: no phase '$p'" >&2; exit 2; }
  log=$logs/$p.log
  printf '\n==== phase %s (log: %s) ====\n' "$p" "${log#"$root"/}"
  count=0 unit=tests
  start=$(date +%s)
  # The phase runs in this shell (it sets count and failed), as a condition
  # so that errexit stays out of it; its output goes to the terminal and to
  # its log.
  exec 3>&1
  phase_"$p" > >(tee "$log" >&3) 2>&1 && rc=0 || rc=$?
  exec 3>&-
  secs=$(( $(date +%s) - start ))
  wait $! 2>/dev/null || true  # tee has written the whole log
  if [ $rc -ne 0 ]; then
    echo "FAILED: phase $p: ${failed:-exit $rc}; full log: ${log#"$root"/} (after ${secs}s)"
    exit 1
  fi
  summary+=("$p ${count:-?} $unit in ${secs}s")
done
line=$(printf '%s, ' "${summary[@]}")
echo "PASSED: ${line%, }"
