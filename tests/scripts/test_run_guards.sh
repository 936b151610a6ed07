#!/usr/bin/env bash
# The stepgraph binary guarding a run (issue 34), on small synthetic .npy data
# (no MNIST needed): a second run into a locked out_dir, a model too large
# for memory, a model.layers list over the bound, a 14 MB config, SIGTERM during
# start-up, SIGINT during a mid-run and a final evaluation, a relative
# run.checkpoint under the run's out_dir. Every wait is bounded.
# Usage: test_run_guards.sh <stepgraph binary> <source dir>
set -uo pipefail
bin=$1
[[ -x $bin ]] || { echo "SKIPPED: no stepgraph binary at '$bin'"; exit 77; }
tmp=$(mktemp -d)
trap 'kill -KILL $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"  # check <description> <command...>, $fails

# make_npy <file> <shape, e.g. "100, 64"> <bytes>: a uint8 .npy of random bytes.
make_npy() {
  local header="{'descr': '|u1', 'fortran_order': False, 'shape': ($2), }"
  local pad=$(( (64 - (10 + ${#header} + 1) % 64) % 64 ))
  {
    printf '\x93NUMPY\x01\x00'
    printf "\\x$(printf %02x $(( (${#header} + pad + 1) % 256 )))\\x$(printf %02x $(( (${#header} + pad + 1) / 256 )))"
    printf '%s%*s\n' "$header" "$pad" ''
    head -c "$3" /dev/urandom
  } >"$1"
}

# Uint8 features, labels 0..255 (the model has 256 outputs). The test split
# is large and the model wide, so one evaluation takes many seconds on the
# CPU backend; each eval batch (data.eval_batch_size 100) a fraction of one.
make_npy "$tmp/x.npy" "512, 64" $((512 * 64))
make_npy "$tmp/y.npy" "512," 512
make_npy "$tmp/tx.npy" "30000, 64" $((30000 * 64))
make_npy "$tmp/ty.npy" "30000," 30000
cat >"$tmp/run.yaml" <<EOF
model: {layers: [64, 2048, 256]}
data: {train_x: $tmp/x.npy, train_y: $tmp/y.npy, test_x: $tmp/tx.npy, test_y: $tmp/ty.npy, batch_size: 32, eval_batch_size: 100}
optim: {lr: 0.01}
precision: {weights: fp32, accumulate: fp32}
run: {steps: 10000000, log_every: 10000000, eval_every: 0, out_dir: $tmp/default, checkpoint: ck.sgck}
backend: {kind: cpu}
EOF

# Starts a run in the background (pid in $pid, output in OUT.log) and waits
# until it trains (config.yaml is written just before the first step).
start_run() {  # start_run <out dir> [--set key=value ...]
  local out=$1; shift
  "$bin" train -c "$tmp/run.yaml" --set "run.out_dir=$out" "$@" >"$out.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 400); do [[ -f $out/config.yaml ]] && break; sleep 0.05; done
}

# Waits for $pid at most <seconds>, then kills it (rc 137); sets rc and took
# (seconds). Polls instead of a background `sleep` watchdog, which would
# outlive the test holding its output pipe open (ctest waits for that).
wait_at_most() {
  local start=$SECONDS state
  while ((SECONDS - start < $1)); do
    read -r _ _ state _ 2>/dev/null <"/proc/$pid/stat" || break
    [[ $state == Z ]] && break  # exited, not yet waited for
    sleep 0.05
  done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid"; rc=$?
  took=$((SECONDS - start))
}

# 1. A second run into the out_dir of a running one: refused at once, one
# line naming the folder and the other run's pid, nothing written.
start_run "$tmp/shared"
first=$pid
"$bin" train -c "$tmp/run.yaml" --set "run.out_dir=$tmp/shared" --set run.seed=7 >"$tmp/second.log" 2>&1 &
pid=$!; wait_at_most 20
check "a second run into a busy out_dir exits 1 (got $rc)" test "$rc" -eq 1
check "it names the folder and the running pid $first" grep -q "run.out_dir $tmp/shared: another stepgraph train (pid $first)" "$tmp/second.log"
check "it says so in one error line" test "$(grep -c error "$tmp/second.log")" -eq 1
check "the running run's config.yaml is its own" bash -c "grep -qx '  seed: 0' '$tmp/shared/config.yaml'"
pid=$first
kill -INT "$pid"; wait_at_most 20
check "the first run still stops cleanly (rc $rc)" test "$rc" -eq 130
check "its lock file is gone" test ! -e "$tmp/shared/.stepgraph.lock"

# 2. A model far beyond any memory: refused before allocating, naming the key and the GB.
"$bin" train -c "$tmp/run.yaml" --set "run.out_dir=$tmp/huge" --set "model.layers=[64,100000000,256]" \
  >"$tmp/huge.log" 2>&1 &
pid=$!; wait_at_most 30
check "a model beyond memory exits 1 (got $rc)" test "$rc" -eq 1
check "it names model.layers and the GB needed and available" \
  grep -Eq "model.layers \[64, 100000000, 256\]: the run needs about [0-9]+ GB of host memory .* but [0-9.]+ GB is available" "$tmp/huge.log"
check "no bare std::bad_alloc" bash -c "! grep -q bad_alloc '$tmp/huge.log'"
check "no out_dir is left behind" test ! -e "$tmp/huge"

# 3. Implausible configs: a model.layers list over the bound gets one error
# naming the key; a config file over 1 MB (a 14 MB one with 3.5 million
# entries took minutes before) is refused before it is parsed, and the config
# is never echoed. SIGTERM while the config is being read (a FIFO that no one
# writes: open() blocks) ends the process at once.
layers_yaml() {  # layers_yaml <file> <entries between the first and the last>
  {
    printf 'model:\n  layers: [64'
    yes ', 64' | head -n "$2" | tr -d '\n'
    printf ', 256]\n'
  } >"$1"
  sed -n '/^data:/,$p' "$tmp/run.yaml" >>"$1"
}
layers_yaml "$tmp/layers.yaml" 2000
"$bin" train -c "$tmp/layers.yaml" --set "run.out_dir=$tmp/layers" >"$tmp/layers.log" 2>&1 &
pid=$!; wait_at_most 20
check "2,000 model.layers entries: exit 1 (rc $rc, $took s)" test "$rc" -eq 1
check "the error names model.layers and the bound" grep -q "model.layers: has 2002 entries; at most 1024" "$tmp/layers.log"
check "the config is not echoed" test "$(wc -c <"$tmp/layers.log")" -lt 4000
layers_yaml "$tmp/layers14.yaml" 3500000
"$bin" train -c "$tmp/layers14.yaml" --set "run.out_dir=$tmp/layers" >"$tmp/layers14.log" 2>&1 &
pid=$!; wait_at_most 20
check "a 14 MB config: exit 1 within 2 s (rc $rc, $took s)" bash -c "test $rc -eq 1 && test $took -le 2"
check "the error names the file and its size" grep -q "layers14.yaml: the config file is 14.0 MB; a config is at most 1 MB" "$tmp/layers14.log"
check "it leaves no out_dir" test ! -e "$tmp/layers"
mkfifo "$tmp/config.fifo"
"$bin" train -c "$tmp/config.fifo" --set "run.out_dir=$tmp/fifo" >"$tmp/fifo.log" 2>&1 &
pid=$!
sleep 1
kill -TERM "$pid"; wait_at_most 20
check "SIGTERM while the config is read exits 143 within 3 s (rc $rc, $took s)" bash -c "test $rc -eq 143 && test $took -le 3"
check "it says it stopped before training" grep -q "stopped before training started" "$tmp/fifo.log"

# 4. SIGINT during an evaluation stops it within an eval batch: exit 130,
# a checkpoint, the stopped: line. Mid-run (eval after every step) ...
start_run "$tmp/eval-mid" --set run.eval_every=1
sleep 1
kill -INT "$pid"; wait_at_most 60
check "SIGINT during a mid-run eval exits 130 within 5 s (rc $rc, $took s)" bash -c "test $rc -eq 130 && test $took -le 5"
check "it writes the checkpoint" test -f "$tmp/eval-mid/ck.sgck"
check "it logs the stopped: line" grep -q "stopped: " "$tmp/eval-mid.log"
# ... and the final evaluation after the last step.
start_run "$tmp/eval-final" --set run.steps=1
sleep 1
kill -INT "$pid"; wait_at_most 60
check "SIGINT during the final eval exits 130 within 5 s (rc $rc, $took s)" bash -c "test $rc -eq 130 && test $took -le 5"
check "it writes the checkpoint" test -f "$tmp/eval-final/ck.sgck"
check "it prints no test accuracy" bash -c "! grep -q 'test accuracy' '$tmp/eval-final.log'"

# 5. A relative run.checkpoint goes under the run's out_dir, not the working folder.
mkdir -p "$tmp/cwd"
(cd "$tmp/cwd" && "$bin" train -c "$tmp/run.yaml" --set "run.out_dir=$tmp/rel" --set run.steps=2 \
  --set "data.test_x=$tmp/x.npy" --set "data.test_y=$tmp/y.npy" >"$tmp/rel.log" 2>&1)
check "the checkpoint is OUT_DIR/ck.sgck" test -f "$tmp/rel/ck.sgck"
check "nothing in the working folder" test ! -e "$tmp/cwd/ck.sgck"
check "the log says where it went" grep -q "written to $tmp/rel/ck.sgck" "$tmp/rel.log"

exit $((fails > 0))
