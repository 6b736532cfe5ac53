#!/usr/bin/env bash
# tools/dev.sh — set up, build and run zinf on a Debian 12 machine.
#
#   tools/dev.sh run     install packages, build Release into build/, run the main job
#   tools/dev.sh test    install packages, build, run every test (ctest)
#   tools/dev.sh setup   install packages only
#   tools/dev.sh build   set up and build only
#   tools/dev.sh test-asan   the suite under AddressSanitizer + UndefinedBehaviorSanitizer, built
#                            into build-asan/ (-O1 -g1, CUDA off; ~15 min on 2 cores)
#   tools/dev.sh test-tsan   the suite under ThreadSanitizer, built into build-tsan/ (oneTBB
#                            replaced by an instrumented std::thread stand-in; see docs/development.md)
#
# Idempotent: packages already installed and an up-to-date build are skipped quickly.
# Environment: BUILD_DIR (default build), JOBS (default nproc), ZINF_CUDA (AUTO|ON|OFF).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}

packages=(
  build-essential cmake pkg-config
  liburing-dev libaio-dev libtbb-dev libopenblas-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libxxhash-dev libgloo-dev
  fio python3 python3-torch
)

setup() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "dev.sh: installing ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

build() {
  setup
  cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release \
    ${ZINF_CUDA:+-DZINF_CUDA=$ZINF_CUDA} >/dev/null
  cmake --build "$build_dir" -j "$jobs"
}

run_main() {
  build
  # The main job: `zinf train` on its defaults — a small GPT-2 whose weights, gradients and Adam
  # state live on NVMe (a swap file under build/train-swap), about a minute here.
  "$build_dir/zinf" train --summary-json "$build_dir/train-summary.json" "${@}"
}

run_tests() {
  build
  # The tests themselves use at most 2 threads; ctest runs two test processes side by side.
  (cd "$build_dir" && ctest --output-on-failure -j "$jobs" --timeout 600)
}

run_asan_tests() {
  setup
  local dir=${BUILD_DIR:-$root/build-asan}
  # -O1 -g1 (line tables: every report still names file and line) compiles in about half the
  # time of RelWithDebInfo's -O2 -g, which kept .ci/run near its 45-minute mark.
  cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZINF_CUDA=OFF -DZINF_BENCH=OFF \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DZINF_SANITIZE=address,undefined >/dev/null
  cmake --build "$dir" -j "$jobs"
  # Leaks are errors too; a report aborts the test (halt_on_error) so ctest counts it failed.
  (cd "$dir" && ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=1 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     ctest --output-on-failure -j "$jobs" --timeout 1200)
}

run_tsan_tests() {
  setup
  local dir=${BUILD_DIR:-$root/build-tsan}
  cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZINF_CUDA=OFF -DZINF_BENCH=OFF \
    -DZINF_SANITIZE=thread >/dev/null
  cmake --build "$dir" -j "$jobs"
  # A report fails the test (halt_on_error, exit code 66); suppressions only for third-party
  # code, each justified in tools/tsan.supp.
  (cd "$dir" && TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1:suppressions=$root/tools/tsan.supp" \
     ctest --output-on-failure -j "$jobs" --timeout 2400)
}

case "${1:-}" in
  run) shift; run_main "$@" ;;
  test) run_tests ;;
  test-asan) run_asan_tests ;;
  test-tsan) run_tsan_tests ;;
  setup) setup ;;
  build) build ;;
  *) echo "usage: tools/dev.sh run|test|test-asan|test-tsan|setup|build" >&2; exit 2 ;;
esac
