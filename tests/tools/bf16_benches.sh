#!/usr/bin/env bash
# The whole-loop benches in bf16 (issues 43 and 44): bench/peers/gan_cpu.sh
# BF16=1 and bench/images/resnet18.py --bf16 at their smallest, checking
# that both sides really computed in bf16 and that the report says so:
#   - gan_cpu.sh BF16=1: each run's JSON line has "bf16": true, PyTorch's
#     discriminator logits are bfloat16 (autocast), the summary says
#     "precision: bf16"; the default (fp32) run says none of that and its
#     PyTorch logits are float32;
#   - a tp-train that drops --bf16 (a wrapper) stops both benches with
#     "did not say it runs in bf16", not a bf16 figure that was fp32;
#   - resnet18.py --bf16 reports "precision": "bf16".
# Exit 77 (skipped) without torch and torchvision, or on a CPU without bf16
# dot products. Needs TP_BUILD (the build folder, with bin/tp-train).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${TP_BUILD:?TP_BUILD: the build folder}
py=/usr/bin/python3
"$py" -c "import torch, torchvision" 2>/dev/null || { echo "no torch/torchvision: skipped"; exit 77; }
tmp=$(mktemp -d /tmp/bf16_benches.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "bf16_benches: $*" >&2; exit 1; }

# a tp-train that ignores --bf16 (as the benches did before BF16=1/--bf16)
mkdir -p "$tmp/fp32only/bin"
cat > "$tmp/fp32only/bin/tp-train" <<EOF
#!/usr/bin/env bash
args=(); for x in "\$@"; do [ "\$x" = --bf16 ] || args+=("\$x"); done
exec "$build/bin/tp-train" "\${args[@]}"
EOF
chmod +x "$tmp/fp32only/bin/tp-train"

gan() {  # gan NAME [VAR=VALUE...]: a one-round, one-thread, 2-step gan_cpu.sh
    local name=$1
    shift
    env THREADS=1 CHUNK=2 CHUNKS=1 OUT="$tmp/$name" TP_TRAIN="$build/bin/tp-train" "$@" \
        bash "$repo/bench/peers/gan_cpu.sh" 1 > "$tmp/$name.out" 2>&1
}

if ! gan bf16 BF16=1; then
    if grep -q "has no bf16 dot products" "$tmp"/bf16/tp-*.log 2>/dev/null; then
        echo "this CPU has no bf16 dot products: skipped"
        exit 77
    fi
    cat "$tmp/bf16.out" >&2
    fail "gan_cpu.sh BF16=1 failed"
fi
res=$tmp/bf16/results.jsonl
grep -q '"peer": "towerpack".*"bf16": true' "$res" || fail "towerpack's run not marked bf16: $(cat "$res")"
grep -q '"peer": "pytorch".*"bf16": true, "logits_dtype": "bfloat16"' "$res" \
    || fail "PyTorch did not run in bf16: $(cat "$res")"
grep -q '^precision: bf16 on both sides' "$tmp/bf16.out" || fail "the summary does not say bf16"
grep -q "bf16: the CPU's matrix products on bf16 operands" "$tmp"/bf16/tp-1-1.log \
    || fail "tp-train's log does not say bf16"

gan fp32 || { cat "$tmp/fp32.out" >&2; fail "gan_cpu.sh (fp32) failed"; }
res=$tmp/fp32/results.jsonl
! grep -q '"peer": "towerpack".*"bf16"' "$res" || fail "the fp32 run's line changed: $(cat "$res")"
grep -q '"peer": "pytorch".*"logits_dtype": "float32"' "$res" || fail "PyTorch fp32: $(cat "$res")"
! grep -q '^precision' "$tmp/fp32.out" || fail "the fp32 summary names a precision"

if gan fp32only BF16=1 TP_TRAIN="$tmp/fp32only/bin/tp-train"; then
    fail "gan_cpu.sh BF16=1 took a tp-train that ignores --bf16"
fi
grep -q "did not say it runs in bf16" "$tmp/fp32only.out" \
    || fail "gan_cpu.sh: no clear error for a tp-train without bf16: $(tail -3 "$tmp/fp32only.out")"

"$py" "$repo/bench/images/gen_colour.py" "$tmp/img/train" 8 64 > /dev/null \
    || fail "gen_colour.py failed"
for c in $(ls "$tmp/img/train"); do
    mkdir -p "$tmp/img/test/$c"
    cp "$tmp/img/train/$c/0000.jpg" "$tmp/img/test/$c/"
done
r18() {  # r18 BUILD NAME: resnet18.py --bf16, one tiny run a side
    "$py" "$repo/bench/images/resnet18.py" --build "$1" --dir "$tmp/img" --batch 4 \
        --warmup 1 --steps 1 --rounds 1 --tp 1x1 --torch 0x1 --bf16 > "$tmp/$2.out" 2>&1
}
r18 "$build" r18 || { cat "$tmp/r18.out" >&2; fail "resnet18.py --bf16 failed"; }
tail -1 "$tmp/r18.out" | grep -q '"precision": "bf16"' || fail "resnet18.py: $(tail -1 "$tmp/r18.out")"
grep -q '^precision: bf16 on both sides' "$tmp/r18.out" || fail "resnet18.py does not say bf16"
if r18 "$tmp/fp32only" r18-fp32only; then
    fail "resnet18.py --bf16 took a tp-train that ignores --bf16"
fi
grep -q "did not say it runs in bf16" "$tmp/r18-fp32only.out" \
    || fail "resnet18.py: no clear error for a tp-train without bf16: $(tail -3 "$tmp/r18-fp32only.out")"
echo "bf16_benches: ok"
