#!/usr/bin/env bash
# towerpack: the main job. On a fresh Debian machine it installs the
# dependencies, builds towerpack (Release, CPU; the CUDA backend too when
# nvcc is there and the machine has an NVIDIA GPU, so that --devices can
# use it), and trains the default model on Fashion-MNIST on the CPU,
# validating after every epoch. Extra arguments go to tp-train, e.g.
#   bash scripts/train.sh --model mlp --epochs 10
# Without --logdir (or --logdir=DIR) the run goes to train_log/main, an
# earlier one there moved aside first.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

bash scripts/install-deps.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DTP_WITH_CUDA=AUTO \
      -DTP_BUILD_TESTS=OFF >/dev/null
targets=(tp-train tp-plot)
# the CUDA module is loaded at run time, so no tool depends on it: build it
# where a GPU can run it (configured only when nvcc was found)
if nvidia-smi -L >/dev/null 2>&1 &&
   cmake --build build-release --target help 2>/dev/null | grep -qw towerpack_cuda; then
  targets+=(towerpack_cuda)
fi
cmake --build build-release -j"$jobs" --target "${targets[@]}" >/dev/null

logdir=train_log/main
args=("$@")
has_logdir=0
for a in "${args[@]}"; do
  case $a in --logdir | --logdir=*) has_logdir=1 ;; esac
done
if [ $has_logdir -eq 0 ]; then
  args+=(--logdir "$logdir" --logdir-action backup)
fi
exec build-release/bin/tp-train "${args[@]}"
