#!/usr/bin/env bash
# The stepgraph binary on bad command lines and signals (issue 24):
# unknown subcommand, --version, bench --replot of a bad file, export and
# predict on a missing checkpoint or a bad option, errors on stderr (stdout
# carries inspect's dump alone), SIGTERM (checkpoint, exit 143), a second
# Ctrl-C (immediate exit 130 with a message).
# Usage: test_cli_bad_input.sh <stepgraph binary> <source dir>
set -uo pipefail
bin=$1
src=$2
source "$src/tests/support/mnist_dir.sh"
sg_mnist_dir_or_skip mnist
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"  # check <description> <command...>, $fails

"$bin" frobnicate >"$tmp/out" 2>&1; rc=$?
check "unknown subcommand is named (rc $rc)" grep -q "unknown subcommand 'frobnicate'" "$tmp/out"
check "unknown subcommand exits non-zero" test "$rc" -ne 0
check "--version prints the version" bash -c "'$bin' --version | grep -q '^stepgraph [0-9]'"
echo '{bad' >"$tmp/bad.json"
"$bin" bench --replot "$tmp/bad.json" --out-dir "$tmp/replot" >"$tmp/out" 2>&1; rc=$?
check "bench --replot of a bad file names the file (rc $rc)" grep -q "$tmp/bad.json: not a bench.json" "$tmp/out"
check "bench --replot of a bad file exits 1" test "$rc" -eq 1

# export / predict (issue 23) on a missing checkpoint or a bad option: one error line, exit 1.
"$bin" export --checkpoint "$tmp/none.sgck" --format safetensors -o "$tmp/m.safetensors" >"$tmp/out" 2>&1; rc=$?
check "export of a missing checkpoint names it (rc $rc)" grep -q "$tmp/none.sgck" "$tmp/out"
check "export of a missing checkpoint exits 1 with one error line" bash -c "test $rc -eq 1 && test \$(grep -c error '$tmp/out') -eq 1"
"$bin" export --checkpoint "$tmp/none.sgck" --format tflite -o "$tmp/m.x" >"$tmp/out" 2>&1; rc=$?
check "export --format tflite is refused (rc $rc)" grep -q "format 'tflite' is not one of safetensors, onnx" "$tmp/out"
"$bin" predict --checkpoint "$tmp/none.sgck" --input "$tmp/x.npy" -o "$tmp/p.npy" --backend tpu >"$tmp/out" 2>&1; rc=$?
check "predict --backend tpu is refused (rc $rc)" bash -c "test $rc -eq 1 && grep -q \"backend 'tpu' is not one of auto, cuda, cpu\" '$tmp/out'"

# Errors go to stderr: with stdout in a file the error still shows, and
# inspect's dump on stdout is the dump alone (its info lines go to stderr).
printf 'model:\n  layers: [784, 16, 10]\noptim:\n  momentum: [1, 2]\n' >"$tmp/bad.yaml"
"$bin" inspect -c "$tmp/bad.yaml" -f schedule >"$tmp/out" 2>"$tmp/err"; rc=$?
check "inspect of a bad config exits 1 (rc $rc)" test "$rc" -eq 1
check "its error is one line on stderr naming the key" \
  bash -c "test \$(grep -c . '$tmp/err') -eq 1 && grep -q 'optim.momentum: expected a number' '$tmp/err'"
check "nothing of it on stdout" test ! -s "$tmp/out"
"$bin" train -c "$tmp/bad.yaml" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "train's error is on stderr (rc $rc)" bash -c "test $rc -eq 1 && grep -q 'optim.momentum' '$tmp/err' && test ! -s '$tmp/out'"
"$bin" inspect -c "$src/configs/mnist_mlp.yaml" -f json --set run.steps=2 >"$tmp/graph.json" 2>"$tmp/err"; rc=$?
check "inspect -f json to stdout exits 0 (rc $rc)" test "$rc" -eq 0
check "its stdout is the JSON alone" bash -c "head -c 1 '$tmp/graph.json' | grep -q '{' && tail -c 2 '$tmp/graph.json' | grep -q '}'"
check "its info line (--set replaces run.epochs) is on stderr" grep -q "replaces run.epochs" "$tmp/err"

# A long CPU run, stopped by a signal once it is training.
start_run() {  # start_run <out dir> [--set key=value ...]
  local out=$1; shift
  "$bin" train -c "$src/configs/ci_small.yaml" --set "data.dir=$mnist" --set "run.out_dir=$out" \
    --set run.steps=10000000 --set run.log_every=10000000 --set run.eval_every=0 "$@" >"$out.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do [[ -f $out/config.yaml ]] && break; sleep 0.05; done
  sleep 1
}

# Waits for the run; one that has not stopped 20 s after the signal is killed (rc 137).
stop_wait() {
  (sleep 20; kill -KILL "$pid" 2>/dev/null) >/dev/null 2>&1 &  # not holding ctest's output pipe
  local watchdog=$!
  wait "$pid"; rc=$?
  kill "$watchdog" 2>/dev/null; wait "$watchdog" 2>/dev/null
}

start_run "$tmp/term"
kill -TERM "$pid"; stop_wait
check "SIGTERM exits 143 (got $rc)" test "$rc" -eq 143
check "SIGTERM writes a checkpoint" test -f "$tmp/term/checkpoint.sgck"
check "the interrupted summary shows no test accuracy" bash -c "! grep -q 'test accuracy 0.00%' '$tmp/term.log'"

start_run "$tmp/int"
kill -INT "$pid"; stop_wait
check "Ctrl-C exits 130 (got $rc)" test "$rc" -eq 130
check "Ctrl-C writes a checkpoint" test -f "$tmp/int/checkpoint.sgck"

# Steps of a wide model take long enough (~1 s on a 2-core CI machine's CPU
# backend, less on a faster CPU) that the second signal, 0.05 s
# after the first, comes while the first still waits for the step.
start_run "$tmp/twice" --set "model.layers=[784, 4096, 4096, 10]"
kill -INT "$pid"; sleep 0.05; kill -INT "$pid"; stop_wait
check "a second Ctrl-C exits 130 (got $rc)" test "$rc" -eq 130
check "a second Ctrl-C says so" grep -q "second interrupt" "$tmp/twice.log"

exit $((fails > 0))
