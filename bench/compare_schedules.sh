#!/usr/bin/env bash
# The launches of two builds of stepgraph, side by side, for every shipped
# config and the bench shapes: a refactor of the lowerings must keep them, or
# explain each difference (issue 35). Each case is `stepgraph inspect -f
# schedule` of both builds, reduced to one line per launch (lowering, its
# detail and the ops it runs; value names dropped), compared after renaming
# the old lowering names given with --rename. Prints "same" or the diff per
# case and the fast paths the new build says declined; exits 1 when any case
# differs. Run it on the GPU machine: without a GPU the lowerings that ask
# the device are left out of both.
# Usage: bench/compare_schedules.sh OLD_BIN NEW_BIN MNIST_DIR [--rename OLD=NEW ...]
set -uo pipefail
cd "$(dirname "$0")/.."
old=$1 new=$2 data=$3
shift 3
renames=()
while [ $# -gt 0 ]; do
  case $1 in
    --rename) renames+=(-e "s/\\b${2%%=*}\\b/${2#*=}/g"); shift 2 ;;
    *) echo "compare_schedules.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ ${#renames[@]} -gt 0 ] || renames=(-e '')

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# bin config [--set k=v ...] -> launches, one per line, without value names.
schedule() {
  local bin=$1 cfg=$2; shift 2
  "$bin" inspect -c "$cfg" -f schedule --set data.dir="$data" "$@" 2>&1 |
    grep -E '^L[0-9]+ |^# fast path|^error' | sed -E 's/ reads \{.*$//; s/ (writes|updates) \{.*$//; s/n[0-9]+://g'
}

differ=0
case_() {  # name config [--set ...]
  local name=$1; shift
  schedule "$old" "$@" | grep -v '^# fast path' | sed "${renames[@]}" > "$tmp/old"
  schedule "$new" "$@" > "$tmp/new_all"
  grep -v '^# fast path' "$tmp/new_all" > "$tmp/new"
  local n
  n=$(grep -c '^L' "$tmp/new")
  if diff -q "$tmp/old" "$tmp/new" > /dev/null; then
    echo "$name: same ($n launches)"
  else
    differ=1
    echo "$name: DIFFERS (old $(grep -c '^L' "$tmp/old"), new $n launches)"
    diff "$tmp/old" "$tmp/new" | sed 's/^/    /'
  fi
  grep '^# fast path' "$tmp/new_all" | sed 's/^/    /'
}

for cfg in configs/*.yaml; do
  case $cfg in
    */own_data_mnist_npz.yaml|*/regression_mse.yaml) continue ;;  # their own data files
  esac
  case_ "$(basename "$cfg")" "$cfg" --set backend.kind=cuda
done
for b in 64 256; do
  case_ "report CNN b$b" configs/mnist_cnn.yaml --set data.batch_size=$b
done
for w in 64 128 1024 8192; do for b in 32 48 256 1024; do
  case_ "784-$w-$w-$w-10 b$b" configs/parity_reference.yaml --set "model.layers=[784,$w,$w,$w,10]" \
    --set data.batch_size=$b --set precision.weights=fp16
done; done
case_ "784-128x3-10 b64 k4" configs/parity_reference.yaml --set "model.layers=[784,128,128,128,10]" \
  --set data.batch_size=64 --set precision.weights=fp16 --set backend.steps_per_launch=4
for opt in adam adamw; do
  case_ "784-1024x3-10 b256 $opt" configs/parity_reference.yaml --set "model.layers=[784,1024,1024,1024,10]" \
    --set data.batch_size=256 --set optim.name=$opt --set optim.lr=0.001
done
exit $differ
