#!/usr/bin/env bash
# towerpack: the main job. On a fresh Debian machine it installs the
# dependencies, builds towerpack (Release, CPU; the CUDA backend too when
# nvcc is there), and trains the default model on Fashion-MNIST on the CPU,
# validating after every epoch. Extra arguments go to tp-train, e.g.
#   bash scripts/train.sh --model mlp --epochs 10
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

bash scripts/install-deps.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DTP_WITH_CUDA=AUTO \
      -DTP_BUILD_TESTS=OFF >/dev/null
cmake --build build-release -j"$jobs" --target tp-train tp-plot >/dev/null

logdir=train_log/main
args=("$@")
has_logdir=0
for a in "${args[@]}"; do [ "$a" = "--logdir" ] && has_logdir=1; done
if [ $has_logdir -eq 0 ]; then
  args+=(--logdir "$logdir" --logdir-action backup)
fi
exec build-release/bin/tp-train "${args[@]}"
