#!/usr/bin/env bash
# towerpack MPI test: a rank that is alive (its heartbeat answers) but does
# not reach the all-reduce is caught by the collective deadline: rank 1
# sleeps 60 s before step 5's all-reduce (TP_DIST_FAULT, fault injection);
# with TP_DIST_STEP_TIMEOUT=6 rank 0 must end the job about 6 s later,
# naming rank 1 as behind (without the deadline the job would still run
# when `timeout 60` ends it: a failure).
source "$(dirname "$0")/common.sh"
export TP_DIST_FAULT=delay:1:5:60 TP_DIST_STEP_TIMEOUT=6
MPIRUN+=(-x TP_DIST_FAULT)
t0=$EPOCHREALTIME
rc=0
timeout 60 "${MPIRUN[@]}" -np 2 "$TP_TRAIN" "${TRAIN_ARGS[@]}" --towers 1 --epochs 1 \
    --steps-per-epoch 50 --logdir "$work/log" >"$work/out" 2>&1 || rc=$?
took=$(awk "BEGIN { printf \"%.1f\", $EPOCHREALTIME - $t0 }")
echo "the job ended in $took s (from launch) with status $rc"
[ "$rc" != 0 ] && [ "$rc" != 124 ] || { echo "FAIL: status $rc"; cat "$work/out"; exit 1; }
grep "rank 1: TP_DIST_FAULT: sleeping" "$work/out"
# The message says how long rank 0 really waited: 6 s on a quiet machine,
# more when a loaded one is slow to wake it; the deadline it names is 6.
grep -E "rank 0 of 2 .*the gradient all-reduce of step 5 has not completed after [0-9]+ s \(TP_DIST_STEP_TIMEOUT=6\).*behind: rank 1 \(alive, last at step 4\)" "$work/out" \
  || { echo "FAIL: no deadline message naming rank 1"; cat "$work/out"; exit 1; }
echo "deadline: OK"
