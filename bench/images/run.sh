#!/usr/bin/env bash
# bench/images: towerpack's image pipeline against torchvision's DataLoader
# and tensorpack's own dataflow (bench/images/README.md). One run, the same
# machine, the rounds interleaved (A B C, A B C, ...) so load from elsewhere
# falls on every side alike; the table gives medians and ratios.
#
#   bash bench/images/run.sh [ROUNDS]        (default 3; --help: this)
#
# Environment: TP_IMAGES_DIR (the JPEG folder; made by gen_jpegs.py when
# missing, 2000 files), TENSORPACK_SRC (tensorpack's source folder; without
# it the tensorpack peer is skipped with a message). Installs the peers'
# Debian packages when missing (python3-torch, python3-torchvision,
# python3-opencv, python3-pil; tensorpack's python3-tqdm, -termcolor,
# -tabulate, -msgpack-numpy, -zmq, -psutil): benchmark-only.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/common.sh
case "${1:-3}" in
  -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  *[!0-9]*|0) echo "bench/images/run.sh: ROUNDS is a number of rounds, 1 or" \
                   "more, not '$1' (--help)" >&2; exit 2 ;;
esac
rounds=${1:-3}
PY=/usr/bin/python3
dir=${TP_IMAGES_DIR:-/tmp/towerpack-bench-jpegs}
out=bench/results/images.jsonl
mkdir -p bench/results
: > "$out"

bench_install_missing python3-torch python3-torchvision python3-opencv \
  python3-pil python3-numpy python3-tqdm python3-termcolor python3-tabulate \
  python3-msgpack-numpy python3-zmq python3-psutil libturbojpeg0-dev
bench_release_build 2 tp-bench tjdecode

if [ ! -d "$dir" ]; then "$PY" bench/images/gen_jpegs.py "$dir" 2000; fi
mapfile -t files < <(find "$dir" -name '*.jpg' | sort)
mb=$(du -cb "${files[@]}" | tail -1 | cut -f1)
echo "images: ${#files[@]} JPEGs, $((mb / 1000000)) MB in $dir"

aug="random-resized-crop=224, flip, brightness-scale=0.6:1.4, contrast=0.6:1.4, saturation=0.4, mean=123.675/116.28/103.53, std=58.395/57.12/57.375"
pipe="imagefolder:$dir,mode=rgb | imgaug $aug | processes 2 | batch 64"
dec="imagefolder:$dir,mode=rgb,shuffle=0"
echo "towerpack pipeline: $pipe"
rec() { echo "{\"kind\": \"$1\", \"round\": $2, \"r\": $3}" >> "$out"; }

for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds"
  # decode only, one core: towerpack's source (file read + decode) and
  # libjpeg-turbo alone (from memory)
  j=$(build-release/bin/tp-bench dataflow "$dec" --seconds 4 --json 2>/dev/null)
  rec tp_decode "$r" "$j"
  j=$(build-release/bench/tjdecode 4 "${files[@]}")
  rec tj_decode "$r" "$j"
  # the ImageNet training augmentation, 2 workers, batch 64
  j=$(build-release/bin/tp-bench dataflow "$pipe" --count 40 --warmup 4 --json 2>/dev/null)
  rec tp_pipeline "$r" "$j"
  j=$("$PY" bench/images/peers.py torchvision "$dir" --batches 40 --warmup 4 2>/dev/null | tail -1)
  rec torchvision "$r" "$j"
  j=$("$PY" bench/images/peers.py tensorpack "$dir" --batches 40 --warmup 4 2>/dev/null | tail -1)
  rec tensorpack "$r" "$j"
done

"$PY" - "$out" "$mb" "${#files[@]}" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
mb, n = float(sys.argv[2]) / 1e6, int(sys.argv[3])
def med(kind, f):
    v = [f(r["r"]) for r in rows if r["kind"] == kind and r["r"] and "skipped" not in r["r"]]
    return statistics.median(v) if v else None
tp_dec = med("tp_decode", lambda r: r["samples_per_s"] * mb / n)
tj_dec = med("tj_decode", lambda r: r["mb_per_s"])
tp = med("tp_pipeline", lambda r: r["samples_per_s"])
tv = med("torchvision", lambda r: r["images_per_s"])
tk = med("tensorpack", lambda r: r["images_per_s"])
print()
print("%-52s %10s" % ("measurement (median of rounds)", "value"))
print("%-52s %10.1f" % ("decode only, 1 core: towerpack imagefolder MB/s", tp_dec))
print("%-52s %10.1f" % ("decode only, 1 core: libjpeg-turbo alone MB/s", tj_dec))
print("%-52s %10.2f  (goal >= 0.9)" % ("  ratio", tp_dec / tj_dec))
print("%-52s %10.1f" % ("ImageNet augmentation, 2 workers: towerpack img/s", tp))
print("%-52s %10.1f" % ("  torchvision DataLoader img/s", tv))
if tk is None:
    print("%-52s %10s" % ("  tensorpack img/s", "skipped (set TENSORPACK_SRC)"))
else:
    print("%-52s %10.1f" % ("  tensorpack MultiProcessMapDataZMQ img/s", tk))
best = max(x for x in (tv, tk) if x is not None)
print("%-52s %10.2f  (goal >= 2)" % ("  ratio to the faster peer", tp / best))
for r in rows:
    if r["kind"] == "tensorpack" and "skipped" in r["r"]:
        print("tensorpack:", r["r"]["skipped"]); break
PYEOF
