#!/usr/bin/env bash
# towerpack peer benchmark: inference of the zoo's CNN on the CPU, towerpack's
# offline predictor against PyTorch (Debian's python3-torch) with the same
# weights, read from the same safetensors checkpoint.
#
#   bash bench/predict.sh [CHECKPOINT|LOGDIR]
#
# Without a checkpoint it trains one briefly (tp-train --model cnn, 200
# steps: the speed does not depend on how well the model is trained). Both
# sides run at 1 and 2 threads: batch-1 latency (median of 1000
# single-image calls) and batch-256 throughput (fastest of 5 runs of 4
# batches), in ROUNDS (default 3) alternating rounds; the medians over the
# rounds are compared, per thread count and for the best setting of each.
# The peer first checks that it computes the same logits as tp-predict on
# 256 test images. BF16=1: both sides with bf16 products (tp-predict and
# tp-bench predict --bf16; PyTorch under torch.autocast('cpu', bfloat16)),
# the logits then compared within bf16's rounding.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh
PY=/usr/bin/python3
if ! "$PY" -c 'import torch, numpy' >/dev/null 2>&1; then
  echo "bench/predict.sh: installing the peers (python3-torch, python3-numpy)" >&2
  bench_install python3-torch python3-numpy
fi
bench_release_build 2 tp-bench tp-train tp-predict
bin=build-release/bin
work=$(mktemp -d /tmp/tp-predict-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
bf16=()
if [ "${BF16:-0}" != 0 ]; then bf16=(--bf16); fi
ckpt=${1:-}
if [ -z "$ckpt" ]; then
  TP_LOG_LEVEL=warn $bin/tp-train --model cnn --epochs 1 --steps-per-epoch 200 --threads 2 \
    --test-spec 'fashion-mnist:test,shuffle=0 | batch 500 | fixed-size 2' \
    --logdir "$work/run" --no-tensorboard >/dev/null
  ckpt=$work/run
fi
$bin/tp-predict --load "$ckpt" --spec 'fashion-mnist:test,shuffle=0 | batch 256 | fixed-size 1' \
  --output "$work/first256.csv" --logits --confusion none "${bf16[@]}" >/dev/null
file=$($PY - "$ckpt" <<'PYEOF'
import os, sys
p = sys.argv[1]
if os.path.isdir(p):
    p = os.path.join(p, open(os.path.join(p, "checkpoint")).readline().strip())
print(p)
PYEOF
)
# ROUNDS rounds, each side and thread count back to back (the order
# alternating), so a loaded machine slows both alike; medians over rounds.
rounds=${ROUNDS:-3}
results=()
for r in $(seq 1 "$rounds"); do
  for t in 1 2; do
    tpr=$(TP_LOG_LEVEL=warn $bin/tp-bench predict --load "$file" --threads $t --json --latency-iters 1000 \
          "${bf16[@]}")
    ptr=$($PY bench/peers/predict_torch.py "$file" --threads $t --latency-iters 1000 \
          --compare "$work/first256.csv" "${bf16[@]}")
    if [ $((r % 2)) -eq 1 ]; then results+=("$tpr" "$ptr"); else results+=("$ptr" "$tpr"); fi
  done
done
printf '%s\n' "${results[@]}" | $PY -c '
import json, statistics as st, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
def med(side, t, key):
    v = [r[key] for r in rows if ("peer" in r) == (side == "pytorch") and r["threads"] == t]
    return st.median(v)
for t in (1, 2):
    for side in ("towerpack", "pytorch"):
        print("%-10s threads %d: batch-1 latency %.3f ms (median p90 %.3f), batch 256: %.0f images/s"
              % (side, t, med(side, t, "latency_ms"), med(side, t, "latency_p90_ms"),
                 med(side, t, "images_per_s")))
    print("  threads %d: latency towerpack/pytorch %.2fx, throughput towerpack/pytorch %.2fx" % (
        t, med("towerpack", t, "latency_ms") / med("pytorch", t, "latency_ms"),
        med("towerpack", t, "images_per_s") / med("pytorch", t, "images_per_s")))
pt = [r for r in rows if "peer" in r]
print("same model: PyTorch logits within %.2g of tp-predict, top-1 agrees on %.4f" % (
    max(r["max_abs_logit_diff"] for r in pt), min(r["top1_agree"] for r in pt)))
lt = min(med("towerpack", t, "latency_ms") for t in (1, 2))
lp = min(med("pytorch", t, "latency_ms") for t in (1, 2))
ht = max(med("towerpack", t, "images_per_s") for t in (1, 2))
hp = max(med("pytorch", t, "images_per_s") for t in (1, 2))
print("best thread setting of each: latency towerpack/pytorch = %.2fx (goal <= 0.5x); "
      "throughput towerpack/pytorch = %.2fx (goal >= 2x)" % (lt / lp, ht / hp))
print(json.dumps({"latency_ratio": lt / lp, "throughput_ratio": ht / hp, "rounds": rows}))
'
