#!/usr/bin/env bash
# Every benchmark network (bench/networks/*.yaml, or the configs named) against
# PyTorch's best setting in the same command: stepgraph's graph replay and
# stream launches, and torch.compile inside a hand-captured CUDA graph (same
# initial weights, optimizer and batches), one table row a network. A survey
# for the networks no issue names (docs/benchmarks.md, "Channels-last through
# dropout2d and mean pooling"): run it before and after a change to a lowering.
# Usage (GPU machine): bench/networks_vs_torch.sh [CONFIG...]
# Knobs (environment): STEPS (500), REPEATS (5), WARMUP (100), OUT (runs/networks_vs_torch), BIN, EXTRA (bench flags)
set -uo pipefail
cd "$(dirname "$0")/.."
bin="${BIN:-build/apps/stepgraph}"
out="${OUT:-runs/networks_vs_torch}"
[ -x "$bin" ] || { echo "networks_vs_torch: $bin not built (scripts/build.sh)" >&2; exit 1; }
mkdir -p "$out"
configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=(bench/networks/*.yaml)
echo "| network | batch | graph replay us | stream launch us | PyTorch best us | PyTorch / graph | layout |"
echo "|---|---|---|---|---|---|---|"
status=0
for config in "${configs[@]}"; do
  name="$(basename "$config" .yaml)"
  log="$out/$name.log"
  # shellcheck disable=SC2086  # EXTRA holds several flags
  if "$bin" bench --config "$config" --torch --torch-modes compile_in_graph --steps "${STEPS:-500}" \
      --repeats "${REPEATS:-5}" --warmup "${WARMUP:-100}" --no-profile --out-dir "$out/$name" ${EXTRA:-} > "$log" 2>&1; then
    row="$(grep -A2 '| width' "$log" | tail -1)"
    layout="$(grep -m1 -oE '(NCHW|channels-last) \([^)]*\)' "$log")"
    echo "$row" | awk -F'|' -v n="$name" -v l="$layout" '{printf "| %s |%s|%s|%s|%s|%s| %s |\n", n, $3, $4, $5, $6, $7, l}'
  else
    echo "| $name | failed: see $log | | | | | |"
    status=1
  fi
done
exit $status
