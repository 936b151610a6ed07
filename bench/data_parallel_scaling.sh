#!/usr/bin/env bash
# Data-parallel scaling (issues 25, 38): samples/s of `stepgraph train --gpus N`
# against PyTorch DDP (bench/torch_ddp.py under torchrun, NCCL; its best
# setting: bf16 gradient compression, gradient_as_bucket_view, static_graph)
# on the same machine in the same run, for each N and network, per-GPU batch
# B; prints a markdown table (efficiency = samples/s at N over N x samples/s
# at 1). Networks: the MLP 784-W-W-W-10 for each width in WIDTHS (SGD), and
# with CNN=1 the report CNN of configs/mnist_cnn.yaml (SGD, momentum 0.5).
# stepgraph's figure is its run's training steps (the "done:" line, steps
# only); DDP's the median of timed repeats after warm-up (CUDA events).
# Usage: bench/data_parallel_scaling.sh [DATA] ; GPUS="1 2" WIDTHS="8192 1024" CNN=1 BATCH=256 STEPS=300
# NCCL_NVLS_ENABLE=0 (required on the shared GPU machines) passes through to every rank.
set -uo pipefail
cd "$(dirname "$0")/.."
data="$(realpath -m "${1:-data/mnist}")"
gpus=(${GPUS:-1 2}); widths=(${WIDTHS-8192 1024}); batch=${BATCH:-256}; steps=${STEPS:-300}
out="$(realpath -m "${OUT:-runs/data_parallel_scaling}")"; mkdir -p "$out"
networks=()
for w in "${widths[@]}"; do networks+=("mlp$w"); done
[ "${CNN:-0}" = 1 ] && networks+=("report_cnn")
eff() { python3 -c "print(f'{($1)/($2)/($3/$4):.2f}')" 2>/dev/null || echo "?"; }
echo "| network | batch/GPU | GPUs | stepgraph samples/s | efficiency | PyTorch DDP samples/s | efficiency |"
echo "|---|---|---|---|---|---|---|"
for net in "${networks[@]}"; do
  base_sg=""; base_pt=""
  for n in "${gpus[@]}"; do
    log="$out/stepgraph_${net}_n${n}.log"
    if [ "$net" = report_cnn ]; then
      config=(-c configs/mnist_cnn.yaml); torch_args=(--model report_cnn)
    else
      w=${net#mlp}
      # The default job's optimizer and fp16 weights (as issue 25's table), its layers widened.
      config=(-c configs/mnist_mlp.yaml --set "model.layers=[784,$w,$w,$w,10]")
      torch_args=(--width "$w")
    fi
    build/apps/stepgraph train --gpus "$n" "${config[@]}" --set data.dir="$data" --set data.batch_size="$batch" \
      --set run.epochs=0 --set run.steps="$steps" --set run.log_every="$steps" --set run.eval_every=0 \
      --set run.out_dir="$out/sg_${net}_n${n}" > "$log" 2>&1
    sg=$(grep -o "[0-9]* samples/s)" "$log" | tail -1 | grep -o "^[0-9]*")
    pt=$(cd bench && torchrun --standalone --nproc_per_node "$n" torch_ddp.py --data "$data" "${torch_args[@]}" \
           --batch "$batch" 2> "$out/ddp_${net}_n${n}.err" | python3 -c "import json,sys; print(round(json.loads(sys.stdin.readlines()[-1])['samples_per_s']))")
    [ -z "$base_sg" ] && base_sg=$sg && base_n=$n
    [ -z "$base_pt" ] && base_pt=$pt
    echo "| $net | $batch | $n | ${sg:-failed} | $(eff "${sg:-0}" "${base_sg:-1}" "$n" "$base_n") | ${pt:-failed} | $(eff "${pt:-0}" "${base_pt:-1}" "$n" "$base_n") |"
  done
done
