#!/usr/bin/env bash
# GPT training speed on the CPU: towerpack against llm.c's CPU trainer and
# PyTorch eager, in one sitting (issue 45, "Speed on the CPU";
# docs/performance.md, "GPT on the CPU against llm.c and PyTorch").
#
#   git clone https://github.com/karpathy/llm.c /path/to/llm.c
#   [LLMC_SRC=/path/to/llm.c] bash bench/peers/gpt_cpu.sh [ROUNDS]
#
# The same model everywhere: GPT-2's layout on bytes (vocabulary 256),
# LAYERS 4, EMBED 256, HEADS 4, CONTEXT 256, total batch BATCH 4 (env vars
# override them), float32, the text being docs/*.md concatenated.
# towerpack and PyTorch train the same model from the same weights: a
# first tp-train run at this shape writes its initial weights (one step
# at a rate of 1e-30: the zero biases become +-1e-30, no other weight
# changes in float32), and PyTorch
# starts from that checkpoint with the same recipe (AdamW at LR, 5e-4,
# betas 0.9/0.95, decay 0.1 on the matrices only, global-norm clip 1, the
# rate climbing from LR/10 over the first STEPS steps, then constant);
# each side's first three losses are printed, and from the same start
# they begin at ln 256 ~ 5.55 and fall alike (their batches are their
# own draws). Not 1e-3 with no warm-up, as before: at batch 4 that
# diverges now and then (the loss jumping from ~3.6 to 7-9 at steps
# 7-17; PyTorch on towerpack's very batches the same, to 4 decimals:
# docs/history.md, "GPT: the bench's loss spikes"); a run whose loss
# climbs back above its first is flagged at the end. Each round runs,
# in turn (reversed every other round):
#   llm.c    train_gpt2.c, gcc -O3 -march=native -fopenmp, OMP_NUM_THREADS
#            1 and 2 (bench/peers/llmc_gpt.sh; weights from llmc_gpt_files.py);
#            only when LLMC_SRC is set
#   pytorch  bench/peers/gpt_torch_cpu.py (tests/models/torch_gpt.py's
#            model), 1 and 2 threads, each as nn.Linear runs it (addmm)
#            and as the parity test writes it (--plain), each under its
#            defaults and, on a CPU with AVX-512, its AVX-512 paths
#            (bench_torch_envs in bench/common.sh): its best counts
#   towerpack tp-train --model gpt, 1 tower x 2 threads and 2 towers x 1
#            thread (the same total batch), tokens_per_s of the last epoch
#            in stats.json (the first epoch warms up); with no checkpoint,
#            TensorBoard file, plot or stats socket, as the peers write none
#            (CHECKPOINTS=1 keeps tp-train's ModelSaver: its writer thread
#            saves epoch 1 while epoch 2's first step runs, 35-43 ms of a
#            tower's core, ~5% of 6 timed steps; docs/performance.md, gpt14;
#            PLOTS=1 keeps the CurvePlotter: it draws curves.png on the
#            callback actor then too, ~19 ms of a core; gpt16)
# each under `nice -n NICE` (default 10), each timing STEPS steps after a
# warm-up. Prints one JSON line per run (kept in OUT/results.jsonl) and,
# at the end, each round's best tokens/s of each program and the ratios
# towerpack/llm.c and towerpack/PyTorch, with `uptime` around every round.
# BF16=1: towerpack trains with --bf16 (the products on bf16 operands,
# fp32 sums: tp_backend_cpu_bf16) and PyTorch runs each setting also under
# torch.autocast("cpu", bfloat16) (--bf16): PyTorch's best of both
# precisions counts, and the summary gives each precision's best too.
# Needs a Release tp-train (TP_TRAIN, default build-release/bin/tp-train)
# and /usr/bin/python3 with numpy and torch.
set -euo pipefail
ROUNDS=${1:-2}
repo=$(cd "$(dirname "$0")/../.." && pwd)
LAYERS=${LAYERS:-4} EMBED=${EMBED:-256} HEADS=${HEADS:-4} CONTEXT=${CONTEXT:-256}
BATCH=${BATCH:-4} STEPS=${STEPS:-6} NICE=${NICE:-10} LR=${LR:-5e-4}
CHECKPOINTS=${CHECKPOINTS:-0} PLOTS=${PLOTS:-0} BF16=${BF16:-0}
TP_TRAIN=${TP_TRAIN:-$repo/build-release/bin/tp-train}
OUT=${OUT:-$(mktemp -d /tmp/gpt_cpu.XXXXXX)}
LLMC_SRC=${LLMC_SRC:-}  # optional: without it, no llm.c rows
[ -x "$TP_TRAIN" ] || { echo "gpt_cpu.sh: no tp-train at $TP_TRAIN (set TP_TRAIN)" >&2; exit 1; }
py=/usr/bin/python3
# shellcheck source=bench/common.sh
. "$repo/bench/common.sh"
mapfile -t TORCH_ENVS < <(bench_torch_envs)
mkdir -p "$OUT"
cat "$repo"/docs/*.md > "$OUT/text.txt"
head -c 2000 "$OUT/text.txt" > "$OUT/val.txt"  # a small validation: cheap epoch ends
[ -z "$LLMC_SRC" ] || "$py" "$repo/bench/peers/llmc_gpt_files.py" --out "$OUT/llmc" \
    --text "$OUT/text.txt" --layers "$LAYERS" --heads "$HEADS" --embed "$EMBED" \
    --context "$CONTEXT"
# the recipe both sides train with (tp-train's GPT defaults but the clip
# and the schedule, given here so PyTorch's are the same): the rate's
# warm-up is the first epoch, the untimed one
TP_RECIPE=(--optimizer adamw --lr "$LR" --clip-norm 1 --lr-end 1 --warmup-epochs 1)
TORCH_PRECISIONS=("")
if [ "$BF16" = 1 ]; then
    TP_RECIPE+=(--bf16)
    TORCH_PRECISIONS+=(--bf16)
fi
# towerpack's initial weights at this shape and seed (tp-train's default
# seed 1, as the timed runs): --freeze '*' would be the clean way, but
# a step with no gradient at all is refused today
"$TP_TRAIN" --model gpt --data "text:$OUT/text.txt" --test-data "text:$OUT/val.txt" \
    --layers "$LAYERS" --heads "$HEADS" --embed "$EMBED" --context "$CONTEXT" \
    --batch "$BATCH" --epochs 1 --steps-per-epoch 1 --optimizer adamw --lr 1e-30 \
    --no-tensorboard --logdir "$OUT/init" --logdir-action delete > "$OUT/init.log" 2>&1
INIT=$(ls "$OUT"/init/*.safetensors | tail -1)
QUIET_RUN=(--no-tensorboard --stats off)
[ "$CHECKPOINTS" = 1 ] || QUIET_RUN+=(--no-checkpoints)
[ "$PLOTS" = 1 ] || QUIET_RUN+=(--no-plots)
res=$OUT/results.jsonl
: > "$res"
N="nice -n $NICE"

run_llmc() {  # run_llmc ROUND THREADS
    LLMC_SRC=$LLMC_SRC $N bash "$repo/bench/peers/llmc_gpt.sh" "$OUT/llmc" \
        "$BATCH" "$CONTEXT" "$((STEPS + 1))" "$2" > "$OUT/llmc-$1-$2.log" 2>&1
    tail -1 "$OUT/llmc-$1-$2.log" | sed "s/^{/{\"round\": $1, /" | tee -a "$res"
}
run_torch() {  # run_torch ROUND THREADS ENV [--plain] [--bf16]
    # shellcheck disable=SC2086 # ENV is `env` arguments, split on purpose
    $N env $3 "$py" "$repo/bench/peers/gpt_torch_cpu.py" --init "$INIT" --threads "$2" \
        ${4:-} ${5:-} --data "$OUT/text.txt" --heads "$HEADS" --context "$CONTEXT" \
        --batch "$BATCH" --steps "$STEPS" --warmup 1 --lr "$LR" --lr-warmup "$STEPS" \
        2>/dev/null | sed "s/^{/{\"round\": $1, \"env\": \"${3:-default}\", /" | tee -a "$res"
}
run_tp() {  # run_tp ROUND TOWERS THREADS
    local d=$OUT/tp-$1-$2x$3
    rm -rf "$d"
    $N "$TP_TRAIN" --model gpt --data "text:$OUT/text.txt" --test-data "text:$OUT/val.txt" \
        --layers "$LAYERS" --heads "$HEADS" --embed "$EMBED" --context "$CONTEXT" \
        --batch "$((BATCH / $2))" --towers "$2" --threads "$3" "${TP_RECIPE[@]}" \
        --epochs 2 --steps-per-epoch "$STEPS" --logdir "$d" "${QUIET_RUN[@]}" > "$d.log" 2>&1
    "$py" - "$d/stats.json" "$1" "$2" "$3" "$BATCH" "$CONTEXT" <<'PY' | tee -a "$res"
import json, os, sys
s = json.load(open(sys.argv[1]))[-1]
steps = os.path.join(os.path.dirname(sys.argv[1]), "steps.tsv")
losses = [float(l.split()[1]) for l in open(steps).read().splitlines()[1:]]
first = [round(v, 4) for v in losses[:3]]
print(json.dumps({"round": int(sys.argv[2]), "peer": "towerpack", "towers": int(sys.argv[3]),
                  "threads": int(sys.argv[4]), "batch": int(sys.argv[5]),
                  "context": int(sys.argv[6]), "tokens_per_s": round(s["tokens_per_s"]),
                  "first_losses": first, "loss": round(s["cost"], 4),
                  "max_loss": round(max(losses[1:]), 4)}))
PY
}

for r in $(seq 1 "$ROUNDS"); do
    echo "round $r: $(uptime)" | tee -a "$OUT/uptime.txt"
    order="llmc torch tp"
    [ $((r % 2)) -eq 0 ] && order="tp torch llmc"
    for p in $order; do
        case $p in
            llmc) [ -z "$LLMC_SRC" ] || { run_llmc "$r" 1; run_llmc "$r" 2; } ;;
            torch) for e in "${TORCH_ENVS[@]}"; do
                       for prec in "${TORCH_PRECISIONS[@]}"; do
                           for th in 1 2; do
                               run_torch "$r" $th "$e" "" "$prec"
                               run_torch "$r" $th "$e" --plain "$prec"
                           done
                       done
                   done ;;
            tp) run_tp "$r" 1 2; run_tp "$r" 2 1 ;;
        esac
    done
done
echo "end: $(uptime)" | tee -a "$OUT/uptime.txt"
"$py" - "$res" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in sorted({x["round"] for x in rows}):
    best = {}
    for x in rows:
        if x["round"] == r:
            best[x["peer"]] = max(best.get(x["peer"], 0), x["tokens_per_s"])
    t, l, p = best.get("towerpack", 0), best.get("llm.c", 0), best.get("pytorch", 0)
    vs_llmc = f"towerpack/llm.c {t / l:.2f}x, " if l else ""
    bf = [x["tokens_per_s"] for x in rows
          if x["round"] == r and x["peer"] == "pytorch" and x.get("bf16")]
    by_prec = ""
    if bf:
        p32 = max(x["tokens_per_s"] for x in rows
                  if x["round"] == r and x["peer"] == "pytorch" and not x.get("bf16"))
        by_prec = (f" (pytorch fp32 {p32}: {t / p32:.2f}x; bf16 {max(bf)}: "
                   f"{t / max(bf):.2f}x)")
    pbest = max((x for x in rows if x["round"] == r and x["peer"] == "pytorch"),
                key=lambda x: x["tokens_per_s"], default={})
    print(f"round {r}: towerpack {t} tokens/s, llm.c {l or '-'}, pytorch {p} "
          f"({pbest.get('env', '-')}): {vs_llmc}towerpack/pytorch {t / p:.2f}x{by_prec}")
# the same start: both sides' first losses (a different start, as PyTorch's
# own initialisation, begins far from ln 256)
for peer in ("towerpack", "pytorch"):
    f = [x["first_losses"] for x in rows if x["peer"] == peer and "first_losses" in x]
    if f:
        print(f"{peer} first losses: {f[0]}")
# a loss back above the first after training began is a divergence, not
# noise (docs/history.md, "GPT: the bench's loss spikes")
for x in rows:
    if x.get("max_loss", 0) > x.get("first_losses", [1e30])[0]:
        print(f"WARNING: {x['peer']} round {x['round']} diverged: its loss reached "
              f"{x['max_loss']} after a first of {x['first_losses'][0]}")
PY
echo "gpt_cpu.sh: results in $res"
