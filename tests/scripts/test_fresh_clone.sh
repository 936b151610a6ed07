#!/usr/bin/env bash
# The README's test command on a fresh clone (issue 34): a copy of this tree
# as a clone has it (git's tracked and untracked-but-not-ignored files, so
# uncommitted work is tested too) in a temp folder with no ../shared beside
# it, where scripts/run_tests.sh (CPU only, building just test_mnist_location):
#  1. fetches MNIST into data/mnist from a local copy (fetch_mnist.sh's offline
#     source; no network) and the test case that reads it passes;
#  2. with no source at all says so in one line, still exits 0, and that case
#     is reported as skipped, its SKIPPED line naming both folders looked in.
# Skipped (77) without git, outside a git checkout, where scripts/install_deps.sh
# would have to install packages (not a Debian machine set up by it), or
# without real MNIST here.
# Usage: test_fresh_clone.sh <source dir>
set -euo pipefail
src=$(cd "$1" && pwd)
if ! command -v git >/dev/null || ! git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  echo "SKIPPED: git or a git checkout at $src is missing (the copy is git's list of the checkout's files)"
  exit 77
fi
if ! missing=$("$src/scripts/install_deps.sh" --check); then
  echo "SKIPPED: the README's test path installs packages here (${missing#install_deps: }), and this test installs nothing"
  exit 77
fi
source "$src/tests/support/mnist_dir.sh"
sg_mnist_dir_or_skip real_mnist  # the offline source for scripts/fetch_mnist.sh in the clone
real_mnist=$(cd "$real_mnist" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
clone=$work/stepgraph
fail() { echo "FAIL: $*"; exit 1; }

mkdir "$clone"
git -C "$src" ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' file; do
    if [ -e "$src/$file" ] || [ -L "$src/$file" ]; then printf '%s\0' "$file"; fi  # not a deleted tracked file
  done |
  tar -C "$src" --null -T - -cf - | tar -C "$clone" -xf -
[ -x "$clone/scripts/run_tests.sh" ] || fail "the copy in $clone has no executable scripts/run_tests.sh"
[ ! -e "$clone/data" ] || fail "the copy in $clone already has data/ (it is ignored: a clone has none)"

case_name="test_mnist_location:real MNIST is found"
run_tests() {  # run_tests <log> <MNIST source dir>: the README's command in the clone, building and running one test
  (cd "$clone" && env -u SG_MNIST_DIR -u SG_TEST_MNIST_DIRS MNIST_SOURCE_DIR="$2" MNIST_MIRRORS="" \
    scripts/run_tests.sh --build-dir build-probe --cpu-only --target test_mnist_location -- -R '^test_mnist_location:') \
    >"$1" 2>&1
}

# 1. MNIST fetched into data/mnist: the test finds it there and passes.
start=$SECONDS
run_tests "$work/fetched.log" "$real_mnist" || { cat "$work/fetched.log"; fail "run_tests.sh failed in the clone"; }
echo "fresh clone: install_deps + configure + build of test_mnist_location + fetch + ctest took $((SECONDS - start)) s"
grep -q "^fetch_mnist: data/mnist/train-images-idx3-ubyte.gz from $real_mnist" "$work/fetched.log" ||
  { cat "$work/fetched.log"; fail "run_tests.sh did not fetch MNIST into data/mnist from $real_mnist"; }
grep -q "$case_name.* Passed" "$work/fetched.log" || { cat "$work/fetched.log"; fail "'$case_name' did not pass"; }
if ! grep -q "100% tests passed, 0 tests failed out of 3" "$work/fetched.log" || grep -q "did not run" "$work/fetched.log"; then
  cat "$work/fetched.log"
  fail "not all 3 test_mnist_location cases passed"
fi
(cd "$clone" && MNIST_SOURCE_DIR=/nonexistent MNIST_MIRRORS="" scripts/fetch_mnist.sh data/mnist >/dev/null) ||
  fail "data/mnist in the clone does not hold the four SHA-256-verified files"
echo "ok: the clone's tests found MNIST in data/mnist"

# 2. No MNIST anywhere: one line says so, the case is skipped, run_tests.sh exits 0.
rm -rf "$clone/data"
run_tests "$work/offline.log" /nonexistent || { cat "$work/offline.log"; fail "run_tests.sh failed without MNIST"; }
[ "$(grep -c '^run_tests: could not get MNIST into data/mnist' "$work/offline.log")" -eq 1 ] ||
  { cat "$work/offline.log"; fail "run_tests.sh did not say in one line that it has no MNIST"; }
grep -q "$case_name.*\*\*\*Skipped" "$work/offline.log" || { cat "$work/offline.log"; fail "'$case_name' was not skipped"; }
grep -q "100% tests passed, 0 tests failed out of 3" "$work/offline.log" ||
  { cat "$work/offline.log"; fail "the other test_mnist_location cases did not pass"; }
rc=0
out=$(cd "$clone" && env -u SG_MNIST_DIR build-probe/tests/test_mnist_location --test-case='real MNIST*') || rc=$?
[ "$rc" -eq 77 ] || fail "test_mnist_location without MNIST exited $rc, not 77: $out"
want="SKIPPED: no MNIST (looked in $clone/data/mnist, $clone/../shared/data/mnist; get it with scripts/fetch_mnist.sh)"
grep -qxF "$want" <<<"$out" || fail "no line '$want' in: $out"
echo "ok: without MNIST the case is skipped and run_tests.sh exits 0"
echo "fresh clone: 2 checks passed"
