#!/usr/bin/env bash
# Compares the PTX that CUDA sources compile to at a git revision and in the
# working tree, with register numbers, labels and mangled names normalised:
# a refactor of kernel code (a helper pulled out, a duplicate removed) whose
# files show 0 differing lines changed no instruction, which a machine
# without a GPU can show. Needs nvcc (the toolkit under /usr/local/cuda).
#   scripts/compare_ptx.sh [--arch sm_90a] REV file.cu [file.cu ...]
# (paths from the repository root; --arch for the files built for sm_90a).
# Prints each file's number of differing lines; exits 1 where any differs.
set -euo pipefail
arch=sm_90
if [ "${1:-}" = --arch ]; then arch=$2; shift 2; fi
[ $# -ge 2 ] || { echo "usage: $0 [--arch sm_90a] REV file.cu [file.cu ...]" >&2; exit 2; }
rev=$1
shift
root=$(git rev-parse --show-toplevel)
nvcc=/usr/local/cuda/bin/nvcc
[ -x "$nvcc" ] || nvcc=nvcc
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/base"
git -C "$root" archive "$rev" | tar -x -C "$tmp/base"
ptx() {  # ROOT FILE OUT: OUT.norm is the normalised PTX
  "$nvcc" -std=c++17 -O3 -I"$1" -DSTEPGRAPH_HAVE_CUDNN=1 -arch="$arch" -ptx "$1/$2" -o "$3"
  sed -E 's/_ZN[A-Za-z0-9_]+/SYM/g; s/%(r|rd|f|fd|p|rs|h|hh)[0-9]+/%R/g; s/\$L__[A-Za-z0-9_]+/LBL/g' "$3" |
    grep -v '^//' > "$3.norm"
}
status=0
for f in "$@"; do
  ptx "$tmp/base" "$f" "$tmp/old.ptx"
  ptx "$root" "$f" "$tmp/new.ptx"
  n=$(diff "$tmp/old.ptx.norm" "$tmp/new.ptx.norm" | grep -c '^[<>]' || true)
  echo "$f: $n differing lines"
  [ "$n" = 0 ] || status=1
done
exit $status
