#!/usr/bin/env bash
# towerpack: the tp-top samples in the docs, regenerated from real runs so
# they cannot go stale. Each sample sits between two markers,
#   <!-- tp-top:NAME -->  ...  <!-- /tp-top:NAME -->
# and is replaced whole (the fenced output and a line that says how and at
# which commit it was made). NAME is
#   forked  tp-train with two towers fed by two forked dataflow workers
#   remote  tp-train --remote fed by two tp-worker processes
#   mpi     mpirun -np 2 tp-train: tp-top merging both ranks (skipped, the
#           sample kept, without mpirun or the MPI module)
# tests/tools/test_proc_docs_snapshots.c checks that every marked sample has
# tp-top's current columns (tp-top --columns).
#
#   scripts/docs-snapshots.sh              rewrite the samples (about 45 s)
#   scripts/docs-snapshots.sh mpi          only those named
#   TP_BUILD=build-release scripts/docs-snapshots.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TP_BUILD:-build}
bin=$build/bin
for t in tp-train tp-top tp-worker; do
  [ -x "$bin/$t" ] || { echo "docs-snapshots.sh: $bin/$t is missing:" \
    "cmake --build $build --target tp-train tp-top tp-worker" >&2; exit 1; }
done
docs=(docs/actors.md docs/tuning.md docs/observability.md docs/distributed.md)
want=" ${*:-forked remote mpi} "
wanted() { [[ $want == *" $1 "* ]]; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tp-docs-XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
test_spec='fashion-mnist:test,shuffle=0 | batch 500 | fixed-size 2'

wait_for() {  # a file, at most 60 s
  for _ in $(seq 600); do [ -e "$1" ] && return 0; sleep 0.1; done
  echo "docs-snapshots.sh: $1 did not appear in 60 s" >&2
  exit 1
}

# snapshot NAME SECONDS COMMAND PATTERN COUNT: the tp-top sample of a job
# (the first one, SECONDS or later, with COUNT rows matching PATTERN with a
# rate: on a busy host processes take a while to start) and its caption
snapshot() {
  local name=$1 secs=$2 cmd=$3 pattern=$4 count=$5
  sleep "$secs"
  for _ in $(seq 30); do
    "$bin/tp-top" --connect "ipc://$tmp/$name/stats.sock" --once > "$tmp/$name.txt"
    [ "$(grep -E "$pattern" "$tmp/$name.txt" | grep -cv ' 0\.0 *0\.00 ')" -ge "$count" ] && break
    sleep 1
  done
  {
    echo '```'
    cat "$tmp/$name.txt"
    echo '```'
    echo
    echo "(Made by \`scripts/docs-snapshots.sh\` at $commit: \`$cmd\`, then"
    echo "\`tp-top --connect ipc://LOGDIR/stats.sock --once\` once every row had a"
    echo "rate, at least ${secs} s after the statistics socket appeared; $(nproc) cores.)"
  } > "$tmp/$name.block"
}

# forked: two towers, two forked readers
if wanted forked; then
cmd="tp-train --model cnn --towers 2 --workers 2 --batch 64 --threads 1 --epochs 1 --steps-per-epoch 300"
"$bin/tp-train" --model cnn --towers 2 --workers 2 --batch 64 --threads 1 --epochs 1 \
  --steps-per-epoch 300 --test-spec "$test_spec" --logdir "$tmp/forked" >/dev/null 2>&1 &
pids+=($!)
wait_for "$tmp/forked/stats.sock"
snapshot forked 6 "$cmd" "^(dataflow worker|tower)" 4
kill "${pids[-1]}"; wait "${pids[-1]}" || true
fi

# remote: the trainer binds, two tp-worker processes connect
if wanted remote; then
data="ipc://$tmp/data.sock"
cmd="tp-train --model mlp --augment --batch 64 --threads 1 --remote @ipc://DATA and 2 x tp-worker --spec 'fashion-mnist:train | augment crop=28,pad=2,flip | batch 64' --connect ipc://DATA"
"$bin/tp-train" --model mlp --augment --batch 64 --threads 1 --epochs 1 \
  --steps-per-epoch 100000 --remote "@$data" --test-spec "$test_spec" \
  --logdir "$tmp/remote" >/dev/null 2>&1 &
pids+=($!)
wait_for "$tmp/remote/stats.sock"
for _ in 1 2; do
  "$bin/tp-worker" --spec 'fashion-mnist:train | augment crop=28,pad=2,flip | batch 64' \
    --connect "$data" >/dev/null 2>&1 &
  pids+=($!)
done
snapshot remote 4 "$cmd" "^(tp-worker|tower)" 4
fi

# mpi: two ranks of one host, tp-top over rank 0's socket merging rank 1's
if wanted mpi && command -v mpirun >/dev/null && [ -e "$build/lib/libtowerpack_mpi.so" ]; then
  mpirun=(mpirun --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none)
  [ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
  cmd="mpirun -np 2 tp-train --model mlp --towers 1 --batch 64 --threads 1"
  "${mpirun[@]}" -np 2 "$bin/tp-train" --model mlp --towers 1 --batch 64 --threads 1 \
    --epochs 1 --steps-per-epoch 1000000 --test-spec "$test_spec" \
    --logdir "$tmp/mpi" >/dev/null 2>&1 &
  pids+=($!)
  wait_for "$tmp/mpi/stats.sock"
  wait_for "$tmp/mpi/stats-rank1.sock"
  snapshot mpi 4 "$cmd" "^[01] +(tower|all-reduce)" 4
fi

# replace each marked block in the docs
for f in "${docs[@]}"; do
  [ -f "$f" ] || continue
  awk -v dir="$tmp" '
    match($0, /^<!-- tp-top:[a-z]+ -->$/) {
      name = substr($0, 13, RLENGTH - 16)
      print
      if ((getline line < (dir "/" name ".block")) <= 0)
        next  # not made this time: the sample stays
      print line
      while ((getline line < (dir "/" name ".block")) > 0) print line
      close(dir "/" name ".block")
      skipping = 1
      next
    }
    skipping && $0 ~ /^<!-- \/tp-top:[a-z]+ -->$/ { skipping = 0 }
    !skipping { print }
  ' "$f" > "$tmp/out.md"
  if ! cmp -s "$f" "$tmp/out.md"; then
    cp "$tmp/out.md" "$f"
    echo "docs-snapshots.sh: rewrote the samples in $f"
  fi
done
