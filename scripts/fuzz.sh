#!/usr/bin/env bash
# towerpack: build the libFuzzer targets of fuzz/ (clang, ASan+UBSan) and
# run each for a given time, one after the other. New inputs go to a
# working corpus under the build dir; the seeds are read, never written:
#   fuzz/corpus/<target>/    what fuzz/gen_corpus.c writes, nothing else
#                            (--regen empties it and writes it again)
#   fuzz/handmade/<target>/  what it does not make, which --regen leaves
#                            alone: regress-* (inputs of fixed findings),
#                            Python's pickles, hand-written reports
# A crash, leak, sanitizer report or timeout leaves its input in
# BUILD/fuzz-artifacts/<target>/ and fails the script.
#
#   scripts/fuzz.sh                 60 s per target, every target
#   scripts/fuzz.sh 600 wire idx    10 minutes each for two targets
#   scripts/fuzz.sh --regen         rewrite fuzz/corpus with fuzz/gen_corpus.c
#
# Environment: TP_FUZZ_BUILD (build dir, default build-fuzz), TP_FUZZ_ARGS
# (extra libFuzzer flags). Targets: wire idx safetensors spec stats lmdb
# pickle msgpack zmq_ops image report comps.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${TP_FUZZ_BUILD:-build-fuzz}
jobs=$(nproc 2>/dev/null || echo 2)
all_targets=(wire idx safetensors spec stats lmdb pickle msgpack zmq_ops image report comps)

regen=0
if [ "${1:-}" = "--regen" ]; then regen=1; shift; fi
secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=("${all_targets[@]}"); fi
case "$secs" in ''|*[!0-9]*) echo "fuzz.sh: seconds must be a number, got '$secs'" >&2; exit 2;; esac

cc=${CC:-}
if [ -z "$cc" ]; then
  for c in clang clang-14; do if command -v "$c" >/dev/null; then cc=$c; break; fi; done
fi
if [ -z "$cc" ]; then
  echo "fuzz.sh: clang not found (apt-get install clang libclang-rt-dev)" >&2; exit 1
fi
# libFuzzer's runtime ships separately from the compiler on Debian.
if ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
     "$cc" -x c -fsanitize=fuzzer -o /dev/null - 2>/dev/null; then
  echo "fuzz.sh: $cc cannot link -fsanitize=fuzzer (apt-get install libclang-rt-dev)" >&2
  exit 1
fi

CC=$cc cmake -S . -B "$build" -DTP_FUZZ=ON -DTP_WITH_CUDA=OFF \
  -DTP_BUILD_TESTS=OFF -DTP_BUILD_TOOLS=OFF -DTP_BUILD_EXAMPLES=OFF -DTP_BUILD_BENCH=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
if [ $regen -eq 1 ]; then
  cmake --build "$build" -j"$jobs" --target gen_corpus
  # fuzz/corpus is gen_corpus's alone: a seed it no longer writes goes too
  # (fuzz/handmade/, the seeds it does not make, is not touched)
  rm -rf fuzz/corpus
  "$build/bin/gen_corpus" fuzz/corpus
  echo "fuzz.sh: wrote $(find fuzz/corpus -type f | wc -l) seeds to fuzz/corpus" \
       "(fuzz/handmade: $(find fuzz/handmade -type f | wc -l), left alone)"
  exit 0
fi
cmake --build "$build" -j"$jobs" --target $(printf 'fuzz_%s ' "${targets[@]}")

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
printf '\n%-12s %10s %8s %6s %7s  %s\n' target execs exec/s cov corpus result
for t in "${targets[@]}"; do
  bin="$root/$build/bin/fuzz_$t"
  seeds=()  # the seed folders the target has (libFuzzer fails on a missing one)
  for d in "$root/fuzz/corpus/$t" "$root/fuzz/handmade/$t"; do
    if [ -d "$d" ]; then seeds+=("$d"); fi
  done
  work="$root/$build/fuzz-corpus/$t"
  art="$root/$build/fuzz-artifacts/$t"
  log="$root/$build/fuzz-logs/$t.log"
  [ -x "$bin" ] || { echo "fuzz.sh: no target '$t' (known: ${all_targets[*]})" >&2; exit 2; }
  mkdir -p "$work" "$art" "$(dirname "$log")"
  dict=()
  if [ -f "$root/fuzz/$t.dict" ]; then dict=(-dict="$root/fuzz/$t.dict"); fi
  set +e
  # shellcheck disable=SC2086
  "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
     -print_final_stats=1 -artifact_prefix="$art/" "${dict[@]}" \
     ${TP_FUZZ_ARGS:-} "$work" ${seeds[@]+"${seeds[@]}"} >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  corp=$(find "$work" -type f | wc -l)
  if [ $rc -eq 0 ]; then res=ok; else res="FAILED (rc $rc, see $log)"; failed+=("$t"); fi
  printf '%-12s %10s %8s %6s %7s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "$corp" "$res"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: findings in: ${failed[*]} (inputs in $build/fuzz-artifacts/)" >&2
  for t in "${failed[@]}"; do
    echo "---- $t (last lines of $build/fuzz-logs/$t.log)" >&2
    grep -v '^#' "$build/fuzz-logs/$t.log" | tail -25 >&2
  done
  exit 1
fi
echo "fuzz.sh: no findings (${#targets[@]} target(s), $secs s each)"
