# towerpack MPI tests: shared set-up, sourced by tests/mpi/test_*.sh.
# Skips (exit 77: "Skipped" in ctest) when mpirun or the MPI module is
# missing; defines MPIRUN (an array), TP_TRAIN, ST_DIFF and a scratch $work.
set -euo pipefail
: "${TP_BUILD_DIR:?set by ctest}"
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIPPED: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
  exit 77
fi
if [ ! -e "$TP_BUILD_DIR/lib/libtowerpack_mpi.so" ]; then
  echo "SKIPPED: this build has no MPI module (TP_WITH_MPI; libopenmpi-dev missing at configure time?)"
  exit 77
fi
TP_TRAIN="$TP_BUILD_DIR/bin/tp-train"
ST_DIFF="$TP_BUILD_DIR/bin/tp-st-diff"
work=$(mktemp -d /tmp/tp-mpi-XXXXXX)
trap 'rm -rf "$work"' EXIT

# One machine, possibly as root in a container: allow root, more ranks than
# cores, shared memory between ranks without cross-memory attach (ptrace is
# often forbidden in containers).
MPIRUN=(mpirun --oversubscribe --mca btl self,vader
        --mca btl_vader_single_copy_mechanism none
        -x TP_LOG_LEVEL -x TP_DIST_HEARTBEAT_TIMEOUT -x TP_DIST_STEP_TIMEOUT)
if [ "$(id -u)" = 0 ]; then
  MPIRUN+=(--allow-run-as-root)
fi
export TP_LOG_LEVEL=${TP_LOG_LEVEL:-warn}
export TP_DIST_HEARTBEAT_TIMEOUT=${TP_DIST_HEARTBEAT_TIMEOUT:-10}
export TP_DIST_STEP_TIMEOUT=${TP_DIST_STEP_TIMEOUT:-60}
if [ "${TP_SANITIZE:-}" = address ]; then
  # Open MPI keeps allocations until exit by design: not our leaks
  # (scripts/test.sh sets detect_leaks=1; the last setting wins)
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
  MPIRUN+=(-x ASAN_OPTIONS)
fi

# Small, quick, deterministic runs: the MLP, one BLAS thread, no augmentation.
TRAIN_ARGS=(--model mlp --batch 32 --threads 1 --seed 7 --no-augment
            --stats off --logdir-action delete)
