#!/usr/bin/env bash
# towerpack MPI test: a rank that dies (SIGKILL) or hangs (SIGSTOP) in the
# middle of training ends the job within a bound, with an error naming it:
# rank 1 killed, rank 1 stopped (rank 0 names it), rank 0 stopped (rank 1
# names it).
# The hang is the watchdog's case: mpirun sees nothing wrong with a stopped
# process, only the heartbeat does.
source "$(dirname "$0")/common.sh"
export TP_DIST_HEARTBEAT_TIMEOUT=3   # short: the job must end fast; not so short that a loaded CI machine trips it

# The pid of rank $1 of the job whose --logdir is $work/$2.
rank_pid() {
  local want=$1 pid
  for pid in $(pgrep -f "bin/tp-train .*--logdir $work/$2" || true); do
    if tr '\0' '\n' </proc/$pid/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$want"; then
      echo "$pid"; return 0
    fi
  done
  return 1
}

one_case() {   # $1: signal, $2: rank, $3: what the output must say
  local sig=$1 victim=$2 expect=$3 dir=$1$2
  "${MPIRUN[@]}" -np 2 "$TP_TRAIN" "${TRAIN_ARGS[@]}" --towers 1 --epochs 100 \
      --steps-per-epoch 100000 --logdir "$work/$dir" >"$work/$dir.out" 2>&1 &
  local mpirun_pid=$!
  local pid="" t=0
  while [ $t -lt 100 ]; do
    pid=$(rank_pid "$victim" "$dir") && [ -n "$pid" ] && break
    sleep 0.1; t=$((t + 1))
  done
  [ -n "$pid" ] || { echo "FAIL: no rank $victim process"; cat "$work/$dir.out"; kill $mpirun_pid; exit 1; }
  # rank 0 prints its banner once the data is loaded, just before training
  t=0
  while ! grep -q "^tp-train: model" "$work/$dir.out" && [ $t -lt 300 ]; do
    sleep 0.1; t=$((t + 1))
  done
  sleep 1.5
  local t0=$EPOCHREALTIME
  kill -"$sig" "$pid"
  local rc=0
  # bounded: mpirun must be gone within 20 s
  for i in $(seq 1 200); do
    kill -0 $mpirun_pid 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 $mpirun_pid 2>/dev/null; then
    echo "FAIL: the job still runs 20 s after SIG$sig of rank $victim"
    kill -9 "$pid" 2>/dev/null || true; kill $mpirun_pid; cat "$work/$dir.out"; exit 1
  fi
  wait $mpirun_pid || rc=$?
  local took
  took=$(awk "BEGIN { printf \"%.1f\", $EPOCHREALTIME - $t0 }")
  if [ "$sig" = STOP ]; then
    # mpirun's SIGTERM stays pending on a stopped process: ours to clean up
    kill -9 "$pid" 2>/dev/null || true
  elif kill -0 "$pid" 2>/dev/null; then
    echo "FAIL: rank $victim (pid $pid) outlived the job"; kill -9 "$pid"; exit 1
  fi
  echo "SIG$sig of rank $victim: the job ended in ${took} s with status $rc"
  [ "$rc" != 0 ] || { echo "FAIL: exit status 0"; cat "$work/$dir.out"; exit 1; }
  if ! grep -E "$expect" "$work/$dir.out"; then
    echo "FAIL: no message naming rank $victim ($expect)"; cat "$work/$dir.out"; exit 1
  fi
}

one_case KILL 1 "rank 1"
one_case STOP 1 "rank 1 has sent no heartbeat"
one_case STOP 0 "rank 0 has not answered heartbeats"
echo "killed rank: OK"
