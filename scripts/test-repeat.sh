#!/usr/bin/env bash
# towerpack: the hunt for tests that fail by chance. Builds the three test
# builds of the README's test command once (build, build-asan, build-tsan),
# then runs each suite's ctest N rounds in a row, optionally beside a CPU
# load, and counts every failure by test. A test that fails even once is a
# bug (in the test or the code): the logs of failing rounds are kept.
#
#   bash scripts/test-repeat.sh                          20 rounds of each suite
#   bash scripts/test-repeat.sh --rounds 5 --load        beside stress-ng --cpu NPROC
#   bash scripts/test-repeat.sh --suites "asan" --jobs 4 oversubscribed ctest
#   bash scripts/test-repeat.sh --no-build               reuse the builds as they are
#   bash scripts/test-repeat.sh --suites asan --tests 'test_actor|test_supervisor'
#                                                        only the ctest entries matching
#
# Prints one line per round and a summary table (also written, in Markdown,
# to build/test-repeat/summary.md); exits 1 when any round failed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rounds=20
load=0
suites="normal asan tsan"
jobs=$(nproc 2>/dev/null || echo 2)
do_build=1
tests=""      # a ctest -R regex: only these entries (empty: all)
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?--rounds needs a number}; shift 2;;
    --load) load=1; shift;;
    --suites) suites=${2:?--suites needs a list}; shift 2;;
    --jobs) jobs=${2:?--jobs needs a number}; shift 2;;
    --no-build) do_build=0; shift;;
    --tests) tests=${2:?--tests needs a ctest regex}; shift 2;;
    -h|--help) usage 0;;
    *) echo "test-repeat.sh: unknown argument '$1'" >&2; usage 2 >&2;;
  esac
done
case "$rounds$jobs" in *[!0-9]*|'') echo "test-repeat.sh: --rounds and --jobs take numbers" >&2; exit 2;; esac

out=$root/build/test-repeat
mkdir -p "$out"
declare -A dir=([normal]=build [asan]=build-asan [tsan]=build-tsan)
declare -A env=([normal]="" [tsan]=""
  [asan]="ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
for s in $suites; do
  [ -n "${dir[$s]:-}" ] || { echo "test-repeat.sh: no suite '$s' (normal asan tsan)" >&2; exit 2; }
done

if [ $do_build -eq 1 ]; then
  bash scripts/install-deps.sh >/dev/null
  for s in $suites; do
    case $s in
      normal) opts=(-DTP_WITH_CUDA=AUTO);;
      asan) opts=(-DTP_WITH_CUDA=OFF -DTP_SANITIZE=address -DCMAKE_BUILD_TYPE=Debug);;
      tsan) opts=(-DTP_WITH_CUDA=OFF -DTP_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug
                  -DTP_BUILD_TOOLS=OFF);;
    esac
    echo "test-repeat: building ${dir[$s]}"
    cmake -S . -B "${dir[$s]}" "${opts[@]}" >"$out/build-$s.log" 2>&1
    cmake --build "${dir[$s]}" -j"$(nproc)" >>"$out/build-$s.log" 2>&1 ||
      { echo "test-repeat: build of ${dir[$s]} failed, see $out/build-$s.log" >&2; exit 1; }
  done
fi

stress_pid=""
stop_load() { if [ -n "$stress_pid" ]; then kill "$stress_pid" 2>/dev/null || true; wait "$stress_pid" 2>/dev/null || true; fi; }
trap stop_load EXIT
if [ $load -eq 1 ]; then
  command -v stress-ng >/dev/null || { echo "test-repeat.sh: --load needs stress-ng (apt-get install stress-ng)" >&2; exit 2; }
  stress-ng --cpu "$(nproc)" --timeout 0 >/dev/null 2>&1 &
  stress_pid=$!
fi

declare -A fails=() rounds_failed=() secs_total=() ntests=()
total_fail=0
start_all=$(date +%s)
for s in $suites; do
  rounds_failed[$s]=0 secs_total[$s]=0
  for r in $(seq 1 "$rounds"); do
    t0=$(date +%s)
    log=$out/$s-round$r.log
    # shellcheck disable=SC2086
    (cd "${dir[$s]}" && env ${env[$s]} ctest --output-on-failure -j"$jobs" ${tests:+-R "$tests"}) >"$log" 2>&1 &&
      rc=0 || rc=$?
    dt=$(( $(date +%s) - t0 ))
    secs_total[$s]=$(( ${secs_total[$s]} + dt ))
    n=$(sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' "$log" | tail -1)
    ntests[$s]=${n:-?}
    if [ $rc -eq 0 ]; then
      rm -f "$log"
      echo "test-repeat: $s round $r/$rounds: ${n:-?} tests passed (${dt}s)"
    else
      names=$(sed -n '/The following tests FAILED/,$p' "$log" |
              sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\) .*/\1/p')
      for t in ${names:-"(ctest exit $rc)"}; do fails[$s:$t]=$(( ${fails[$s:$t]:-0} + 1 )); done
      rounds_failed[$s]=$(( ${rounds_failed[$s]} + 1 ))
      total_fail=$(( total_fail + 1 ))
      echo "test-repeat: $s round $r/$rounds: FAILED: $(echo $names) (${dt}s; log $log)"
    fi
  done
done
stop_load
stress_pid=""

{
  echo "| suite | rounds | tests each | rounds failed | mean round | failing tests (times) |"
  echo "| --- | --- | --- | --- | --- | --- |"
  for s in $suites; do
    list=""
    for k in "${!fails[@]}"; do
      [ "${k%%:*}" = "$s" ] && list+="${k#*:} (${fails[$k]}), "
    done
    list=${list%, }
    echo "| $s | $rounds | ${ntests[$s]} | ${rounds_failed[$s]} | $(( ${secs_total[$s]} / rounds )) s | ${list:-none} |"
  done
  echo
  echo "ctest -j$jobs${tests:+ -R '$tests'}, load: $([ $load -eq 1 ] && echo "stress-ng --cpu $(nproc)" || echo none)," \
       "$(nproc) cores, $(( $(date +%s) - start_all )) s in all, $(git rev-parse --short HEAD)$(git diff --quiet || echo +changes)"
} | tee "$out/summary.md"
[ $total_fail -eq 0 ]
