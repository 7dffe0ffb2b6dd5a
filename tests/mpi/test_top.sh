#!/usr/bin/env bash
# towerpack MPI test (issue 47): tp-top over a whole mpirun. Rank 0
# publishes at LOGDIR/stats.sock, rank 1 beside it (stats-rank1.sock);
# tp-top --connect LOGDIR/stats.sock merges both: its JSON has rows of both
# ranks (a "rank" each) and each rank's all-reduce row. Every rank prints
# its summary; rank 0 states the total batch and how the data are sharded.
source "$(dirname "$0")/common.sh"
# no --stats off here: the statistics sockets are what is tested
ARGS=(--model mlp --batch 32 --threads 1 --seed 7 --no-augment --logdir-action delete
      --towers 1 --epochs 1)
# a run long enough to be looked at, ended by SIGTERM once tp-top has
TP_LOG_LEVEL=warn "${MPIRUN[@]}" -np 2 "$TP_TRAIN" "${ARGS[@]}" --steps-per-epoch 1000000 \
    --logdir "$work/log" >"$work/out" 2>&1 &
run=$!
trap 'kill $run 2>/dev/null || true; wait $run 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 300); do  # both ranks' sockets (30 s)
  [ -S "$work/log/stats.sock" ] && [ -S "$work/log/stats-rank1.sock" ] && break
  kill -0 $run 2>/dev/null || { cat "$work/out"; echo "FAIL: the run ended early"; exit 1; }
  sleep 0.1
done
[ -S "$work/log/stats-rank1.sock" ] || { cat "$work/out"; ls -la "$work/log"; echo "FAIL: no rank 1 socket"; exit 1; }
sleep 2  # a second snapshot: rates over an interval of training
"$TP_BUILD_DIR/bin/tp-top" --connect "ipc://$work/log/stats.sock" --once --json \
    --timeout 10 >"$work/top.json" || { cat "$work/out"; echo "FAIL: tp-top"; exit 1; }
"$TP_BUILD_DIR/bin/tp-top" --connect "ipc://$work/log/stats.sock" --once \
    --timeout 10 >"$work/top.txt" || { cat "$work/out"; echo "FAIL: tp-top"; exit 1; }
cat "$work/top.txt"
/usr/bin/python3 - "$work/top.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
rows = doc["actors"]
ranks = {r.get("rank") for r in rows}
assert {0, 1} <= ranks, "rows of both ranks: %s" % sorted(map(str, ranks))
for k in (0, 1):
    names = [r["name"] for r in rows if r.get("rank") == k]
    assert "all-reduce (2 ranks)" in names, "rank %d's rows: %s" % (k, names)
    assert "supervisor" in names, names
assert len({r["pid"] for r in rows if r.get("rank") in (0, 1)}) == 2, "two processes"
assert sorted(p["rank"] for p in doc["publishers"]) == [0, 1], doc["publishers"]
print("tp-top: rows of ranks 0 and 1, all-reduce rows; bottleneck:", doc["bottleneck"])
PY
grep -q '^RANK ' "$work/top.txt"
grep -q '^1 .*all-reduce (2 ranks)' "$work/top.txt"
kill -TERM $run
wait $run || true
# a short run to its end: every rank's summary
TP_LOG_LEVEL=warn "${MPIRUN[@]}" -np 2 "$TP_TRAIN" "${ARGS[@]}" --steps-per-epoch 20 \
    --logdir "$work/log2" >"$work/out" 2>&1 || { cat "$work/out"; echo "FAIL: the run"; exit 1; }
grep "tp-train: total batch 64 = 2 ranks x 1 tower x batch 32; data: one stream, sharded: of every 2 consecutive batches rank r trains the r-th" "$work/out"
grep -E "^tp-train rank 1: 20 steps \| wall time [0-9.]+ s \| [0-9]+ samples/s of its own" "$work/out"
grep "tp-train: test accuracy" "$work/out"
echo "tp-top over mpirun: OK"
