#!/usr/bin/env bash
# towerpack tests: within one Criterion executable every .timeout is the
# same. Criterion 2.4's runner loses 48 bytes in its parent process when a
# test starts whose deadline falls before a running test's (a shorter
# .timeout started after a longer one, --jobs 2): LeakSanitizer then fails
# the whole executable in the asan phase, by chance of scheduling (two
# empty tests with .timeout = 180 and 120 reproduce it; equal timeouts, or
# none, do not). Each tests/**/test_*.c must use one value.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
bad=0
while IFS= read -r f; do
    vals=$(grep -o '\.timeout = [0-9]*' "$f" | awk '{print $3}' | sort -un | tr '\n' ' ')
    if [ "$(wc -w <<<"$vals")" -gt 1 ]; then
        echo "criterion_timeouts: ${f#$root/} mixes .timeout values: $vals(use one: Criterion's runner leaks when a shorter one starts after a longer one)"
        bad=1
    fi
done < <(find "$root/tests" -name 'test_*.c')
[ $bad -eq 0 ] && echo "criterion_timeouts: ok"
exit $bad
