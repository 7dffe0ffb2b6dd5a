#!/usr/bin/env bash
# towerpack tests: the GPU checks' scripts that run without a GPU.
# scripts/gpu-check.sh steps FILE, the runner a GPU session's device call
# uses (here on plain shell steps): each step runs under its own timeout, a
# failing one does not stop the rest, a malformed line and a step past the
# budget are failures of their own, and the exit status is 0 only when
# every step passed. scripts/gpu/kernel_sum.py on a CSV in Nsight
# Compute's form: times in any unit, summed by kernel, largest first.
# scripts/gpu/record_run.py's run line and summary (the TTA columns).
# The step files of the next GPU session (scripts/gpu/steps/) through
# scripts/gpu/check_steps.py, and the checker on a file with a fault of
# each kind; scripts/gpu/results.py's rows, and steps keeping them beside
# the packed logs.
# scripts/gpu/pytorch_gemm_step.py (where torch is installed): skipped
# without a GPU, its summary line with one; the PyTorch peer's rate
# schedule against tp-train's.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
# Debian's python3, which has numpy and torch (install-deps.sh), before a
# pyenv one first on the PATH (tests/proc_testutil.h does the same)
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "gpu_check_scripts: FAILED: $*"; cat "$tmp/out/steps.txt" 2>/dev/null; exit 1; }

cat >"$tmp/mixed.txt" <<'STEPS'
# comment, then a blank line

5 echo hello; echo world
1 sleep 5
5 exit 3
nonsense
100 echo too long
STEPS
OUT="$tmp/out" BUDGET=60 bash "$root/scripts/gpu-check.sh" steps "$tmp/mixed.txt" >"$tmp/log" 2>&1
rc=$?
[ "$rc" -eq 1 ] || fail "mixed steps: exit $rc, not 1"
want=("step 1: passed in" "step 2: FAILED: timed out in" "step 3: FAILED: exit 3 in"
      "step 4: FAILED: not 'SECONDS COMMAND': nonsense"
      "step 5: skipped: 100 s would end past the budget")
for i in 0 1 2 3 4; do
    line=$(sed -n "$((i + 1))p" "$tmp/out/steps.txt")
    [[ "$line" == "${want[$i]}"* ]] || fail "summary line $((i + 1)): '$line', want '${want[$i]}...'"
done
grep -qx "world" "$tmp/out/step-1.txt" || fail "step 1's output not in step-1.txt"
grep -q "gpu-check steps: 5 step(s), exit 1" "$tmp/log" || fail "no closing line: $(cat "$tmp/log")"

printf '5 true\n5 echo ok\n' >"$tmp/good.txt"
OUT="$tmp/out2" bash "$root/scripts/gpu-check.sh" steps "$tmp/good.txt" >"$tmp/log2" 2>&1 ||
    fail "passing steps: exit $?: $(cat "$tmp/log2")"
[ -f "$tmp/out2/step-2.txt" ] && [ ! -e "$tmp/out2/logs.tgz" ] ||
    fail "two steps' logs: packed, or missing: $(ls "$tmp/out2")"
# more logs than the device tool brings back (8 files): all but the
# summary packed into logs.tgz, every one of them there
for i in $(seq 9); do echo "5 echo step$i; echo extra >\$OUT/extra$i.log"; done >"$tmp/many.txt"
OUT="$tmp/out4" bash "$root/scripts/gpu-check.sh" steps "$tmp/many.txt" >"$tmp/log4" 2>&1 ||
    fail "nine steps: exit $?: $(cat "$tmp/log4")"
[ "$(ls "$tmp/out4" | sort | tr '\n' ' ')" = "logs.tgz steps.txt " ] ||
    fail "nine steps: left $(ls "$tmp/out4")"
[ "$(tar tzf "$tmp/out4/logs.tgz" | grep -c -E 'step-[0-9]+\.txt$|extra[0-9]\.log$')" -eq 18 ] ||
    fail "nine steps: the archive holds $(tar tzf "$tmp/out4/logs.tgz" | tr '\n' ' ')"
tar xzOf "$tmp/out4/logs.tgz" ./step-9.txt | grep -qx step9 || fail "step 9's log not in the archive"
OUT="$tmp/out3" bash "$root/scripts/gpu-check.sh" steps "$tmp/none.txt" >"$tmp/log3" 2>&1
[ $? -eq 2 ] && grep -q "no file" "$tmp/log3" || fail "a missing file: $(cat "$tmp/log3")"

h='"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
{
    echo "==PROF== Connected to process 1"
    echo "$h"
    echo '"0","1","p","h","k_a","1","7","(256,1,1)","(1,1,1)","0","9.0","s","gpu__time_duration.sum","usecond","10.50"'
    echo '"1","1","p","h","k_b","1","7","(256,1,1)","(1,1,1)","0","9.0","s","gpu__time_duration.sum","nsecond","5,000"'
    echo '"2","1","p","h","k_a","1","7","(256,1,1)","(1,1,1)","0","9.0","s","gpu__time_duration.sum","usecond","9.50"'
    echo '"3","1","p","h","gemm","1","7","(256,1,1)","(1,1,1)","0","9.0","s","gpu__time_duration.sum","msecond","0.025"'
} >"$tmp/ncu.csv"
"$py" "$root/scripts/gpu/kernel_sum.py" "$tmp/ncu.csv" --steps 2 >"$tmp/ks" || fail "kernel_sum: exit $?"
grep -q "^4 kernel runs, 50.0 us in all, 25.0 us a step over 2 steps" "$tmp/ks" || fail "kernel_sum: $(cat "$tmp/ks")"
[ "$(sed -n 3p "$tmp/ks" | awk '{print $1, $2, $3, $NF}')" = "50.0% 25.0 1 gemm" ] || fail "kernel_sum row 1: $(cat "$tmp/ks")"
[ "$(sed -n 4p "$tmp/ks" | awk '{print $1, $2, $3, $4, $NF}')" = "40.0% 20.0 2 10.00 k_a" ] || fail "kernel_sum row 2: $(cat "$tmp/ks")"
echo "$h" >"$tmp/empty.csv"
"$py" "$root/scripts/gpu/kernel_sum.py" "$tmp/empty.csv" >"$tmp/ks2"
[ $? -eq 1 ] || fail "kernel_sum on no rows: not exit 1"
# record_run.py: a run's line (training time from the epochs' rates, the
# TTA accuracies when tp-train put them) and the summary of a block
printf '[{"global_step":100,"steps_per_s":50,"validation_accuracy":0.9},{"global_step":300,"steps_per_s":100,"validation_accuracy":0.91,"validation_flip_accuracy":0.92,"validation_flip_shift_accuracy":0.925}]' >"$tmp/st.json"
"$py" "$root/scripts/gpu/record_run.py" run 3 0 10 14.5 "$tmp/st.json" >"$tmp/rec.txt"
grep -qx "run seed=3 rc=0 epochs=2 accuracy=0.9100 flip=0.9200 shift=0.9250 train_s=4.00 wall_s=4.50" "$tmp/rec.txt" ||
    fail "record_run run: $(cat "$tmp/rec.txt")"
"$py" "$root/scripts/gpu/record_run.py" summary "$tmp/rec.txt" >"$tmp/sum.txt"
grep -q "accuracy mean 0.9100.*(--tta) mean 0.9200.*(--tta-shift) mean 0.9250.*training time mean 4.00 s" "$tmp/sum.txt" ||
    fail "record_run summary: $(cat "$tmp/sum.txt")"

# the GEMM step's PyTorch peer: without a GPU it says so and exits 77
# (skipped), not a failure or a traceback
if "$py" -c 'import torch' 2>/dev/null; then
    # the peer's schedule is tp-train's: the rates tp_train/warmup_and_lr_end_
    # shape_the_rate reads after each of 3 epochs of 100 steps (lr 0.05,
    # --warmup 1, --lr-end 0), and the default's end, a twentieth
    PYTHONPATH="$root/scripts/gpu" "$py" -c '
import pytorch_cnn_bn as p
got = [0.05 * p.rate_factor(s, 300, 100, 0.0) for s in (100, 200, 300)]
want = [0.05, 0.025, 0.0]
assert all(abs(g - w) < 1e-9 for g, w in zip(got, want)), got
assert abs(p.rate_factor(0, 300, 100, 0.0) - 0.1) < 1e-12
assert abs(p.rate_factor(300, 300, 0, 0.05) - 0.05) < 1e-12
assert abs(p.rate_factor(0, 300, 0, 0.05) - 1.0) < 1e-12
' >"$tmp/sched" 2>&1 || fail "the peer's schedule: $(cat "$tmp/sched")"
    "$py" "$root/scripts/gpu/pytorch_gemm_step.py" --iters 2 >"$tmp/pg" 2>&1
    rc=$?
    if "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        [ $rc -eq 0 ] && grep -q "^pytorch gemm step: MLP 784-2048-2048-10" "$tmp/pg" ||
            fail "pytorch_gemm_step.py on a GPU: exit $rc: $(cat "$tmp/pg")"
    else
        [ $rc -eq 77 ] && grep -q "no CUDA device" "$tmp/pg" ||
            fail "pytorch_gemm_step.py without a GPU: exit $rc: $(cat "$tmp/pg")"
    fi
fi
# the next GPU session's step files (scripts/gpu/steps/): every line
# sound without a GPU (scripts/gpu/check_steps.py: bash -n, the programs
# carried, the scripts there, every flag one its program defines, the
# seconds within a call and the session's plan) ...
"$py" "$root/scripts/gpu/check_steps.py" "$root" "$root"/scripts/gpu/steps/*.txt >"$tmp/cs" 2>&1 ||
    fail "the step files: $(cat "$tmp/cs")"
[ "$(grep -c '^check_steps: .*\.txt: [0-9]* steps' "$tmp/cs")" -ge 2 ] || fail "check_steps read no step files: $(cat "$tmp/cs")"
# ... and the checker finds each kind of fault
mkdir -p "$tmp/bad"
cat >"$tmp/bad/x.txt" <<'STEPS'
# expected: 10 s
10 . scripts/gpu/steps/lib.sh; tp_train "x" cost --devices 0 --model gpt --no-such-flag 1
10 .gpu/bin/tp-nonesuch --x
10 "$PY" scripts/gpu/pytorch_gpt.py --data F --atention sdpa
10 "$PY" scripts/gpu/missing.py
10 ONLY=tests NOSUCHKNOB=1 bash scripts/gpu-check.sh run
10 for x in; do
10 .gpu/bin/tp-bench ops --device 0 --sconds 1
10 . scripts/gpu/steps/lib.sh; ops_table "ops" --device 0 --round 2
10 .gpu/bin/tp-bench opz --device 0
700 true
STEPS
"$py" "$root/scripts/gpu/check_steps.py" "$root" "$tmp/bad/x.txt" >"$tmp/cs2" 2>&1
[ $? -eq 1 ] || fail "check_steps passed a bad file: $(cat "$tmp/cs2")"
for want in "x.txt:2: tp-train has no flag --no-such-flag" "x.txt:3: .gpu/bin/tp-nonesuch: prepare does not carry" \
            "x.txt:4: scripts/gpu/pytorch_gpt.py has no flag --atention" "x.txt:5: no file scripts/gpu/missing.py" \
            "x.txt:6: gpu-check.sh reads no NOSUCHKNOB" "x.txt:7: bash -n" \
            "x.txt:8: tp-bench ops has no flag --sconds" "x.txt:9: tp-bench ops has no flag --round" \
            "x.txt:10: tp-bench has no subcommand 'opz'" "x.txt: 790 s, over a call's 600 s"; do
    grep -qF "$want" "$tmp/cs2" || fail "check_steps missed '$want': $(cat "$tmp/cs2")"
done
# scripts/gpu/results.py: the rows the steps add to $OUT/results.md
printf '[{"tokens_per_s":100.0,"validation_bpb":3.5},{"tokens_per_s":300.0,"validation_bpb":2.25}]' >"$tmp/gpt.json"
printf '[{"tokens_per_s":300.0,"validation_bpb":2.5}]' >"$tmp/gpt2.json"
OUT="$tmp/res" "$py" "$root/scripts/gpu/results.py" stats "GPT" "$tmp/gpt.json" tokens_per_s,validation_bpb >/dev/null ||
    fail "results.py stats: exit $?"
printf 'log line\n{"tokens_per_s": 12345, "loss": 1.5}\nmore\n' | OUT="$tmp/res" "$py" "$root/scripts/gpu/results.py" json "peer" tokens_per_s,loss >/dev/null ||
    fail "results.py json: exit $?"
OUT="$tmp/res" "$py" "$root/scripts/gpu/results.py" compare "twice" "$tmp/gpt.json" "$tmp/gpt2.json" tokens_per_s,validation_bpb >/dev/null ||
    fail "results.py compare: exit $?"
OUT="$tmp/res" "$py" "$root/scripts/gpu/results.py" stats "gone" "$tmp/none.json" tokens_per_s >/dev/null &&
    fail "results.py stats on a missing file: exit 0"
want_rows='| GPT | tokens_per_s 300.0 (best epoch after the first 300.0); validation_bpb 2.25; 2 epochs |
| peer | tokens_per_s 12345; loss 1.5 |
| twice | tokens_per_s equal (300.0); validation_bpb 2.25 against 2.5 (relative difference 1.00e-01) |'
[ "$(head -3 "$tmp/res/results.md")" = "$want_rows" ] || fail "results.md: $(cat "$tmp/res/results.md")"
grep -q "^| gone | FAILED: no stats.json" "$tmp/res/results.md" || fail "a missing stats.json's row: $(cat "$tmp/res/results.md")"
# results.py ops: tp-bench ops --json's table, one row an op (a row not on
# CUDA and a failed one say so) and the whole; no table is a failed row
cat >"$tmp/ops.txt" <<'OPS'
tp-bench ops: conv2d/enc1: no CUDA forward (listed as not on CUDA)
{"bench":"ops","threads":1,"fold":0,"seconds":0.15,"rounds":3,"step_clock":"wall","device":"cuda:0 (NVIDIA H200)","tf32":0,"torch":"2.5.1","rows":[{"name":"relu","op":"relu","from":"autoencoder","inputs":"128x16x14x14","towerpack_us":12.50,"torch1_us":25.00,"torch2_us":0.00,"torch_us":25.00,"torch_threads":1,"ratio":0.500,"status":"ok"},{"name":"conv2d/enc1","op":"conv2d","from":"autoencoder","inputs":"128x1x28x28, 16x1x3x3","towerpack_us":-1.00,"torch1_us":40.00,"torch2_us":0.00,"torch_us":40.00,"torch_threads":1,"ratio":0.000,"status":"not on CUDA"}],"not_on_device":1,"compared":1,"slower":0}
OPS
OUT="$tmp/res2" "$py" "$root/scripts/gpu/results.py" ops "ops" "$tmp/ops.txt" >/dev/null || fail "results.py ops: exit $?"
want_ops='| ops: relu | towerpack 12.5 us, torch 25.0 us, ratio 0.50 (128x16x14x14) |
| ops: conv2d/enc1 | not on CUDA; torch 40.0 us (128x1x28x28, 16x1x3x3) |
| ops | cuda:0 (NVIDIA H200), TF32 off, torch 2.5.1: 2 rows, 1 compared, 0 slower than PyTorch, 1 not on the device, 0 failed |'
[ "$(cat "$tmp/res2/results.md")" = "$want_ops" ] || fail "results.py ops: $(cat "$tmp/res2/results.md")"
echo "tp-bench ops: --device 0: no CUDA devices: no driver" | OUT="$tmp/res3" "$py" "$root/scripts/gpu/results.py" ops "ops" >/dev/null &&
    fail "results.py ops without a table: exit 0"
grep -q "^| ops | FAILED: no tp-bench ops --json line |" "$tmp/res3/results.md" || fail "results.py ops without a table: $(cat "$tmp/res3/results.md")"
# steps keeps results.md beside the archive, and shows it at the end
for i in $(seq 9); do echo "5 echo step$i; $py $root/scripts/gpu/results.py line row$i x >/dev/null"; done >"$tmp/rows.txt"
OUT="$tmp/out5" bash "$root/scripts/gpu-check.sh" steps "$tmp/rows.txt" >"$tmp/log5" 2>&1 ||
    fail "steps with rows: exit $?: $(cat "$tmp/log5")"
[ "$(ls "$tmp/out5" | sort | tr '\n' ' ')" = "logs.tgz results.md steps.txt " ] ||
    fail "steps with rows: left $(ls "$tmp/out5")"
[ "$(wc -l <"$tmp/out5/results.md")" -eq 9 ] && grep -q "^| row9 | x |" "$tmp/log5" ||
    fail "steps with rows: $(cat "$tmp/out5/results.md"; tail -12 "$tmp/log5")"
echo "gpu_check_scripts: ok"
