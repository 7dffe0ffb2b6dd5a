#!/usr/bin/env bash
# towerpack MPI test: chief-only behaviour. The two ranks are given
# different --logdir values (an MPMD launch): rank 0 must fill its own
# (checkpoints, stats.json, log.log), rank 1 must create nothing at all; a
# resumed run picks up rank 0's checkpoint on both ranks.
source "$(dirname "$0")/common.sh"
if [ -n "${TP_SANITIZE:-}" ]; then
  # tp-train's logic only, no memory-sensitive path the other MPI tests do
  # not cover: not worth a minute of the sanitizer pass
  echo "SKIPPED under TP_SANITIZE=$TP_SANITIZE (runs in the normal build)"
  exit 77
fi
run() {
  "${MPIRUN[@]}" -np 1 "$TP_TRAIN" "${TRAIN_ARGS[@]}" --towers 1 --logdir "$work/rank0" "$@" : \
                 -np 1 "$TP_TRAIN" "${TRAIN_ARGS[@]}" --towers 1 --logdir "$work/rank1" "$@"
}
run --epochs 2 --steps-per-epoch 10 >"$work/out" 2>&1 || { cat "$work/out"; exit 1; }
ls "$work/rank0"
test -f "$work/rank0/model-20.safetensors"
test -f "$work/rank0/stats.json"
test -f "$work/rank0/log.log"
grep -c '"epoch_num"' "$work/rank0/stats.json" | grep -qx 2
if [ -e "$work/rank1" ]; then
  echo "FAIL: rank 1 wrote into its logdir:"; ls -la "$work/rank1"; exit 1
fi
# exactly one summary line: the chief's
test "$(grep -c '^tp-train: test accuracy' "$work/out")" = 1

# Resume: rank 0 finds model-20 and tells rank 1; training goes on from
# global step 20 to 30 on both ranks (rank 1 would fail the all-reduce's
# step count otherwise: it would be one epoch behind).
run --epochs 3 --steps-per-epoch 10 --resume >"$work/out2" 2>&1 || { cat "$work/out2"; exit 1; }
test -f "$work/rank0/model-30.safetensors"
grep -c '"epoch_num"' "$work/rank0/stats.json" | grep -qx 3
test ! -e "$work/rank1"
# Ranks that built different models: rank 1 names the mismatch and ends the
# job (no corrupt broadcast, no hang).
if "${MPIRUN[@]}" -np 1 "$TP_TRAIN" "${TRAIN_ARGS[@]}" --towers 1 --epochs 1 \
       --steps-per-epoch 3 --logdir "$work/mm" : \
     -np 1 "$TP_TRAIN" "${TRAIN_ARGS[@]}" --model cnn --towers 1 --epochs 1 \
       --steps-per-epoch 3 --logdir "$work/mm" >"$work/out3" 2>&1; then
  echo "FAIL: ranks with different models trained"; exit 1
fi
grep "rank 1 of 2 .*rank 1 built a model of .* rank 0's has" "$work/out3"
echo "chief-only: OK"
