#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, gets MNIST into
# data/mnist as scripts/setup_and_train.sh does (scripts/fetch_mnist.sh:
# ../shared/data/mnist beside the checkout, else the public mirrors; nothing
# to do once data/mnist holds it) and runs the tests with ctest. Offline, it
# says so in one line and the tests that need MNIST are reported as skipped,
# as GPU tests are on a machine without a GPU.
#
# Usage: scripts/run_tests.sh [--build-dir DIR] [--cpu-only] [--target T]... [-- CTEST_ARGS...]
#   --build-dir DIR, --cpu-only, --target T: passed on to scripts/build.sh (pair
#                    --target with -- -R so that ctest runs only what was built)
#   -- CTEST_ARGS    passed on to ctest, e.g. -- -R test_mnist_location
set -euo pipefail
help=$(awk '/^# Usage:/ { on = 1 } on && !/^#/ { exit } on { sub(/^# ?/, ""); print }' "$0")  # the Usage block above
cd "$(dirname "$0")/.."
usage="usage: scripts/run_tests.sh [--build-dir DIR] [--cpu-only] [--target T]... [-- CTEST_ARGS...]"
build_dir=build
build_args=()
ctest_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir | --target)
      if [ $# -lt 2 ] || [ -z "$2" ]; then
        echo "run_tests: $1 needs a value ($usage)" >&2
        exit 2
      fi
      if [ "$1" = --build-dir ]; then build_dir=$2; fi
      build_args+=("$1" "$2")
      shift 2 ;;
    --cpu-only) build_args+=("$1"); shift ;;
    --) shift; ctest_args=("$@"); break ;;
    -h | --help) echo "$help"; exit 0 ;;
    *) echo "run_tests: unknown argument '$1' ($usage)" >&2; exit 2 ;;
  esac
done

scripts/install_deps.sh
scripts/build.sh "${build_args[@]}"

# Where the tests look for MNIST: tests/CMakeLists.txt (data/mnist first).
if [ -n "${SG_MNIST_DIR:-}" ]; then
  echo "run_tests: the tests take MNIST from \$SG_MNIST_DIR ($SG_MNIST_DIR)"
elif fetch_log=$(scripts/fetch_mnist.sh data/mnist 2>&1); then
  echo "$fetch_log"
else
  echo "run_tests: could not get MNIST into data/mnist (${fetch_log##*$'\n'}); tests that find no MNIST will be skipped"
fi

ctest --test-dir "$build_dir" --output-on-failure --no-tests=error -j "$(nproc)" "${ctest_args[@]}"
