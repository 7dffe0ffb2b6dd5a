#!/usr/bin/env bash
# llm.c's CPU trainer (train_gpt2.c) as a peer of `tp-train --model gpt`
# (issue 45, "Speed on the CPU"; docs/performance.md, "GPT on the CPU
# against llm.c and PyTorch"). llm.c is Andrej Karpathy's MIT-licensed
# GPT-2 trainer; none of its code is in this repository: this script copies
# train_gpt2.c and the llmc/ headers it includes out of a checkout the user
# gives, patches the copy's main() (below) and builds it in a scratch
# directory.
#
#   git clone https://github.com/karpathy/llm.c /path/to/llm.c
#   LLMC_SRC=/path/to/llm.c bash bench/peers/llmc_gpt.sh DIR [B T STEPS THREADS]
#
# LLMC_SRC is a working tree or a bare git directory (then its HEAD is
# read). DIR holds model.bin, train.bin and val.bin from
# bench/peers/llmc_gpt_files.py (the model's shape is in model.bin's
# header). Defaults: B 8, T 256, 10 steps, 2 threads. Built with
#   gcc -O3 -march=native -fopenmp -DOMP   (-DOMP turns llm.c's pragmas on)
# and run with OMP_NUM_THREADS=THREADS. Prints llm.c's own output, then one
# JSON line: tokens/s = B*T over the mean of llm.c's per-step times
# ("step N: train loss L (took X ms)", which time the batch, forward, zero
# grad, backward and update), the first step left out (first touch of the
# activations and gradients).
#
# The patch, all in main() and all by sed on the copy:
#   - the checkpoint "gpt2_124M.bin" -> "model.bin", the tiny_shakespeare
#     token files -> "train.bin", "val.bin" (it runs in DIR);
#   - B = 4, T = 64 -> B, T; the 40 steps -> STEPS;
#   - val_num_batches 5 -> 1 (validation at every 10th step, untimed);
#   - the sample generation every 20 steps off (untimed, but 63 full
#     forwards each: minutes of wall time at this size).
set -euo pipefail
dir=${1:?usage: LLMC_SRC=llm.c llmc_gpt.sh DIR [B T STEPS THREADS]}
B=${2:-8} T=${3:-256} STEPS=${4:-10} THREADS=${5:-2}
src=${LLMC_SRC:?set LLMC_SRC to a clone of https://github.com/karpathy/llm.c}
dir=$(cd "$dir" && pwd)
build=$dir/llmc-build
mkdir -p "$build/llmc"
get() {  # get PATH: one file of llm.c, from a work tree or a bare git dir
    if [ -f "$src/$1" ]; then cat "$src/$1"; else git --git-dir="$src" show "HEAD:$1"; fi
}
get train_gpt2.c > "$build/train_gpt2.c"
for h in utils.h tokenizer.h dataloader.h rand.h; do get "llmc/$h" > "$build/llmc/$h"; done
sed -i \
    -e 's|"gpt2_124M.bin"|"model.bin"|' \
    -e 's|"dev/data/tinyshakespeare/tiny_shakespeare_train.bin"|"train.bin"|' \
    -e 's|"dev/data/tinyshakespeare/tiny_shakespeare_val.bin"|"val.bin"|' \
    -e "s|int B = 4;|int B = $B;|" -e "s|int T = 64;|int T = $T;|" \
    -e "s|step <= 40;|step <= $STEPS;|" \
    -e 's|int val_num_batches = 5;|int val_num_batches = 1;|' \
    -e 's|if (step > 0 \&\& step % 20 == 0) {|if (0) {|' \
    "$build/train_gpt2.c"
# each patch must have taken (llm.c's main may change upstream)
for want in '"model.bin"' '"train.bin"' "int B = $B;" "int T = $T;" \
            "step <= $STEPS;" 'int val_num_batches = 1;' 'if (0) {'; do
    grep -qF "$want" "$build/train_gpt2.c" ||
        { echo "llmc_gpt.sh: patch '$want' did not apply to $src's train_gpt2.c" >&2; exit 1; }
done
gcc -O3 -march=native -fopenmp -DOMP -Wno-unused-result \
    -o "$build/train_gpt2" "$build/train_gpt2.c" -lm
cd "$dir"
OMP_NUM_THREADS=$THREADS "$build/train_gpt2" | tee "$build/log.txt"
awk -v B="$B" -v T="$T" -v th="$THREADS" '
    /^step [0-9]+: train loss/ {
        n++; if (n == 1) next
        ms = $0; sub(/.*took /, "", ms); sub(/ ms.*/, "", ms)
        sum += ms; k++; loss = $5
    }
    END {
        if (k == 0) { print "llmc_gpt.sh: no timed steps in the log" > "/dev/stderr"; exit 1 }
        printf "{\"peer\": \"llm.c\", \"threads\": %d, \"batch\": %d, \"context\": %d, " \
               "\"steps\": %d, \"ms_per_step\": %.1f, \"tokens_per_s\": %d, \"loss\": %s}\n",
               th, B, T, k, sum / k, B * T * 1000.0 * k / sum, loss
    }' "$build/log.txt"
