#!/usr/bin/env bash
# towerpack soak: push TOTAL datapoints through multi-process and remote
# dataflow into a training run and check that nothing is lost and memory
# stays flat.
#
#   bash scripts/soak.sh                   10 million datapoints (minutes)
#   TOTAL=200000 bash scripts/soak.sh      a short run (seconds)
#
# SENDERS tp-soak send processes (each with PROCS forked dataflow workers,
# MultiProcessRunnerZMQ, batching BATCH datapoints) connect over loopback
# tcp to one tp-soak train process (RemoteDataZMQ -> QueueInput -> a linear
# classifier). Every datapoint carries (sender, worker stream, sequence);
# the trainer checks each stream runs 0, 1, 2, ... (no gap, no repeat) and
# that every batch sent was received and trained. RSS of every process
# (senders' workers included) is sampled every INTERVAL seconds into
# OUT/rss.csv. RSS saw-tooths as the bounded queues fill and drain (tens
# of MiB in the trainer: QueueInput's 50 batches, the socket's hwm), so the
# check is on its envelope: after the warm-up (the first WARMUP percent of
# the samples), the floor (lowest RSS) of the last third of the samples
# must be within TOLERANCE percent of the floor of the first third (memory
# that is never given back: a leak), and the peak within 5 x TOLERANCE
# percent of the first third's peak (the queues stay bounded), for every
# process (one sampled fewer than 9 times after the warm-up, as in a short
# run, is reported but not judged). The summary goes to OUT/summary.txt.
# Environment: BUILD (build), TOTAL, SENDERS (2), PROCS (2), BATCH (256),
# INTERVAL (1), WARMUP (20), TOLERANCE (5), OUT (a new temp dir), CURVE
# (a key dir: run the data path with CURVE), RSS_JUDGE (1; 0 reports RSS
# without judging it: under AddressSanitizer freed memory sits in ASan's
# quarantine, so RSS grows by design).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
TOTAL=${TOTAL:-10000000}
SENDERS=${SENDERS:-2}
PROCS=${PROCS:-2}
BATCH=${BATCH:-256}
INTERVAL=${INTERVAL:-1}
WARMUP=${WARMUP:-20}
TOLERANCE=${TOLERANCE:-5}
RSS_JUDGE=${RSS_JUDGE:-1}
OUT=${OUT:-$(mktemp -d /tmp/tp-soak-XXXXXX)}
mkdir -p "$OUT"
# glibc raises its mmap threshold after freeing large blocks, after which
# freed batches stay in the heap and RSS shows the allocator's high-water
# mark rather than live memory; a fixed threshold (64 KiB: batches are
# mmapped and given back) makes RSS follow what the processes hold.
export MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-65536}
SOAK="$BUILD/bin/tp-soak"
[ -x "$SOAK" ] || { echo "soak: $SOAK not built (cmake --build $BUILD)" >&2; exit 2; }

per=$(( TOTAL / (SENDERS * BATCH) ))
batches=$(( per * SENDERS ))
epochs=10
while [ $(( batches % epochs )) -ne 0 ]; do epochs=$(( epochs - 1 )); done
port=$(( 20000 + RANDOM % 20000 ))
ep="tcp://127.0.0.1:$port"
curve=()
[ -n "${CURVE:-}" ] && curve=(--curve "$CURVE")
echo "soak: $((batches * BATCH)) datapoints = $SENDERS senders x $per batches x $BATCH," \
     "$PROCS workers per sender, into a training run at $ep; output in $OUT"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

t0=$(date +%s%N)
"$SOAK" train --bind "$ep" --batches "$batches" --batch "$BATCH" --epochs "$epochs" \
    --timeout 60 "${curve[@]}" > "$OUT/train.json" 2> "$OUT/train.log" &
train=$!
pids+=("$train")
sleep 0.5
for i in $(seq 0 $(( SENDERS - 1 ))); do
  "$SOAK" send --connect "$ep" --id "$i" --procs "$PROCS" --batch "$BATCH" --count "$per" \
      "${curve[@]}" > "$OUT/send$i.json" 2> "$OUT/send$i.log" &
  pids+=("$!")
done

# RSS of the trainer, the senders and the senders' forked workers.
echo "t_ms,pid,role,rss_kib" > "$OUT/rss.csv"
while kill -0 "$train" 2>/dev/null; do
  t=$(( ($(date +%s%N) - t0) / 1000000 ))
  for p in "${pids[@]}"; do
    role=send; [ "$p" = "$train" ] && role=train
    for q in "$p" $(cat /proc/"$p"/task/"$p"/children 2>/dev/null); do
      r=$(awk '/^VmRSS:/ {print $2}' /proc/"$q"/status 2>/dev/null || true)
      [ -n "$r" ] && echo "$t,$q,$([ "$q" = "$p" ] && echo "$role" || echo worker),$r" >> "$OUT/rss.csv"
    done
  done
  sleep "$INTERVAL"
done
rc=0
wait "$train" || rc=$?
for p in "${pids[@]:1}"; do wait "$p" || rc=$?; done
trap - EXIT
dt=$(( ($(date +%s%N) - t0) / 1000000000 ))

# Counts at both ends.
sent=$(cat "$OUT"/send*.json | sed -n 's/.*"datapoints":\([0-9]*\).*/\1/p' | awk '{s += $1} END {print s}')
received=$(sed -n 's/.*"datapoints_received":\([0-9]*\).*/\1/p' "$OUT/train.json")
trained=$(sed -n 's/.*"batches_trained":\([-0-9]*\).*/\1/p' "$OUT/train.json")

# RSS: per process, the value at the end of the warm-up against the rest.
rss=$(awk -F, -v warm="$WARMUP" -v tol="$TOLERANCE" -v judge="$RSS_JUDGE" '
  NR > 1 { n[$2]++; v[$2 "," n[$2]] = $4; role[$2] = $3 }
  END {
    bad = 0
    for (p in n) {
      k = int(n[p] * warm / 100) + 1           # first sample after the warm-up
      m = n[p] - k + 1                         # samples after it
      third = int(m / 3); if (third < 1) third = 1
      hi = 0; fe = -1; fl = -1; pe = 0; pl = 0
      for (i = k; i <= n[p]; i++) {
        x = v[p "," i] + 0
        if (x > hi) hi = x
        if (i < k + third) { if (fe < 0 || x < fe) fe = x; if (x > pe) pe = x }
        if (i > n[p] - third) { if (fl < 0 || x < fl) fl = x; if (x > pl) pl = x }
      }
      floor_growth = fe > 0 ? 100 * (fl - fe) / fe : 0
      peak_growth = pe > 0 ? 100 * (pl - pe) / pe : 0
      few = m < 9   # a process seen this rarely (a short run) is not judged
      over = floor_growth > tol || peak_growth > 5 * tol
      flag = few ? "  (too few samples to judge)" : over ? "  GROWS" : ""
      printf "  %-6s pid %-7s samples %4d  start %6d  max %6d  floor %6d -> %6d (%+.1f%%)  peak %6d -> %6d (%+.1f%%)%s\n", role[p], p, n[p], v[p "," 1], hi, fe, fl, floor_growth, pe, pl, peak_growth, flag
      if (!few && over) bad = 1
    }
    exit judge ? bad : 0
  }' "$OUT/rss.csv") || rc=1

{
  echo "soak: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, TOTAL=$TOTAL SENDERS=$SENDERS PROCS=$PROCS BATCH=$BATCH${CURVE:+ CURVE}"
  echo "command: TOTAL=$TOTAL SENDERS=$SENDERS PROCS=$PROCS BATCH=$BATCH bash scripts/soak.sh (MALLOC_MMAP_THRESHOLD_=$MALLOC_MMAP_THRESHOLD_)"
  echo "duration: $dt s; datapoints sent $sent, received $received; batches trained $trained of $batches"
  cat "$OUT/train.json"
  echo "RSS (KiB; after the first ${WARMUP}% of the samples, first third -> last third: the floor within ${TOLERANCE}%, the peak within $((5 * TOLERANCE))%$([ "$RSS_JUDGE" = 0 ] && echo '; reported, not judged: RSS_JUDGE=0')):"
  echo "$rss"
} | tee "$OUT/summary.txt"
if [ "$rc" -ne 0 ] || [ "$sent" != "$received" ] || [ "$trained" != "$batches" ]; then
  echo "soak: FAILED (see $OUT)" >&2
  exit 1
fi
echo "soak: OK"
