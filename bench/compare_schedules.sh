#!/usr/bin/env bash
# Launches per step of two builds of stepgraph, side by side, for the shipped
# configs and the bench shapes (a refactor of the scheduler must keep them).
# Usage: bench/compare_schedules.sh OLD_BIN NEW_BIN MNIST_DIR   (needs a GPU)
old=$1; new=$2; data=$3
run() {  # bin config extra...
  local bin=$1 cfg=$2; shift 2
  "$bin" train --config "$cfg" --set data.dir="$data" --set run.epochs=0 --set run.steps=2 --set run.log_every=1 --set run.eval_every=0 \
    --set run.out_dir=/tmp/cmp_run "$@" 2>&1 | grep -o "[0-9]* launches per step[^,]*" | head -1
}
for cfg in configs/mnist_mlp.yaml configs/parity_reference.yaml configs/ci_small.yaml configs/wide_4096.yaml; do
  echo "$cfg | old: $(run $old $cfg --set backend.kind=cuda) | new: $(run $new $cfg --set backend.kind=cuda)"
done
for w in 64 128 1024 8192; do for b in 32 48 256 1024; do
  ex=(--set "model.layers=[784,$w,$w,$w,10]" --set data.batch_size=$b --set precision.weights=fp16)
  echo "784-$w-$w-$w-10 b$b | old: $(run $old configs/parity_reference.yaml "${ex[@]}") | new: $(run $new configs/parity_reference.yaml "${ex[@]}")"
done; done
ex=(--set "model.layers=[784,128,128,128,10]" --set data.batch_size=64 --set precision.weights=fp16 --set backend.steps_per_launch=4)
echo "128 b64 k4 | old: $(run $old configs/parity_reference.yaml "${ex[@]}") | new: $(run $new configs/parity_reference.yaml "${ex[@]}")"
