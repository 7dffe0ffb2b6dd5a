#!/usr/bin/env bash
# towerpack: docs/distributed.md's two-host recipe (tp-train on one host,
# tp-workers on another, over tcp with CURVE and a job id), checked on one
# machine with two network namespaces joined by a veth pair: the trainer's
# namespace has 10.231.0.1, the workers' 10.231.0.2, and nothing else
# connects them (each has only its loopback besides). It checks that
#   - two tp-workers in the workers' namespace feed tp-train in the
#     trainer's, which trains and tests (exit 0), naming them as they join;
#   - a worker without the keys ends non-zero saying the trainer requires
#     CURVE keys;
#   - a worker of another batch size ends (exit 1) at its handshake naming
#     the mismatch, and the trainer's log names it by its address in the
#     other namespace (10.231.0.2);
#   - the good workers end by themselves once the trainer is gone
#     (--exit-with-trainer);
#   - a worker whose trainer's host dies (the link goes down) while its
#     socket buffers are full ends by itself (docs/distributed.md), and so
#     does the Python sender, tools/tp-worker/tp_send.py (where
#     /usr/bin/python3 has numpy and pyzmq).
# Needs root (ip netns) and Fashion-MNIST; where network namespaces are not
# permitted (a container without CAP_SYS_ADMIN, no iproute2) it says so and
# exits 0 (SKIP). About 60 s. ctest runs it as netns_remote.
#
#   scripts/netns-remote.sh
#   TP_BUILD=build-release scripts/netns-remote.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TP_BUILD:-build}
bin=$(cd "$build/bin" 2>/dev/null && pwd) || bin=$build/bin
# a skip exits 0, or $TP_NETNS_SKIP_STATUS (ctest's netns_remote: 77, shown Skipped)
skip() { echo "netns-remote.sh: SKIP: $*"; exit "${TP_NETNS_SKIP_STATUS:-0}"; }
fail() { echo "netns-remote.sh: FAIL: $*" >&2; exit 1; }
for t in tp-train tp-worker tp-keygen; do
  [ -x "$bin/$t" ] || fail "$bin/$t is missing: cmake --build $build --target tp-train tp-worker tp-keygen"
done
[ "$(id -u)" = 0 ] || skip "needs root to make network namespaces (ip netns)"
command -v ip >/dev/null || skip "no ip command (iproute2)"
[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  skip "no Fashion-MNIST (dataset-fashion-mnist)"

ns_t=tp-trainer-$$ ns_w=tp-workers-$$
veth_t=tpt$$ veth_w=tpw$$   # interface names: at most 15 characters
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tp-netns-XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$ns_t" 2>/dev/null || true   # takes its end of the veth pair
  ip netns del "$ns_w" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$ns_t" 2>"$tmp/err" ||
  skip "network namespaces are not permitted here: $(cat "$tmp/err")"
ip netns add "$ns_w"
ip link add "$veth_t" type veth peer name "$veth_w" ||
  skip "cannot make a veth pair here"
ip link set "$veth_t" netns "$ns_t"
ip link set "$veth_w" netns "$ns_w"
ip -n "$ns_t" addr add 10.231.0.1/24 dev "$veth_t"
ip -n "$ns_w" addr add 10.231.0.2/24 dev "$veth_w"
for ns in "$ns_t" "$ns_w"; do ip -n "$ns" link set lo up; done
ip -n "$ns_t" link set "$veth_t" up
ip -n "$ns_w" link set "$veth_w" up
# (ip netns exec execs the program: $! of "in_w ... &" is the program's pid)
in_t() { exec ip netns exec "$ns_t" "$@"; }
in_w() { exec ip netns exec "$ns_w" "$@"; }

# the recipe: keys made once and copied to every host (here: one file
# system), one job id for the run
"$bin/tp-keygen" "$tmp/keys" >/dev/null
export TP_JOB=netns-$$
ep=tcp://10.231.0.1:5550
echo "netns-remote.sh: trainer in $ns_t (10.231.0.1), workers in $ns_w (10.231.0.2), job $TP_JOB"
TP_LOG_LEVEL=info in_t "$bin/tp-train" --model mlp --remote "@$ep" --curve "$tmp/keys" \
  --towers 1 --batch 64 --epochs 1 --steps-per-epoch 300 --threads 1 \
  --logdir "$tmp/log" --no-tensorboard >"$tmp/train.log" 2>&1 &
trainer=$!
pids+=("$trainer")

# waits for pid at most $2 s; its exit status, 124 when it did not end
wait_for() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    kill -0 "$1" 2>/dev/null || { wait "$1" && return 0 || return $?; }
    sleep 0.1
  done
  return 124
}
# waits at most $3 s for a line of file $1 that matches grep pattern $2
wait_log() {
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# a worker without the keys, and one of another batch size, first: the
# trainer logs a refused worker when that worker's goodbye arrives, which
# a trainer already done with its 300 steps (~1.7 s) never reads. Without
# data it waits, so the good workers start once the refusal is logged.
in_w "$bin/tp-worker" --spec 'fashion-mnist:train | batch 64' --connect "$ep" \
  >"$tmp/nokeys.log" 2>&1 &
nokeys=$!
pids+=("$nokeys")
in_w "$bin/tp-worker" --spec 'fashion-mnist:train | batch 32' --connect "$ep" \
  --curve "$tmp/keys" >"$tmp/batch32.log" 2>&1 &
batch32=$!
pids+=("$batch32")
want="component 0 'image' is uint8\[32,28,28\], expected uint8\[64,28,28\]"
named="tp-worker $batch32@[^ ]* (connected to $ep from 10.231.0.2) ends: its datapoints do not fit this run: $want"
wait_log "$tmp/train.log" "$named" 30 ||
  fail "tp-train's log does not name the batch-32 worker by its address in 30 s:" \
       "$(cat "$tmp/train.log")" "(the worker's: $(cat "$tmp/batch32.log"))"
workers=()
for seed in 0 1; do
  in_w "$bin/tp-worker" --spec 'fashion-mnist:train | shuffle 2000 | batch 64' --seed "$seed" \
    --connect "$ep" --curve "$tmp/keys" --exit-with-trainer=3 >"$tmp/worker$seed.log" 2>&1 &
  workers+=("$!")
  pids+=("$!")
done
st=0; wait_for "$trainer" 180 || st=$?
[ "$st" = 0 ] || { cat "$tmp/train.log" >&2; fail "tp-train ended with $st"; }
grep -q "test accuracy" "$tmp/train.log" || fail "tp-train did not test: $(cat "$tmp/train.log")"
n=$(grep -c "remote: tp-worker [0-9]*@[^ ]* (connected to $ep from 10.231.0.2) joined" "$tmp/train.log" || true)
[ "$n" -ge 2 ] || fail "tp-train's log names $n joined workers, not 2: $(cat "$tmp/train.log")"
grep "test accuracy" "$tmp/train.log" | sed 's/^/  trainer: /'

st=0; wait_for "$nokeys" 20 || st=$?
[ "$st" != 0 ] && [ "$st" != 124 ] && grep -q "it requires CURVE keys" "$tmp/nokeys.log" ||
  fail "the worker without keys (status $st): $(cat "$tmp/nokeys.log")"
sed -n 's/^\(tp-worker: .*\)$/  no keys: \1/p' "$tmp/nokeys.log" | head -1

st=0; wait_for "$batch32" 20 || st=$?
[ "$st" = 1 ] && grep -q "$want" "$tmp/batch32.log" ||
  fail "the worker of batch 32 (status $st): $(cat "$tmp/batch32.log")"
grep "ends: its datapoints do not fit" "$tmp/train.log" | head -1 | sed 's/^.*remote: /  trainer: /'

for w in "${workers[@]}"; do
  st=0; wait_for "$w" 20 || st=$?
  [ "$st" = 0 ] || fail "worker $w did not end with its trainer (status $st)"
done

# the trainer's host dies with a worker's data in flight: the link goes
# down on the trainer's side (no FIN, no RST) while the worker's socket
# buffers are full. Small buffers (32 KB) bring each heartbeat's answer
# back at once, so that no PING is left unanswered to time out; the
# worker's own check (nothing acknowledged for 20 s) must end it, not the
# kernel's retransmissions (minutes). Without that check about half the
# runs fail here. About 25 s.
ip netns exec "$ns_w" sysctl -qw net.ipv4.tcp_wmem="4096 16384 32768"
ip netns exec "$ns_t" sysctl -qw net.ipv4.tcp_rmem="4096 16384 32768"
ep2=tcp://10.231.0.1:5551
TP_LOG_LEVEL=info in_t "$bin/tp-train" --model mlp --remote "@$ep2" --curve "$tmp/keys" \
  --towers 1 --batch 64 --epochs 1 --steps-per-epoch 1000000 --threads 1 \
  --logdir "$tmp/log2" --no-tensorboard >"$tmp/train2.log" 2>&1 &
trainer2=$!
pids+=("$trainer2")
in_w "$bin/tp-worker" --spec 'fashion-mnist:train | shuffle 2000 | batch 64' \
  --connect "$ep2" --curve "$tmp/keys" --exit-with-trainer=1 >"$tmp/dead.log" 2>&1 &
dead=$!
pids+=("$dead")
for ((i = 0; i < 300; i++)); do
  grep -q "joined" "$tmp/train2.log" && break
  sleep 0.1
done
sleep 3
ip -n "$ns_t" link set "$veth_t" down
t0=$SECONDS
st=0; wait_for "$dead" 28 || st=$?
[ "$st" = 0 ] || fail "the worker whose trainer's host died did not end in 28 s (status $st):" \
  "$(cat "$tmp/dead.log")"
echo "  dead host: the worker ended $((SECONDS - t0)) s after the link went down:" \
  "$(grep -o "send: the receiver at .* has acknowledged nothing for [0-9.]* s" "$tmp/dead.log" ||
     echo "the heartbeat's timeout")"

# the same for the Python sender (tools/tp-worker/tp_send.py: no CURVE keys),
# which checks its connections' TCP_INFO as tp-worker does; where
# /usr/bin/python3 has numpy and pyzmq. About 25 s.
py=skipped
if /usr/bin/python3 -c 'import numpy, zmq' 2>/dev/null; then
  ip -n "$ns_t" link set "$veth_t" up
  ep3=tcp://10.231.0.1:5552
  TP_LOG_LEVEL=info in_t "$bin/tp-train" --model mlp --remote "@$ep3" \
    --towers 1 --batch 64 --epochs 1 --steps-per-epoch 1000000 --threads 1 \
    --logdir "$tmp/log3" --no-tensorboard >"$tmp/train3.log" 2>&1 &
  pids+=("$!")
  in_w /usr/bin/python3 tools/tp-worker/tp_send.py --connect "$ep3" --batch 64 \
    --exit-with-trainer=1 >"$tmp/pydead.log" 2>&1 &
  pydead=$!
  pids+=("$pydead")
  wait_log "$tmp/train3.log" "tp_send.py [0-9]*@[^ ]* .* joined" 30 ||
    fail "tp_send.py did not join: $(cat "$tmp/train3.log")" "(its: $(cat "$tmp/pydead.log"))"
  sleep 3
  ip -n "$ns_t" link set "$veth_t" down
  t0=$SECONDS
  st=0; wait_for "$pydead" 28 || st=$?
  [ "$st" = 0 ] || fail "tp_send.py whose trainer's host died did not end in 28 s (status" \
    "$st): $(cat "$tmp/pydead.log")"
  py="ended $((SECONDS - t0)) s after"
  echo "  dead host, tp_send.py: it ended $((SECONDS - t0)) s after the link went down:" \
    "$(grep -o "the receiver at .* has acknowledged nothing for [0-9.]* s" "$tmp/pydead.log" ||
       echo "the heartbeat's timeout")"
fi
echo "netns-remote.sh: OK: 2 workers in $ns_w trained tp-train in $ns_t over $ep (CURVE, job $TP_JOB);" \
  "a worker without keys and one of batch 32 were refused, both named;" \
  "a worker whose trainer's host died ended (tp_send.py: $py)"
