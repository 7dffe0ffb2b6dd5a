#!/usr/bin/env bash
# towerpack: valgrind memcheck on a tiny run of the main job (tp-train on
# Fashion-MNIST: the mlp, one tower, 3 steps, validation on 64 images),
# forked children included. Fails on any memory error and on definitely or
# indirectly lost blocks; reachable blocks at exit are not leaks. Known
# false positives of libraries we do not build are in tests/valgrind.supp.
#
#   scripts/valgrind.sh             build (if needed) and check build/bin/tp-train
#   TP_VALGRIND_BUILD=DIR scripts/valgrind.sh
#   scripts/valgrind.sh --model cnn --steps-per-epoch 2   extra tp-train flags
#
# valgrind runs every thread on one core and emulates the vector units, so
# the run is kept tiny: about 40 s on 2 cores (tp-train and its forked
# CUDA-probe child).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TP_VALGRIND_BUILD:-build}
jobs=$(nproc 2>/dev/null || echo 2)
command -v valgrind >/dev/null || { echo "valgrind.sh: apt-get install valgrind" >&2; exit 1; }

if [ ! -x "$build/bin/tp-train" ]; then
  cmake -S . -B "$build" -DTP_WITH_CUDA=OFF >/dev/null
  cmake --build "$build" -j"$jobs" --target tp-train >/dev/null
fi

out=$(mktemp -d "${TMPDIR:-/tmp}/tp-valgrind-XXXXXX")
trap 'rm -rf "$out"' EXIT
start=$(date +%s)
set +e
# One BLAS thread: under valgrind's one-core scheduler, OpenBLAS's spinning
# worker threads only slow the run down. The dense layers on OpenBLAS
# (TP_CPU_MATMUL=own), as before oneDNN's matmul became the default:
# oneDNN's JIT-generated kernels carry no symbols or unwind tables, and
# their vector loads read up to 32 bytes past the end of oneDNN's own
# buffers (its posix_memalign'ed packing space) and into the stack, which
# memcheck reports with a stack of `???` frames that no suppression can
# name without also hiding towerpack's own 32-byte reads. Valgrind checks
# towerpack's memory; oneDNN's calls are covered by the ASan build's tests
# (test_dnnl_matmul, test_dnnl_conv, test_dnnl_ops).
OPENBLAS_NUM_THREADS=1 TP_CPU_MATMUL=own TP_LOG_LEVEL=warn valgrind \
  --error-exitcode=1 --leak-check=full \
  --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect \
  --trace-children=yes --num-callers=40 \
  --suppressions=tests/valgrind.supp --log-file="$out/vg.%p.log" \
  "$build/bin/tp-train" --model mlp --epochs 1 --steps-per-epoch 3 \
  --batch 16 --towers 1 --threads 1 --logdir "$out/log" \
  --test-spec "fashion-mnist:test,shuffle=0 | fixed-size 64 | batch 64" \
  "$@" >"$out/train.out" 2>&1
rc=$?
set -e
secs=$(( $(date +%s) - start ))
# valgrind's exit code covers the main process; children are in their logs.
bad=$(grep -l -E 'ERROR SUMMARY: [1-9]|definitely lost: [1-9]|indirectly lost: [1-9]' \
        "$out"/vg.*.log 2>/dev/null || true)
nproc_logs=$(ls "$out"/vg.*.log | wc -l)
if [ $rc -ne 0 ] || [ -n "$bad" ]; then
  echo "valgrind.sh: FAILED (tp-train exit $rc, ${secs}s)" >&2
  tail -5 "$out/train.out" >&2
  for f in "$out"/vg.*.log; do [ -s "$f" ] && { echo "---- $f" >&2; cat "$f" >&2; }; done
  exit 1
fi
echo "valgrind.sh: memcheck clean: tp-train and its children ($nproc_logs processes), ${secs}s"
for f in "$out"/vg.*.log; do
  sed -n 's/^==[0-9]*== *\(in use at exit:.*\|total heap usage:.*\)$/  \1/p' "$f"
done
