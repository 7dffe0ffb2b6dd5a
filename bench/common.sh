# towerpack benchmarks: what bench/run.sh and bench/predict.sh share.
# Sourced (from the repository root), never run.

# Installs Debian packages (apt-get, through sudo unless root); for the
# peers a benchmark needs when they are missing.
bench_install() {
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

# bench_release_build JOBS TARGET...: the targets in build-release, the same
# Release build as scripts/train.sh (configured on first use).
bench_release_build() {
  local jobs=$1
  shift
  if [ ! -f build-release/CMakeCache.txt ]; then
    cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DTP_WITH_CUDA=AUTO \
          -DTP_BUILD_TESTS=OFF >/dev/null
  fi
  cmake --build build-release -j"$jobs" --target "$@" >/dev/null
}
