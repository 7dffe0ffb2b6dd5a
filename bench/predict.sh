#!/usr/bin/env bash
# towerpack peer benchmark: inference of the zoo's CNN on the CPU, towerpack's
# offline predictor against PyTorch (Debian's python3-torch) with the same
# weights, read from the same safetensors checkpoint.
#
#   bash bench/predict.sh [CHECKPOINT|LOGDIR]
#
# Without a checkpoint it trains one briefly (tp-train --model cnn, 200
# steps: the speed does not depend on how well the model is trained). Both
# sides run at 1 and 2 threads; the best of each is compared: batch-1
# latency (median of 2000 single-image calls) and batch-256 throughput
# (fastest of 5 rounds of 4 batches). The peer first checks that it computes
# the same logits as tp-predict on 256 test images.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
if ! "$PY" -c 'import torch, numpy' >/dev/null 2>&1; then
  echo "bench/predict.sh: installing the peers (python3-torch, python3-numpy)" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-torch python3-numpy >/dev/null
fi
if [ ! -f build-release/CMakeCache.txt ]; then
  cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DTP_WITH_CUDA=AUTO \
        -DTP_BUILD_TESTS=OFF >/dev/null
fi
cmake --build build-release -j2 --target tp-bench tp-train tp-predict >/dev/null
bin=build-release/bin
work=$(mktemp -d /tmp/tp-predict-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
ckpt=${1:-}
if [ -z "$ckpt" ]; then
  TP_LOG_LEVEL=warn $bin/tp-train --model cnn --epochs 1 --steps-per-epoch 200 --threads 2 \
    --test-spec 'fashion-mnist:test,shuffle=0 | batch 500 | fixed-size 2' \
    --logdir "$work/run" --no-tensorboard >/dev/null
  ckpt=$work/run
fi
$bin/tp-predict --load "$ckpt" --spec 'fashion-mnist:test,shuffle=0 | batch 256 | fixed-size 1' \
  --output "$work/first256.csv" --logits --confusion none >/dev/null
file=$($PY - "$ckpt" <<'PYEOF'
import os, sys
p = sys.argv[1]
if os.path.isdir(p):
    p = os.path.join(p, open(os.path.join(p, "checkpoint")).readline().strip())
print(p)
PYEOF
)
results=()
for t in 1 2; do
  results+=("$(TP_LOG_LEVEL=warn $bin/tp-bench predict --load "$file" --threads $t --json)")
  results+=("$($PY bench/peers/predict_torch.py "$file" --threads $t --compare "$work/first256.csv")")
done
printf '%s\n' "${results[@]}" | $PY -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
tp = [r for r in rows if "peer" not in r]
pt = [r for r in rows if "peer" in r]
for r in rows:
    print("%-24s threads %d: batch-1 latency %.3f ms (p90 %.3f), batch %d: %.0f images/s%s" % (
        r.get("peer", "towerpack"), r["threads"], r["latency_ms"], r["latency_p90_ms"],
        r["batch"], r["images_per_s"],
        "" if "peer" not in r else ", same logits as tp-predict within %.2g, top-1 agrees on %.4f"
        % (r["max_abs_logit_diff"], r["top1_agree"])))
lt = min(r["latency_ms"] for r in tp); lp = min(r["latency_ms"] for r in pt)
ht = max(r["images_per_s"] for r in tp); hp = max(r["images_per_s"] for r in pt)
print("best of each: latency towerpack/pytorch = %.2fx (goal <= 0.5x); "
      "throughput towerpack/pytorch = %.2fx (goal >= 2x)" % (lt / lp, ht / hp))
print(json.dumps({"latency_ratio": lt / lp, "throughput_ratio": ht / hp,
                  "towerpack": tp, "pytorch": pt}))
'
