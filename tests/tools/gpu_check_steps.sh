#!/usr/bin/env bash
# towerpack tests: scripts/gpu-check.sh steps FILE, the runner a GPU
# session's device call uses (here without a GPU: plain shell steps). Each
# step runs under its own timeout, a failing one does not stop the rest, a
# malformed line and a step past the budget are failures of their own, and
# the exit status is 0 only when every step passed.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "gpu_check_steps: FAILED: $*"; cat "$tmp/out/steps.txt" 2>/dev/null; exit 1; }

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
OUT="$tmp/out3" bash "$root/scripts/gpu-check.sh" steps "$tmp/none.txt" >"$tmp/log3" 2>&1
[ $? -eq 2 ] && grep -q "no file" "$tmp/log3" || fail "a missing file: $(cat "$tmp/log3")"
echo "gpu_check_steps: ok"
