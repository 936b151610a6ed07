#!/usr/bin/env bash
# A/B of data-parallel settings on N GPUs (issue 38), alternating, REPS runs
# each: samples/s of `stepgraph train --gpus N` (the run's training steps,
# the "done:" line) and an md5 of its logged losses (equal sums: the same
# losses bit for bit). With BASE=1 each network also runs once on one GPU
# without --gpus first (the single-process step; efficiency's base).
# Networks: mlpW (configs/mnist_mlp.yaml widened to 784-W-W-W-10), report_cnn
# (configs/mnist_cnn.yaml) or a config file. Settings: "name=key=value,key=value".
# Usage: bench/data_parallel_ab.sh [DATA]
#   NETS="mlp1024 mlp8192 report_cnn configs/mnist_cnn_fast.yaml" GPUS=2 BATCH=256 STEPS=2000 REPS=2 BASE=1
#   SETTINGS="before=data_parallel.symmetric_memory=false,data_parallel.nccl_ctas=0 after="
# The 8192-wide MLP runs STEPS/4. NCCL_NVLS_ENABLE=0 (required on the shared GPU machines) passes through.
# Two builds in one run (a change's before/after): BINS="before=/tmp/base/build-dev/apps/stepgraph after=build/apps/stepgraph"
# runs every setting with each binary in turn (default: build/apps/stepgraph alone). To build a commit's tree
# beside this one: git archive COMMIT | tar -x -C DIR, then DIR/scripts/build.sh --build-dir build-dev --target stepgraph.
set -uo pipefail
set -f  # model.layers=[...] is not a glob
cd "$(dirname "$0")/.."
data="$(realpath -m "${1:-data/mnist}")"
out="$(realpath -m "${OUT:-runs/data_parallel_ab}")"; mkdir -p "$out"
settings=(${SETTINGS:-before=data_parallel.symmetric_memory=false,data_parallel.nccl_ctas=0 after=})
bins=(${BINS:-=build/apps/stepgraph})  # name=path; an empty name when there is one binary
config_of() {
  case $1 in
    mlp*) echo "-c configs/mnist_mlp.yaml --set model.layers=[784,${1#mlp},${1#mlp},${1#mlp},10]" ;;
    report_cnn) echo "-c configs/mnist_cnn.yaml" ;;
    *) echo "-c $1" ;;
  esac
}
train() {  # train BIN LOG STEPS ARGS...: prints samples/s and the losses' md5
  local bin=$1 log=$2 steps=$3; shift 3
  [ -x "$bin" ] || { echo "rc=127 no binary $bin"; return; }
  "$bin" train "$@" --set data.dir="$data" --set data.batch_size="${BATCH:-256}" --set run.epochs=0 \
    --set run.steps="$steps" --set run.log_every=100 --set run.eval_every=0 --set run.out_dir="$out/run" > "$log" 2>&1
  echo "rc=$? samples/s=$(grep -o "[0-9]* samples/s)" "$log" | tail -1 | grep -o "^[0-9]*")" \
       "losses-md5=$(grep -o "loss [0-9.e+-]*" "$log" | md5sum | cut -c1-8)"
}
for net in ${NETS:-mlp1024 mlp8192 report_cnn}; do
  steps=${STEPS:-2000}; [ "$net" = mlp8192 ] && steps=$((steps / 4))
  tag=$(basename "$net" .yaml)
  [ "${BASE:-1}" = 1 ] && echo "$tag 1p $(train "${bins[-1]#*=}" "$out/${tag}_1p.log" "$steps" $(config_of "$net"))"
done
for rep in $(seq 1 "${REPS:-2}"); do
  for net in ${NETS:-mlp1024 mlp8192 report_cnn}; do
    steps=${STEPS:-2000}; [ "$net" = mlp8192 ] && steps=$((steps / 4))
    tag=$(basename "$net" .yaml)
    for s in "${settings[@]}"; do
      for b in "${bins[@]}"; do
        name=${s%%=*}; [ -n "${b%%=*}" ] && name="${b%%=*}${name:+_$name}"; extra=()
        IFS=, read -ra kvs <<< "${s#*=}"
        for kv in "${kvs[@]}"; do [ -n "$kv" ] && extra+=(--set "$kv"); done
        echo "$tag $name rep$rep $(train "${b#*=}" "$out/${tag}_${name}_$rep.log" "$steps" --gpus "${GPUS:-2}" \
          $(config_of "$net") "${extra[@]}")"
      done
    done
  done
done
