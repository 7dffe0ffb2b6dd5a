# towerpack GPU steps: helpers for the lines of the step files in this
# folder (each line sources this file; `bash scripts/gpu-check.sh steps
# FILE` runs the line in the checkout's root with the checks' environment:
# .gpu/ unpacked, the libraries' path, TP_CUDA_MODULE, OUT exported).
# Every measurement becomes one row of $OUT/results.md through
# scripts/gpu/results.py, ready to paste into docs/cuda.md.
#
# STEPS_DRY=1 (tests/tools/gpu_check_scripts.sh, or by hand on a machine
# without a GPU) runs each program with the GPU flags turned into CPU ones
# and the sizes cut (tp-train: --devices cpu, 2 steps of one epoch): the
# programs' flags and the rows are checked, nothing is measured.

# the interpreter with torch: the device's python3; Debian's here
PY=python3
[ "${STEPS_DRY:-0}" = 1 ] && [ -x /usr/bin/python3 ] && PY=/usr/bin/python3
# the programs: .gpu/bin there, BIN (e.g. build/bin) for a dry run
BIN=${BIN:-.gpu/bin}

# the GPT's text: towerpack's own docs (about 0.9 MB), and 20 KB of it
# where validation must stay short (under compute-sanitizer)
corpus() {
    [ -s /tmp/tp-corpus.txt ] || cat docs/*.md >/tmp/tp-corpus.txt
    [ -s /tmp/tp-corpus-small.txt ] || head -c 20000 /tmp/tp-corpus.txt >/tmp/tp-corpus-small.txt
}

# ResNet-18's JPEGs: 3 classes x 400 at 256 px (bench/images/gen_colour.py)
images() {
    [ -d /tmp/tp-colour/red ] || "$PY" bench/images/gen_colour.py /tmp/tp-colour 400 256
}

# A dry run's flags: the device's turned into the CPU's, the run cut short.
s_dry_train() {
    local a out=()
    for a in "$@"; do
        case "$a" in
            0) [ "${out[-1]:-}" = --devices ] && a=cpu ;;
        esac
        out+=("$a")
    done
    out+=(--epochs 1 --steps-per-epoch 2)
    printf '%s\n' "${out[@]}"
}

# the logdir of tp_train LABEL
logdir() {
    echo "/tmp/tp-$(printf '%s' "$1" | tr -c 'A-Za-z0-9' '-')"
}

# tp_train LABEL KEYS FLAGS...: tp-train with FLAGS (its logdir
# $(logdir LABEL)), then the row of KEYS from its stats.json.
tp_train() {
    local label=$1 keys=$2 dir rc
    shift 2
    dir=$(logdir "$label")
    if [ "${STEPS_DRY:-0}" = 1 ]; then
        mapfile -t args < <(s_dry_train "$@")
        set -- "${args[@]}"
    fi
    echo "== tp-train $*"
    "$BIN/tp-train" --logdir "$dir" --logdir-action delete "$@" >"$dir.log" 2>&1
    rc=$?
    grep -E "^tp-train:|error|ERROR" "$dir.log" | tail -n 5
    "$PY" scripts/gpu/results.py stats "$label" "$dir/stats.json" "$keys" || rc=1
    return $rc
}

# peer LABEL KEYS CMD...: a program that ends with a JSON summary line (the
# PyTorch peers, example-autoencoder --json), then the row of its KEYS.
peer() {
    local label=$1 keys=$2 log rc
    shift 2
    log=/tmp/tp-peer-$$.txt
    echo "== $*"
    "$@" >"$log" 2>&1
    rc=$?
    tail -n 3 "$log"
    "$PY" scripts/gpu/results.py json "$label" "$keys" "$log" || rc=1
    return $rc
}

# compare LABEL LABEL_A LABEL_B KEYS: two tp_train runs' last epochs
compare() {
    "$PY" scripts/gpu/results.py compare "$1" "$(logdir "$2")/stats.json" \
        "$(logdir "$3")/stats.json" "$4"
}

# row LABEL TEXT...: a row of free text
row() {
    "$PY" scripts/gpu/results.py line "$@"
}

# ops_table LABEL FLAGS...: issue 42's op table (tp-bench ops FLAGS
# --json: each op's forward+backward against PyTorch on the same device),
# one row an op in results.md (results.py ops), and what tp-bench said on
# stderr (the rows not on CUDA, a failure). A dry run drops --device N,
# --seconds and --rounds, and times --quick on the CPU.
ops_table() {
    local label=$1 log=/tmp/tp-ops-$$.txt rc out=()
    shift
    if [ "${STEPS_DRY:-0}" = 1 ]; then
        while [ $# -gt 0 ]; do
            case "$1" in
                --device | --seconds | --rounds) shift ;;
                *) out+=("$1") ;;
            esac
            shift
        done
        set -- ${out[@]+"${out[@]}"} --quick
    fi
    echo "== tp-bench ops $*"
    "$BIN/tp-bench" ops "$@" --python "$PY" --json >"$log" 2>"$log.err"
    rc=$?
    grep -E "^tp-bench ops:" "$log.err" | tail -n 20
    "$PY" scripts/gpu/results.py ops "$label" "$log" || rc=1
    return $rc
}
