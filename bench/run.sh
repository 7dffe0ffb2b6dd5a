#!/usr/bin/env bash
# towerpack peer benchmarks: towerpack against PyTorch and raw libzmq, side
# by side in one run (bench/README.md says what each comparison measures).
#
#   bash bench/run.sh --quick      under 5 minutes: shorter runs, fewer rounds
#   bash bench/run.sh              the full run (under 30 minutes)
#   bash bench/run.sh --no-docs    do not rewrite docs/performance.md
#   bash bench/run.sh --only transport,loading,training,engine
#
# It installs the peers it needs (Debian's python3-torch and python3-numpy:
# benchmark-only, not part of scripts/install-deps.sh), builds towerpack
# (Release) when needed, runs every comparison, prints a table of ratios and
# rewrites the "Peer benchmarks" section of docs/performance.md with the
# date, the machine and the command. Raw results: bench/results/last.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
jobs=$(nproc 2>/dev/null || echo 2)

# The system Python: Debian's torch is installed for it, not for a pyenv
# or virtualenv python that may come first on PATH.
PY=/usr/bin/python3
if ! "$PY" -c 'import torch, numpy' >/dev/null 2>&1; then
  echo "bench/run.sh: installing the peers (python3-torch, python3-numpy)" >&2
  bench_install python3-torch python3-numpy
fi

# towerpack itself: the same Release build as scripts/train.sh.
bench_release_build "$jobs" tp-bench tp-train

exec "$PY" bench/bench.py --bin build-release/bin --command "bash bench/run.sh $*" "$@"
