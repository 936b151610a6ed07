# shellcheck shell=bash
# Sourced by the shell tests: where real MNIST is, by the rule of
# tests/support/test_data.hpp ($SG_MNIST_DIR alone when set, else the first
# folder of the ':'-separated $SG_TEST_MNIST_DIRS, which ctest sets from
# tests/CMakeLists.txt, holding the four gzip'd IDX files).

# sg_mnist_dir_or_skip VAR: sets VAR to that folder, or prints one SKIPPED
# line and exits 77 (ctest: skipped) when no folder holds the files. Locals
# are _sg_-prefixed so that VAR cannot name one of them.
sg_mnist_dir_or_skip() {
  local -a _sg_candidates=() _sg_entries=()
  local _sg_dir _sg_name _sg_looked=""
  if [[ -n ${SG_MNIST_DIR:-} ]]; then
    _sg_candidates=("$SG_MNIST_DIR")
  else
    IFS=: read -r -a _sg_entries <<< "${SG_TEST_MNIST_DIRS:-}"
    for _sg_dir in "${_sg_entries[@]}"; do
      if [[ -n $_sg_dir ]]; then _sg_candidates+=("$_sg_dir"); fi
    done
  fi
  for _sg_dir in "${_sg_candidates[@]}"; do
    for _sg_name in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
      [[ -f $_sg_dir/$_sg_name.gz ]] || continue 2
    done
    printf -v "$1" '%s' "$_sg_dir"
    return 0
  done
  for _sg_dir in "${_sg_candidates[@]}"; do _sg_looked+=${_sg_looked:+, }$_sg_dir; done
  echo "SKIPPED: no MNIST (looked in ${_sg_looked:-no folder: SG_TEST_MNIST_DIRS is empty}; get it with scripts/fetch_mnist.sh)"
  exit 77
}
