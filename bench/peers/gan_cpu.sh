#!/usr/bin/env bash
# The DCGAN step on the CPU, wall clock: towerpack's tp-train against
# PyTorch eager in one sitting (issue 44, "Speed": towerpack's step at most
# 0.5x PyTorch's, the best of PyTorch's thread settings;
# docs/performance.md, "DCGAN on the CPU").
#
#   bash bench/peers/gan_cpu.sh [ROUNDS]
#
# The same model on both sides: the zoo's DCGAN, batch BATCH (64), on
# Fashion-MNIST (28 px grey), or with COLOUR=1 the 32 px colour DCGAN on a
# synthetic CIFAR-format file written here. Each round runs, in turn
# (the order reversed every other round):
#   towerpack tp-train --model dcgan --threads 1 and 2: 1 + CHUNKS epochs
#             of CHUNK steps; the first epoch is the warm-up, each later
#             epoch's steps_per_s (stats.json: its steps over the time from
#             its first step to the end of its last, epoch-end callbacks
#             excluded) one measure
#   pytorch   bench/peers/dcgan_torch.py, torch.set_num_threads 1 and 2:
#             CHUNK warm-up steps, then CHUNKS runs of CHUNK steps, each
#             timed whole (LOOP: usual, PyTorch's DCGAN example; or
#             gantrainer, tensorpack's one-forward step as towerpack's);
#             under its defaults and, on a CPU with AVX-512, its AVX-512
#             paths (bench_torch_envs in bench/common.sh), its best counting
# THREADS (default "1 2") are the thread settings of both sides; each
# run under `nice -n NICE` (default 0). Each run reports the median of
# its chunks' seconds per step; the summary gives, per round, each side's
# best thread setting and towerpack / PyTorch (the goal: <= 0.5), and
# over the rounds the median of those ratios, with `uptime` before every
# round (a shared host's load is part of the measure: say it). One JSON
# line per run is kept in OUT/results.jsonl. Needs tp-train (TP_TRAIN,
# default build/bin/tp-train) and /usr/bin/python3 with numpy and torch.
# BF16=1: both sides in bf16, like for like: tp-train --bf16 (the CPU's
# products and direct convolutions on bf16 operands, fp32 sums; its log,
# at info, must say "bf16: the CPU's matrix products on bf16 operands",
# else the bench stops) against dcgan_torch.py --bf16 (the forwards and
# losses under torch.autocast("cpu", bfloat16); its discriminator's
# logits must be bfloat16). Each run's JSON line then has "bf16": true,
# and the summary says the precision.
set -euo pipefail
ROUNDS=${1:-3}
repo=$(cd "$(dirname "$0")/../.." && pwd)
BATCH=${BATCH:-64} CHUNK=${CHUNK:-20} CHUNKS=${CHUNKS:-3} NICE=${NICE:-0}
LOOP=${LOOP:-usual} COLOUR=${COLOUR:-0} THREADS=${THREADS:-"1 2"} BF16=${BF16:-0}
TP_TRAIN=${TP_TRAIN:-$repo/build/bin/tp-train}
OUT=${OUT:-$(mktemp -d /tmp/gan_cpu.XXXXXX)}
[ -x "$TP_TRAIN" ] || { echo "gan_cpu.sh: no tp-train at $TP_TRAIN (set TP_TRAIN)" >&2; exit 1; }
py=/usr/bin/python3
# shellcheck source=bench/common.sh
. "$repo/bench/common.sh"
mapfile -t TORCH_ENVS < <(bench_torch_envs)
mkdir -p "$OUT"
res=$OUT/results.jsonl
: > "$res"
N="nice -n $NICE"
TP_BF16=() PT_BF16=() TP_ENV=()
if [ "$BF16" = 1 ]; then
    TP_BF16=(--bf16) PT_BF16=(--bf16) TP_ENV=(TP_LOG_LEVEL=info)
fi

if [ "$COLOUR" = 1 ]; then
    # 2560 CIFAR-10 records of colour fields and squares (the data does not
    # change a step's time; it only has to be colour 32 px)
    "$py" - "$OUT/data_batch_1.bin" <<'PY'
import sys
import numpy as np
r = np.random.default_rng(1)
n = 2560
img = np.zeros((n, 3, 32, 32), np.uint8)
ramp = np.arange(32, dtype=np.uint8) * 8
img[:, 0] = r.integers(40, 200, (n, 1, 1))
img[:, 1] = (ramp[None, :, None] + ramp[None, None, :]) // 2
img[:, 2] = ramp[None, None, :]
for i, (y, x) in enumerate(r.integers(0, 24, (n, 2))):
    img[i, :, y:y + 8, x:x + 8] = 250
rec = np.concatenate([(np.arange(n) % 10).astype(np.uint8)[:, None], img.reshape(n, -1)], 1)
rec.tofile(sys.argv[1])
PY
    TP_DATA="cifar:$OUT/data_batch_1.bin" PT_DATA="cifar:$OUT/data_batch_1.bin"
else
    TP_DATA=fashion-mnist:train PT_DATA=fmnist
fi

run_tp() {  # run_tp ROUND THREADS
    local d=$OUT/tp-$1-$2
    rm -rf "$d"
    env ${TP_ENV[@]+"${TP_ENV[@]}"} $N "$TP_TRAIN" --model dcgan --data "$TP_DATA" \
        --batch "$BATCH" --threads "$2" --epochs "$((CHUNKS + 1))" \
        --steps-per-epoch "$CHUNK" --no-tensorboard ${TP_BF16[@]+"${TP_BF16[@]}"} \
        --logdir "$d" > "$d.log" 2>&1 || { cat "$d.log" >&2; exit 1; }
    if [ "$BF16" = 1 ] && ! grep -q "bf16: the CPU's matrix products on bf16 operands" "$d.log"; then
        echo "gan_cpu.sh: tp-train --bf16 did not say it runs in bf16 ($d.log):" >&2
        tail -5 "$d.log" >&2
        exit 1
    fi
    "$py" - "$d/stats.json" "$1" "$2" "$BATCH" "$BF16" <<'PY' | tee -a "$res"
import json, statistics, sys
s = json.load(open(sys.argv[1]))[1:]  # the first epoch warms up
per = [1 / e["steps_per_s"] for e in s]
print(json.dumps(dict({"round": int(sys.argv[2]), "peer": "towerpack", "threads": int(sys.argv[3]),
                  "batch": int(sys.argv[4]), "chunk_s_per_step": [round(v, 4) for v in per],
                  "median_s_per_step": round(statistics.median(per), 4),
                  "g_loss": round(s[-1]["g_loss"], 3), "d_loss": round(s[-1]["d_loss"], 3)},
                 **({"bf16": True} if sys.argv[5] == "1" else {}))))
PY
}
run_torch() {  # run_torch ROUND THREADS: under each of TORCH_ENVS
    local e
    for e in "${TORCH_ENVS[@]}"; do
        # shellcheck disable=SC2086 # e is `env` arguments, split on purpose
        $N env $e "$py" "$repo/bench/peers/dcgan_torch.py" --threads "$2" --data "$PT_DATA" \
            --batch "$BATCH" --warmup "$CHUNK" --chunks "$CHUNKS" --chunk "$CHUNK" \
            --loop "$LOOP" ${PT_BF16[@]+"${PT_BF16[@]}"} 2>/dev/null \
            | sed "s/^{/{\"round\": $1, \"env\": \"${e:-default}\", /" | tee -a "$res"
        if [ "$BF16" = 1 ] && ! tail -1 "$res" | grep -q '"logits_dtype": "bfloat16"'; then
            echo "gan_cpu.sh: PyTorch under autocast did not compute in bf16" >&2
            exit 1
        fi
    done
}

for r in $(seq 1 "$ROUNDS"); do
    echo "round $r: $(uptime)" | tee -a "$OUT/uptime.txt"
    ts=$THREADS
    [ $((r % 2)) -eq 0 ] && ts=$(echo "$THREADS" | tr ' ' '\n' | tac | tr '\n' ' ')
    for t in $ts; do
        if [ $((r % 2)) -eq 1 ]; then run_tp "$r" "$t"; run_torch "$r" "$t"
        else run_torch "$r" "$t"; run_tp "$r" "$t"; fi
    done
done

"$py" - "$res" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ratios = []
for r in sorted({x["round"] for x in rows}):
    best = {}
    for x in rows:
        if x["round"] == r:
            p = x["peer"]
            if p not in best or x["median_s_per_step"] < best[p]["median_s_per_step"]:
                best[p] = x
    tp, pt = best["towerpack"], best["pytorch"]
    ratio = tp["median_s_per_step"] / pt["median_s_per_step"]
    ratios.append(ratio)
    print(f"round {r}: towerpack {tp['median_s_per_step'] * 1e3:.1f} ms/step "
          f"({tp['threads']} thread{'s' if tp['threads'] > 1 else ''}), PyTorch "
          f"{pt['median_s_per_step'] * 1e3:.1f} ms/step ({pt['threads']} "
          f"thread{'s' if pt['threads'] > 1 else ''}, {pt['loop']} loop, "
          f"{pt.get('env', 'default')}): {ratio:.3f}x")
print(f"towerpack / PyTorch, median over {len(ratios)} rounds: "
      f"{statistics.median(ratios):.3f}x (goal <= 0.5)")
if any(x.get("bf16") for x in rows):
    print("precision: bf16 on both sides (tp-train --bf16, which said so in its log; "
          "PyTorch under torch.autocast(\"cpu\", bfloat16), its logits bfloat16)")
PY
echo "results: $res"
