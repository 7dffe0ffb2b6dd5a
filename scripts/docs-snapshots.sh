#!/usr/bin/env bash
# towerpack: the output samples in the docs, regenerated from real runs so
# they cannot go stale. Each sample sits between two markers,
#   <!-- tp-top:NAME -->  ...  <!-- /tp-top:NAME -->    a tp-top table
#   <!-- output:NAME -->  ...  <!-- /output:NAME -->    lines a program prints
# and is replaced whole (the fenced output, and for tp-top a line that says
# how and at which commit it was made). NAME is
#   forked      tp-train with two towers fed by two forked dataflow workers
#   remote      tp-train --remote fed by two tp-worker processes
#   mpi         mpirun -np 2 tp-train: tp-top merging both ranks
#   mpi-plan    the same run's plan line (rank 0) ...
#   mpi-rank1   ... and rank 1's summary line (all three skipped, the samples
#               kept, without mpirun or the MPI module)
#   unfit       a tp-worker whose datapoints do not fit tp-train --remote:
#               what each side says
#   steps       the first lines of a run's steps.tsv
#   netns       scripts/netns-remote.sh's report (skipped, the sample kept,
#               where it skips: not root, no network namespaces)
#   rank-sh     docs/distributed.md's rank.sh, taken from the page as
#               written, under mpirun -np 2: the plan and the result lines
#   tcp-recipe  docs/distributed.md's data-host recipe on one host (loopback
#               for node1): its commands as written, the trainer's lines
#               (both skipped, the samples kept, without mpirun or the MPI
#               module)
# tests/tools/test_proc_docs_snapshots.c checks that every marked tp-top
# sample has tp-top's current columns (tp-top --columns), and with --check
# that every output block of the four docs below is marked with a NAME
# made here.
#
#   scripts/docs-snapshots.sh              rewrite the samples (about 90 s)
#   scripts/docs-snapshots.sh mpi steps    only those named
#   scripts/docs-snapshots.sh --check      list the docs' output blocks and
#                                          their markers; exit 1 when one
#                                          has none, or a marker no NAME
#   TP_BUILD=build-release scripts/docs-snapshots.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TP_BUILD:-build}
bin=$build/bin
# (TP_DOCS: other files, for the test of --check)
read -r -a docs <<< "${TP_DOCS:-docs/actors.md docs/tuning.md docs/observability.md docs/distributed.md}"
names=" forked remote mpi mpi-plan mpi-rank1 unfit steps netns rank-sh tcp-recipe "

# --check: every fenced block that shows what a program printed (its first
# line is a tp-top header or table, "PROGRAM: ..." or "PROGRAM rank N: ...",
# or steps.tsv's header) must sit between the markers of a NAME above
if [ "${1:-}" = --check ]; then
  awk -v names="$names" '
    FNR == 1 { fence = 0; marker = "" }
    match($0, /^<!-- (tp-top|output):[a-z0-9-]+ -->$/) {
      marker = substr($0, 6, RLENGTH - 9)
      sub(/^[a-z-]+:/, "", marker)
      if (index(names, " " marker " ") == 0) {
        printf "%s:%d: marker %s: no such NAME in scripts/docs-snapshots.sh\n", FILENAME, FNR, marker
        bad++
      }
      next
    }
    /^<!-- \/(tp-top|output):[a-z0-9-]+ -->$/ { marker = ""; next }
    /^```/ { if (!fence) { fence = 1; first = 1 } else fence = 0; next }
    fence && first {
      first = 0
      if ($0 ~ /^(towerpack |RANK ACTOR |ACTOR |global_step\t)/ ||
          $0 ~ /^[A-Za-z][A-Za-z0-9_.-]*( rank [0-9]+)?: /) {
        printf "%s:%d: %-10s %s\n", FILENAME, FNR, marker == "" ? "MISSING" : marker, substr($0, 1, 70)
        if (marker == "") bad++
      }
    }
    END {
      if (bad) print "docs-snapshots.sh: " bad " output block(s) without a snapshot entry (mark them and make them here)"
      exit bad ? 1 : 0
    }
  ' "${docs[@]}"
  exit
fi

for t in tp-train tp-top tp-worker; do
  [ -x "$bin/$t" ] || { echo "docs-snapshots.sh: $bin/$t is missing:" \
    "cmake --build $build --target tp-train tp-top tp-worker" >&2; exit 1; }
done
want=" ${*:-$names} "
abs_bin=$(cd "$bin" && pwd)
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

# block NAME FILE: FILE's lines as the fenced sample NAME (no caption)
block() {
  { echo '```'; cat "$2"; echo '```'; } > "$tmp/$1.block"
}

# mpi-plan, mpi-rank1: a short run of two ranks, its two summary lines
if { wanted mpi-plan || wanted mpi-rank1; } && command -v mpirun >/dev/null &&
   [ -e "$build/lib/libtowerpack_mpi.so" ]; then
  mpirun=(mpirun --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none)
  [ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
  "${mpirun[@]}" -np 2 "$bin/tp-train" --model mlp --towers 1 --batch 32 --threads 1 \
    --epochs 1 --steps-per-epoch 20 --test-spec "$test_spec" --logdir "$tmp/mpi2" \
    > "$tmp/mpi2.txt" 2>&1 || true
  grep -m1 '^tp-train: total batch' "$tmp/mpi2.txt" > "$tmp/mpi-plan.txt" &&
    block mpi-plan "$tmp/mpi-plan.txt"
  grep -m1 '^tp-train rank 1:' "$tmp/mpi2.txt" > "$tmp/mpi-rank1.txt" &&
    block mpi-rank1 "$tmp/mpi-rank1.txt"
fi

# unfit: a tp-worker of float32 images against tp-train --remote (uint8):
# the worker's last line, and the trainer's log line that names it
if wanted unfit; then
  data="ipc://$tmp/unfit.sock"
  TP_LOG_LEVEL=info "$bin/tp-train" --model mlp --batch 8 --threads 1 --epochs 1 \
    --steps-per-epoch 5 --remote "@$data" --test-spec "$test_spec" \
    --logdir "$tmp/unfit" > "$tmp/unfit-train.txt" 2>&1 &
  pids+=($!)
  wait_for "$tmp/unfit/stats.sock"
  "$bin/tp-worker" --spec 'fake:shape=28x28:float32,shape=scalar:int32,size=64 | batch 8' \
    --connect "$data" > "$tmp/unfit-worker.txt" 2>&1 || true
  for _ in $(seq 50); do grep -q 'ends: its datapoints' "$tmp/unfit-train.txt" && break; sleep 0.1; done
  kill "${pids[-1]}" 2>/dev/null || true; wait "${pids[-1]}" 2>/dev/null || true
  # the paths of this run's directory as the docs write them, the log's
  # time, level and source dropped
  { grep -m1 '^tp-worker: send: the receiver' "$tmp/unfit-worker.txt"
    grep -m1 'ends: its datapoints' "$tmp/unfit-train.txt" | sed 's/^.* [a-z_]*\.c:[0-9]* //'
  } | sed "s#$tmp/unfit.sock#/tmp/data.sock#g" > "$tmp/unfit.txt"
  [ "$(wc -l < "$tmp/unfit.txt")" = 2 ] && block unfit "$tmp/unfit.txt"
fi

# steps: a run of 600 steps (points of 3 steps each, as tp-train's 469)
if wanted steps; then
  "$bin/tp-train" --model mlp --batch 64 --threads 1 --epochs 1 --steps-per-epoch 600 \
    --test-spec "$test_spec" --logdir "$tmp/steps" > /dev/null 2>&1
  { head -3 "$tmp/steps/steps.tsv"; echo '...'; } > "$tmp/steps.txt"
  block steps "$tmp/steps.txt"
fi

# netns: the two-host recipe on one host (root and network namespaces)
if wanted netns && [ -x "$bin/tp-keygen" ]; then
  if TP_BUILD=$build scripts/netns-remote.sh > "$tmp/netns.txt" 2>&1 &&
     ! grep -q '^netns-remote.sh: SKIP' "$tmp/netns.txt"; then
    block netns "$tmp/netns.txt"
  else
    echo "docs-snapshots.sh: netns kept: $(tail -1 "$tmp/netns.txt")" >&2
  fi
fi

# rank-sh: the wrapper of docs/distributed.md as the page has it (between
# its "#!/usr/bin/env bash" and the closing fence), two ranks of an MLP
if wanted rank-sh && command -v mpirun >/dev/null && [ -e "$build/lib/libtowerpack_mpi.so" ]; then
  mkdir -p "$tmp/rank-sh"
  awk '/^  #!\/usr\/bin\/env bash$/ { on = 1 } on && /^  ```$/ { exit } on { print substr($0, 3) }' \
    docs/distributed.md > "$tmp/rank-sh/rank.sh"
  chmod +x "$tmp/rank-sh/rank.sh"
  mpirun=(mpirun --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none)
  [ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
  # its ipc endpoints are /tmp/tp-rankR, as the page writes them
  (cd "$tmp/rank-sh" && PATH="$abs_bin:$PATH" TP_LOG_LEVEL=warn "${mpirun[@]}" -np 2 ./rank.sh --model mlp --logdir train_log/mlp2 \
     --epochs 1 --steps-per-epoch 20 --threads 1) > "$tmp/rank-sh.out" 2>&1 || true
  { grep -m1 '^tp-train: total batch' "$tmp/rank-sh.out"
    grep -m1 '^tp-train: test accuracy' "$tmp/rank-sh.out"
  } > "$tmp/rank-sh.txt"
  if [ "$(wc -l < "$tmp/rank-sh.txt")" = 2 ]; then
    block rank-sh "$tmp/rank-sh.txt"
  else
    echo "docs-snapshots.sh: rank-sh: docs/distributed.md's rank.sh failed:" >&2
    tail -20 "$tmp/rank-sh.out" >&2
    exit 1
  fi
fi

# tcp-recipe: the data-host recipe's commands as the page writes them, on
# one host: node1 is 127.0.0.1, two ranks (one worker each), the spec an
# MLP's; the trainer's lines that name each worker joining, and its result
if wanted tcp-recipe && command -v mpirun >/dev/null &&
   [ -e "$build/lib/libtowerpack_mpi.so" ] && [ -x "$bin/tp-keygen" ]; then
  mkdir -p "$tmp/tcp"
  mpirun=(mpirun --oversubscribe --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none)
  [ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
  port=$(( 20000 + RANDOM % 20000 ))
  (
    cd "$tmp/tcp"
    b=$abs_bin
    "$b/tp-keygen" keys/ >/dev/null
    export TP_JOB=docs-$$
    TP_LOG_LEVEL=info "${mpirun[@]}" -np 2 -x TP_JOB -x TP_LOG_LEVEL \
      "$b/tp-train" --remote "@tcp://0.0.0.0:{$port+rank}" --public --curve keys/ \
      --towers 1 --batch 64 --model mlp --logdir train_log/mlp2 --epochs 1 \
      --steps-per-epoch 20 --threads 1 > train.txt 2>&1 &
    t=$!
    for r in 0 1; do
      "$b/tp-worker" --spec 'fashion-mnist:train | batch 64' --seed $r \
        --connect "tcp://127.0.0.1:$((port + r))" --curve keys/ > "worker$r.txt" 2>&1 &
    done
    wait "$t"
  ) || true
  { grep -m1 'remote: tp-worker .* joined' "$tmp/tcp/train.txt" |
      sed 's/^.* [a-z_]*\.c:[0-9]* //'
    grep -m1 '^tp-train: test accuracy' "$tmp/tcp/train.txt"
  } | sed "s/:$port\b/:5550/g; s/:$((port + 1))\b/:5551/g" > "$tmp/tcp-recipe.txt"
  if [ "$(wc -l < "$tmp/tcp-recipe.txt")" = 2 ]; then
    block tcp-recipe "$tmp/tcp-recipe.txt"
  else
    echo "docs-snapshots.sh: tcp-recipe: the data-host recipe failed:" >&2
    tail -20 "$tmp/tcp/train.txt" >&2
    exit 1
  fi
fi

# replace each marked block in the docs
for f in "${docs[@]}"; do
  [ -f "$f" ] || continue
  awk -v dir="$tmp" '
    match($0, /^<!-- (tp-top|output):[a-z0-9-]+ -->$/) {
      name = substr($0, 6, RLENGTH - 9)
      sub(/^[a-z-]+:/, "", name)
      print
      if ((getline line < (dir "/" name ".block")) <= 0)
        next  # not made this time: the sample stays
      print line
      while ((getline line < (dir "/" name ".block")) > 0) print line
      close(dir "/" name ".block")
      skipping = 1
      next
    }
    skipping && $0 ~ /^<!-- \/(tp-top|output):[a-z0-9-]+ -->$/ { skipping = 0 }
    !skipping { print }
  ' "$f" > "$tmp/out.md"
  if ! cmp -s "$f" "$tmp/out.md"; then
    cp "$tmp/out.md" "$f"
    echo "docs-snapshots.sh: rewrote the samples in $f"
  fi
done
