# towerpack benchmarks: what bench/run.sh, bench/predict.sh,
# bench/images/run.sh and the peers' scripts (bench/peers/*.sh) share.
# shellcheck shell=bash
# Sourced (from the repository root), never run.

# Installs Debian packages (apt-get, through sudo unless root); for the
# peers a benchmark needs when they are missing.
bench_install() {
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

# bench_install_missing PKG...: bench_install for those of the Debian
# packages that dpkg does not have installed; nothing when all are.
bench_install_missing() {
  local p missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "bench: installing ${missing[*]}" >&2
    bench_install "${missing[@]}"
  fi
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

# bench_torch_envs: the environments PyTorch's runs are tried under, one a
# line, its best counting: its defaults, and on a CPU with AVX-512 its
# AVX-512 paths too. Debian's PyTorch 1.13 dispatches its own kernels as
# AVX2 and its OpenBLAS (0.3.21) takes Haswell's AVX2 kernels on a CPU it
# does not know (Zen 5: EPYC family 26): ATEN_CPU_CAPABILITY=avx512 and
# OPENBLAS_CORETYPE=SkylakeX give it the 512-bit ones, which on Zen 5's
# full-width units gave its GPT step 1.1-1.25x (docs/performance.md,
# "The hosts"). Each line is `env` arguments ("" for none).
bench_torch_envs() {
  echo ""
  grep -qw avx512f /proc/cpuinfo && echo "ATEN_CPU_CAPABILITY=avx512 OPENBLAS_CORETYPE=SkylakeX"
  return 0
}
