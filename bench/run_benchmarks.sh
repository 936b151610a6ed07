#!/usr/bin/env bash
# One command on the GPU machine: PyTorch baselines, then stepgraph's graph
# replay and stream launches (with floors) in the same session; writes
# bench.json/.csv/.md, speed.svg, speedup.svg and profile.txt into OUT.
# Usage: bench/run_benchmarks.sh [OUT=runs/bench]
# Knobs (environment): WIDTHS, BATCHES, STEPS, REPEATS, WARMUP, DATA, COMPILE_BATCHES, TORCH_MODES,
# MULTI_STEP (default 16: also graph replay with 16 steps per graph launch,
# graph_replay_x16, and PyTorch's torch_cudagraph_x16; 0 turns both off)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/bench}"
data="${DATA:-data/mnist}"
widths="${WIDTHS:-128,256,512,1024,2048,4096,8192}"
batches="${BATCHES:-32,256,1024}"
steps="${STEPS:-5000}"
repeats="${REPEATS:-5}"
warmup="${WARMUP:-200}"
multi_step="${MULTI_STEP:-16}"
torch_modes="${TORCH_MODES:-torch_eager,torch_compile,torch_cudagraph}"
[ "$multi_step" -gt 1 ] && torch_modes="$torch_modes,torch_cudagraph_x$multi_step"
mkdir -p "$out"
data_abs="$(realpath -m "$data")"
out_abs="$(realpath -m "$out")"
[ -x build/apps/stepgraph ] || scripts/build.sh
(cd bench && PYTHONUNBUFFERED=1 python3 torch_bench.py --data "$data_abs" \
  --widths "$widths" --batches "$batches" --steps "$steps" --repeats "$repeats" --warmup "$warmup" \
  --compile-batches "${COMPILE_BATCHES:-32}" --modes "$torch_modes" \
  --out "$out_abs/torch.json")
build/apps/stepgraph bench --data "$data" --widths "$widths" --batches "$batches" --steps "$steps" \
  --repeats "$repeats" --warmup "$warmup" --multi-step "$multi_step" --out-dir "$out" --torch-json "$out/torch.json"
