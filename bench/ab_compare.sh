#!/usr/bin/env bash
# Same-run A/B of two builds of stepgraph on the GPU machine: `stepgraph bench`
# of the base build and of this tree alternate ROUNDS times (base, new, base,
# new, ...), each writing its own bench.json; ab_table.py reports, per mode,
# width and batch, the median over rounds of each side and the change, and the
# largest graph_replay change. A change that touches a fast path shows its
# before/after this way (docs/benchmarks.md).
# Usage: bench/ab_compare.sh BASE_BIN NEW_BIN [OUT]   (e.g. /tmp/old/build/apps/stepgraph build/apps/stepgraph)
# Knobs (environment): WIDTHS (128,1024,8192), BATCHES (32,256), STEPS (1000),
# REPEATS (3), WARMUP (200), MULTI_STEP (16), ROUNDS (2), DATA (data/mnist).
set -euo pipefail
cd "$(dirname "$0")/.."
base="$1"
new="$2"
out="${3:-runs/ab}"
mkdir -p "$out"
args=(--data "${DATA:-data/mnist}" --widths "${WIDTHS:-128,1024,8192}" --batches "${BATCHES:-32,256}"
      --steps "${STEPS:-1000}" --repeats "${REPEATS:-3}" --warmup "${WARMUP:-200}" --multi-step "${MULTI_STEP:-16}"
      --no-profile)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader || true
for round in $(seq 1 "${ROUNDS:-2}"); do
  for side in base new; do
    bin="$base"; [ "$side" = new ] && bin="$new"
    echo "=== round $round: $side ($bin)"
    "$bin" bench "${args[@]}" --out-dir "$out/${side}_$round" > "$out/${side}_$round.log" 2>&1 ||
      { tail -20 "$out/${side}_$round.log"; exit 1; }
  done
done
python3 bench/ab_table.py "$out" | tee "$out/ab.md"
