#!/usr/bin/env bash
# scripts/fetch_mnist.sh: a good local copy lands verified (and a second run
# keeps it); a corrupted source is refused with one clear line and a
# non-zero exit, leaving no half-written file. No network is used.
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
source "$repo/tests/support/mnist_dir.sh"
sg_mnist_dir_or_skip source  # the local copy fed to the script
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

MNIST_SOURCE_DIR="$source" MNIST_MIRRORS="" "$repo/scripts/fetch_mnist.sh" "$work/good" || fail "a good local copy was refused"
[ "$(ls "$work/good"/*.gz | wc -l)" -eq 4 ] || fail "expected 4 files in $work/good"
MNIST_SOURCE_DIR=/nonexistent MNIST_MIRRORS="" "$repo/scripts/fetch_mnist.sh" "$work/good" >/dev/null \
  || fail "verified files already in place were not kept"

mkdir -p "$work/bad"
cp "$source"/*.gz "$work/bad/"
printf 'garbage' | gzip > "$work/bad/t10k-labels-idx1-ubyte.gz"
err="$(MNIST_SOURCE_DIR="$work/bad" MNIST_MIRRORS="" "$repo/scripts/fetch_mnist.sh" "$work/out" 2>&1 >/dev/null)"
status=$?
[ $status -ne 0 ] || fail "a corrupted source was accepted"
echo "$err" | grep -q "t10k-labels-idx1-ubyte.gz" || fail "the error does not name the file: $err"
[ ! -e "$work/out/t10k-labels-idx1-ubyte.gz" ] || fail "the corrupted file was left in place"
ls "$work/out" | grep -q part && fail "a temporary file was left behind"
echo "fetch_mnist script: 3 checks passed"
