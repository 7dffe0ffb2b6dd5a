#!/usr/bin/env bash
# towerpack: the test command. On a fresh Debian machine it installs the
# dependencies, builds (with the CUDA backend when nvcc is there), runs every
# test, then rebuilds under AddressSanitizer+UndefinedBehaviorSanitizer and
# runs every test again, then runs the concurrent suites (actors, threaded
# dataflows, trainer) under ThreadSanitizer, a short libFuzzer smoke of
# every decoder (scripts/fuzz.sh) and valgrind memcheck on a tiny training
# run (scripts/valgrind.sh). Any failure exits non-zero.
#
#   bash scripts/test.sh            everything
#   TP_TEST_QUICK=1 bash scripts/test.sh   skip the sanitizer, valgrind and fuzz passes
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

bash scripts/install-deps.sh

werror=OFF
if [ -n "${CI:-}" ]; then werror=ON; fi

step() { printf '\n==== %s ====\n' "$*"; }

step "build (CUDA backend: AUTO)"
cmake -S . -B build -DTP_WERROR=$werror -DTP_WITH_CUDA=AUTO
cmake --build build -j"$jobs"
step "tests"
(cd build && ctest --output-on-failure -j"$jobs")

if [ -z "${TP_TEST_QUICK:-}" ]; then
  step "valgrind memcheck: a tiny run of the main job"
  bash scripts/valgrind.sh

  step "build under AddressSanitizer + UndefinedBehaviorSanitizer"
  cmake -S . -B build-asan -DTP_WERROR=$werror -DTP_WITH_CUDA=OFF \
        -DTP_SANITIZE=address -DCMAKE_BUILD_TYPE=Debug
  cmake --build build-asan -j"$jobs"
  step "tests under ASan+UBSan"
  # Criterion forks per test; leak checking happens in each child.
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     ctest --output-on-failure -j"$jobs")

  step "build under ThreadSanitizer (the concurrent suites)"
  cmake -S . -B build-tsan -DTP_WERROR=$werror -DTP_WITH_CUDA=OFF \
        -DTP_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug -DTP_BUILD_TOOLS=OFF
  cmake --build build-tsan -j"$jobs"
  step "tests under TSan"
  (cd build-tsan && ctest --output-on-failure -j"$jobs")

  step "fuzz smoke: each libFuzzer target for 10 s (clang, ASan+UBSan)"
  bash scripts/fuzz.sh 10
fi
step "all tests passed"
