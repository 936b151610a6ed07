#!/usr/bin/env bash
# Data-parallel scaling (issues 25, 38): samples/s of `stepgraph train --gpus N`
# against PyTorch DDP (bench/torch_ddp.py under torchrun, NCCL; its best
# setting: bf16 gradient compression, gradient_as_bucket_view, static_graph)
# on the same machine in the same run, for each N and network, per-GPU batch
# B; prints a markdown table (efficiency = samples/s at N over N x samples/s
# at 1). Networks: the MLP 784-W-W-W-10 for each width in WIDTHS (SGD), with
# CNN=1 the report CNN of configs/mnist_cnn.yaml (SGD, momentum 0.5), and
# each config file in CONFIGS as written (its optimizer and precision; DDP
# runs the module `stepgraph export` writes from the 1-GPU run's checkpoint,
# with the config's optimizer: bench/torch_ddp.py --model config).
# stepgraph's figure is its run's training steps (the "done:" line, steps
# only); DDP's the median of timed repeats after warm-up (CUDA events).
# GPUS may hold "1p": one GPU in a single process (no data-parallel rank:
# the step a user gets without --gpus), the other counts' efficiency base
# when it comes first (no DDP figure for it).
# SG_SET="key=value ..." adds --set options to every stepgraph run (an A/B:
# e.g. precision.all_reduce=compute or backend.communication_stream=false,
# with DDP=0 to skip the DDP column).
# Usage: bench/data_parallel_scaling.sh [DATA] ; GPUS="1 2" WIDTHS="8192 1024" CNN=1 CONFIGS="" BATCH=256 STEPS=300
# NCCL_NVLS_ENABLE=0 (required on the shared GPU machines) passes through to every rank.
set -uo pipefail
cd "$(dirname "$0")/.."
data="$(realpath -m "${1:-data/mnist}")"
gpus=(${GPUS:-1 2}); widths=(${WIDTHS-8192 1024}); batch=${BATCH:-256}; steps=${STEPS:-300}
out="$(realpath -m "${OUT:-runs/data_parallel_scaling}")"; mkdir -p "$out"
networks=()
for w in "${widths[@]}"; do networks+=("mlp$w"); done
[ "${CNN:-0}" = 1 ] && networks+=("report_cnn")
for c in ${CONFIGS:-}; do networks+=("$c"); done
extra=(); for kv in ${SG_SET:-}; do extra+=(--set "$kv"); done
eff() { python3 -c "print(f'{($1)/($2)/($3/$4):.2f}')" 2>/dev/null || echo "?"; }
echo "| network | batch/GPU | GPUs | stepgraph samples/s | efficiency | PyTorch DDP samples/s | efficiency |"
echo "|---|---|---|---|---|---|---|"
for net in "${networks[@]}"; do
  base_sg=""; base_pt=""
  for n in "${gpus[@]}"; do
    tag=$(basename "$net" .yaml); log="$out/stepgraph_${tag}_n${n}.log"; run_dir="$out/sg_${tag}_n${n}"
    if [ "$net" = report_cnn ]; then
      config=(-c configs/mnist_cnn.yaml); torch_args=(--model report_cnn)
    elif [[ "$net" == *.yaml ]]; then
      config=(-c "$net" --set run.checkpoint="$run_dir/final.ckpt")
      torch_args=(--model config --config "$(realpath "$net")" --module-from "$out/${tag}_module.safetensors")
    else
      w=${net#mlp}
      # The default job's optimizer and fp16 weights (as issue 25's table), its layers widened.
      config=(-c configs/mnist_mlp.yaml --set "model.layers=[784,$w,$w,$w,10]")
      torch_args=(--width "$w")
    fi
    ranks=(--gpus "$n"); [ "$n" = 1p ] && ranks=()
    build/apps/stepgraph train "${ranks[@]}" "${config[@]}" --set data.dir="$data" --set data.batch_size="$batch" \
      --set run.epochs=0 --set run.steps="$steps" --set run.log_every="$steps" --set run.eval_every=0 \
      --set run.out_dir="$run_dir" "${extra[@]}" > "$log" 2>&1
    sg=$(grep -o "[0-9]* samples/s)" "$log" | tail -1 | grep -o "^[0-9]*")
    if [[ "$net" == *.yaml && ! -f "$out/${tag}_module.safetensors" ]]; then
      build/apps/stepgraph export --checkpoint "$run_dir/final.ckpt" -f safetensors \
        -o "$out/${tag}_module.safetensors" >> "$log" 2>&1
    fi
    pt=""
    [ "${DDP:-1}" = 1 ] && [ "$n" != 1p ] && pt=$(cd bench && torchrun --standalone --nproc_per_node "$n" \
           torch_ddp.py --data "$data" "${torch_args[@]}" --batch "$batch" 2> "$out/ddp_${tag}_n${n}.err" |
           python3 -c "import json,sys; print(round(json.loads(sys.stdin.readlines()[-1])['samples_per_s']))")
    k=${n%p}  # GPUs
    [ -z "$base_sg" ] && base_sg=$sg && base_n=$k
    [ -z "$base_pt" ] && base_pt=$pt && base_pt_n=$k
    sg_eff=$(eff "${sg:-0}" "${base_sg:-1}" "$k" "$base_n")
    pt_eff=$(eff "${pt:-0}" "${base_pt:-1}" "$k" "${base_pt_n:-1}")
    [ -z "$pt" ] && pt_eff="" && pt="-"
    echo "| $tag | $batch | $n | ${sg:-failed} | $sg_eff | $pt | $pt_eff |"
  done
done
