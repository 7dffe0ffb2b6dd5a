#!/usr/bin/env bash
# bench/images/resnet18_step.sh: ResNet-18's training step at 112 px, batch
# 16, one thread, towerpack against PyTorch by CPU time (a process's CPU
# clock, which another process's load moves far less than the wall clock:
# the figure to trust on a shared machine). Runs BUILD/bench/resnet18_step
# (BUILD default build/, a configured cmake build dir), the bench target of
# bench/CMakeLists.txt, which it first brings up to date with cmake --build
# (the project's flags, relinked when the library changed), then
# ROUNDS rounds (default 3) alternating the sides, the order reversed each
# round; prints each run's JSON and the median of the rounds' ratios
# (towerpack's fastest step's CPU ms / PyTorch's). The options after --
# go to both sides (--profile and --profile-nodes to towerpack's only), e.g. the zoo's
# CIFAR-style ResNet on Fashion-MNIST's shape (issue 49's ResNet row):
#
#   bash bench/images/resnet18_step.sh [ROUNDS] [BUILD] [-- resnet18_step options]
#   bash bench/images/resnet18_step.sh 3 build -- --model resnet --size 28 --channels 1 \
#        --classes 10 --batch 128
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
build=${2:-build}
shift $(( $# > 2 ? 2 : $# ))
[ "${1:-}" = "--" ] && shift
if [ ! -f "$build/CMakeCache.txt" ]; then
  echo "resnet18_step.sh: $build is not a cmake build dir (configure it: cmake -S . -B $build)" >&2
  exit 2
fi
cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)" --target resnet18_step >/dev/null
torch_args=()
for a in "$@"; do [ "$a" = --profile ] || [ "$a" = --profile-nodes ] || [ "$a" = --l2-op ] || [ "$a" = --costs ] || torch_args+=("$a"); done
ratios=()
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order="tp torch"; else order="torch tp"; fi
  for side in $order; do
    if [ "$side" = tp ]; then
      tp=$(TP_LOG_LEVEL=warn "$build/bench/resnet18_step" "$@" | tail -1)
      echo "round $r (load $(cut -d' ' -f1 /proc/loadavg)): $tp"
    else
      pt=$(/usr/bin/python3 bench/images/resnet18_step_torch.py ${torch_args[@]+"${torch_args[@]}"} | tail -1)
      echo "round $r (load $(cut -d' ' -f1 /proc/loadavg)): $pt"
    fi
  done
  ratios+=("$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["cpu_ms_min"] / json.loads(sys.argv[2])["cpu_ms_min"])' "$tp" "$pt")")
done
/usr/bin/python3 -c 'import statistics,sys; r=[float(v) for v in sys.argv[1:]]; print("CPU time a step, towerpack / PyTorch: rounds %s; median %.2f" % (", ".join("%.2f" % v for v in r), statistics.median(r)))' "${ratios[@]}"
