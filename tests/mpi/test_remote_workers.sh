#!/usr/bin/env bash
# towerpack MPI test: each rank takes its batches from its own tp-worker
# process, started beside the ranks (not forked by them): the ranks bind
# ipc://DIR/r{rank} and one worker connects to each. Rank 1's log must name
# its own endpoint, and training must run to the end on both. Also: a
# --spec naming the rank, and --workers refused.
source "$(dirname "$0")/common.sh"
if [ -n "${TP_SANITIZE:-}" ]; then
  # tp-train's logic only, no memory-sensitive path the other MPI tests do
  # not cover: not worth a minute of the sanitizer pass
  echo "SKIPPED under TP_SANITIZE=$TP_SANITIZE (runs in the normal build)"
  exit 77
fi
pids=()
for r in 0 1; do
  "$TP_BUILD_DIR/bin/tp-worker" --spec 'fashion-mnist:train | batch 32' --seed $r \
      --connect "ipc://$work/r$r" --log-level warn &
  pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
TP_LOG_LEVEL=info "${MPIRUN[@]}" -np 2 "$TP_TRAIN" "${TRAIN_ARGS[@]}" --towers 1 \
    --epochs 1 --steps-per-epoch 20 --remote "@ipc://$work/r{rank}" \
    --logdir "$work/log" >"$work/out" 2>&1 || { cat "$work/out"; exit 1; }
grep "training data: ZMQInput @ipc://$work/r0" "$work/out"
grep "training data: ZMQInput @ipc://$work/r1" "$work/out"
grep -c '"epoch_num"' "$work/log/stats.json" | grep -qx 1
# '{rank}' in --spec: each rank builds its own pipeline (here: rank 0
# unshuffled, rank 1 shuffled), and no sharding happens
TP_LOG_LEVEL=info "${MPIRUN[@]}" -np 2 "$TP_TRAIN" "${TRAIN_ARGS[@]}" --towers 1 \
    --epochs 1 --steps-per-epoch 3 --spec 'fashion-mnist:train,shuffle={0+rank} | batch 32' \
    --logdir "$work/log3" >"$work/out3" 2>&1 || { cat "$work/out3"; exit 1; }
grep "training data: fashion-mnist:train,shuffle=0 | batch 32" "$work/out3"
grep "training data: fashion-mnist:train,shuffle=1 | batch 32" "$work/out3"
# --workers (fork) is refused under MPI, with the reason
if "${MPIRUN[@]}" -np 2 "$TP_TRAIN" "${TRAIN_ARGS[@]}" --workers 2 --epochs 1 \
     --logdir "$work/log2" >"$work/out2" 2>&1; then
  echo "FAIL: --workers was accepted under mpirun"; exit 1
fi
grep "MPI and fork() do not mix" "$work/out2"
echo "remote workers: OK"
