#!/usr/bin/env bash
# The data-parallel checks that need 2 GPUs (issue 38), on a built tree
# (build/apps/stepgraph) with MNIST in data/mnist; one PASS/FAIL line each,
# exit status the number of failures. docs/data_parallel.md says what each shows.
#   - the fused CNN step at --gpus 2: two runs give the same losses
#   - NCCL's socket transport (P2P and SHM off, a host id per rank, lo) against NVLink: same final test loss within 1%
#   - data_parallel.weight_gradients: gather on the MLP: no all-reduce, a rerun the same, test loss within 1%
#   - resume at N = 2 (MLP, report CNN, the MLP with data_parallel.zero1, with gathered rows): the checkpoint's tensors and the
#     losses of a straight run; the zero1 MLP's checkpoint and losses also those of the all-reducing MLP's
#   - a rank SIGKILLed (under --gpus, under torchrun variables): every rank ends within 2 s
#   - a rank SIGSTOPped (--peer-timeout 5, both launches): every rank ends within 5-8 s
# Usage: scripts/data_parallel_checks.sh [OUT]   (NCCL_NVLS_ENABLE=0 is set here)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
out="$(realpath -m "${1:-runs/data_parallel_checks}")"; mkdir -p "$out"
B=build/apps/stepgraph
failures=0
verdict() { if [ "$1" = 0 ]; then echo "PASS $2"; else echo "FAIL $2"; failures=$((failures + 1)); fi; }
steps() { grep -o "step [0-9]*/[0-9]* | loss [0-9.]*" "$1"; }
test_loss() { grep -o "test loss [0-9.]*" "$1" | tail -1 | grep -o "[0-9.]*$"; }
now() { date +%s.%N; }
since() { python3 -c "print(f'{$(now)-$1:.2f}')"; }
within() { python3 -c "import sys; sys.exit(0 if $2 <= $1 <= $3 else 1)"; }
guard() { ( sleep 60; kill -9 "$1" 2>/dev/null ) & }  # a scenario that never ends fails by its time, not by hanging here
wait_steps() { for _ in $(seq 1 240); do grep -q "step [0-9]*/" "$1" 2>/dev/null && return; sleep 0.25; done; }

# The fused CNN step in a data-parallel rank, run twice.
for r in a b; do $B train -c configs/mnist_cnn.yaml --gpus 2 --set run.out_dir="$out/cnn" > "$out/cnn_$r.log" 2>&1; done
cmp -s <(steps "$out/cnn_a.log") <(steps "$out/cnn_b.log") && grep -q "cnn_step\[.*gradients out" "$out/cnn_a.log"
verdict $? "report CNN --gpus 2, fused step with gradients out: a rerun gives the same losses"

# The socket transport, as between machines, against NVLink.
$B train -c configs/mnist_mlp.yaml --gpus 2 --set run.out_dir="$out/nvlink" > "$out/nvlink.log" 2>&1
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_PORT=29631 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo \
    NCCL_HOSTID=stepgraph-host$r NCCL_DEBUG=INFO $B train -c configs/mnist_mlp.yaml --set run.out_dir="$out/socket" \
    > "$out/socket_$r.log" 2>&1 &
done
wait
a=$(test_loss "$out/socket_0.log"); b=$(test_loss "$out/nvlink.log")
echo "  socket: $(grep -c 'via NET/Socket' "$out/socket_0.log") NET/Socket channels, test loss ${a:-?} (NVLink ${b:-?}), $(grep -o '[0-9]* samples/s)' "$out/socket_0.log" | tail -1)"
grep -q "via NET/Socket" "$out/socket_0.log" && ! grep -q "via P2P" "$out/socket_0.log" &&
  python3 -c "import sys; sys.exit(0 if abs($a - $b) <= 0.01 * $b else 1)" 2>/dev/null
verdict $? "NCCL socket transport (P2P, SHM off; host ids apart): final test loss within 1% of NVLink's"

# Weight gradients from every rank's rows (data_parallel.weight_gradients: gather): no gradient all-reduced, a rerun
# the same losses, the final test loss within 1% of the all-reducing run's (the sums differ only in their order).
G=(-c configs/mnist_mlp.yaml --set data_parallel.weight_gradients=gather)
for r in a b; do $B train "${G[@]}" --gpus 2 --set run.out_dir="$out/gather" > "$out/gather_$r.log" 2>&1; done
a=$(test_loss "$out/gather_a.log"); b=$(test_loss "$out/nvlink.log")
echo "  gather: test loss ${a:-?} (all-reduce ${b:-?}), $(grep -o 'test accuracy [0-9.]*%' "$out/gather_a.log" | tail -1)," \
  "$(grep -o '[0-9]* samples/s)' "$out/gather_a.log" | tail -1)"
schedule=$($B inspect "${G[@]}" --world-size 2 -f schedule 2>/dev/null)
cmp -s <(steps "$out/gather_a.log") <(steps "$out/gather_b.log") &&
  python3 -c "import sys; sys.exit(0 if abs($a - $b) <= 0.01 * $b else 1)" 2>/dev/null &&
  [ "$(grep -c '^L[0-9]* nccl_all_gather' <<< "$schedule")" = 6 ] && ! grep -q '^L[0-9]* nccl_all_reduce' <<< "$schedule"
verdict $? "mlp, weight gradients from every rank's rows: 6 gathers, no all-reduce, a rerun the same, test loss within 1%"

# Resume at N = 2: the tensors of the checkpoint after 400 steps, straight and resumed at 200.
same_tensors() {  # a stepgraph checkpoint's tensor section (after magic, version, step, seed and the saved config)
  python3 - "$1" "$2" <<'PY'
import struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack_from("<Q", b, 28)[0]
    return b[36 + n:-4]  # then the tensors; the last 4 bytes are the CRC of the whole file
sys.exit(0 if tensors(sys.argv[1]) == tensors(sys.argv[2]) else 1)
PY
}
for net in mlp cnn mlp_zero1 mlp_gather; do
  C=(-c configs/mnist_mlp.yaml --set optim.schedule.kind=constant)
  [ $net = cnn ] && C=(-c configs/mnist_cnn.yaml)
  # W1 and W2 sharded (1.5 and 2 MiB in f16: below the default zero1_min_mb, so it is lowered here)
  [ $net = mlp_zero1 ] && C+=(--set data_parallel.zero1=true --set data_parallel.zero1_min_mb=1)
  [ $net = mlp_gather ] && C+=(--set data_parallel.weight_gradients=gather)
  run() { $B train "${C[@]}" --gpus 2 --set run.epochs=0 --set run.log_every=100 --set run.checkpoint=ck.sgck "$@"; }
  run --set run.steps=400 --set run.out_dir="$out/${net}_straight" > "$out/${net}_straight.log" 2>&1
  run --set run.steps=200 --set run.out_dir="$out/${net}_half" > "$out/${net}_half.log" 2>&1
  run --set run.steps=400 --set run.out_dir="$out/${net}_resumed" --set run.resume="$out/${net}_half/ck.sgck" \
    > "$out/${net}_resumed.log" 2>&1
  same_tensors "$out/${net}_straight/ck.sgck" "$out/${net}_resumed/ck.sgck" &&
    cmp -s <(steps "$out/${net}_straight.log" | tail -2) <(steps "$out/${net}_resumed.log" | tail -2)
  verdict $? "$net: resumed at step 200 of 400 on 2 GPUs == straight (checkpoint tensors byte for byte, losses)"
done
# Two ranks' reduce-scatter sums each element as the all-reduce does (a + b), and each rank's update of its range
# is the all-reducing update of those elements: the same bits, gathered into one checkpoint on save.
same_tensors "$out/mlp_straight/ck.sgck" "$out/mlp_zero1_straight/ck.sgck" &&
  cmp -s <(steps "$out/mlp_straight.log") <(steps "$out/mlp_zero1_straight.log") &&
  [ "$($B inspect -c configs/mnist_mlp.yaml --set data_parallel.zero1=true --set data_parallel.zero1_min_mb=1 \
        --world-size 2 -f schedule 2>/dev/null |
        grep -c '^L[0-9]* nccl_all_gather')" = 2 ]
verdict $? "mlp_zero1: sharded updates == all-reduced updates on 2 GPUs (every logged loss, checkpoint byte for byte)"

# Faults: one long run each, the signal after its first logged step.
LONG=(-c configs/mnist_mlp.yaml --set run.epochs=200 --set run.log_every=1000)
fault() {  # $1 signal, $2 gpus|env, $3 lower and $4 upper bound (s) for every rank's end
  local log="$out/fault_${1}_$2" victim first pids=() t port=$((29640 + RANDOM % 100))
  if [ "$2" = gpus ]; then
    $B train "${LONG[@]}" --gpus 2 --peer-timeout 5 --set run.out_dir="$log" > "$log.log" 2>&1 & first=$!; pids=($first)
    # The supervisor appends --rank r ... to the command line it was given.
    guard $first; wait_steps "$log.log"; sleep 1; victim=$(pgrep -f -- "$log .*--rank 1 " | head -1)
  else
    for r in 0 1; do
      RANK=$r WORLD_SIZE=2 MASTER_PORT=$port $B train "${LONG[@]}" --peer-timeout 5 \
        --set run.out_dir="$log" > "$log.$r.log" 2>&1 &
      pids+=($!)
    done 2>/dev/null
    first=${pids[0]}; victim=${pids[1]}; guard $first; wait_steps "$log.0.log"; sleep 1
  fi
  t=$(now); kill -"$1" "$victim"; wait "$first"; local rc=$? s; s=$(since "$t")
  [ "$1" = STOP ] && kill -9 "$victim" 2>/dev/null
  echo "  $1 of rank 1 under ${2/env/torchrun variables}: ended with status $rc after $s s: $(grep -ho 'lost rank 1 ([^)]*)' "$log"*.log | head -1)"
  [ "$rc" != 0 ] && within "$s" "$3" "$4"
  verdict $? "rank 1 sent SIG$1 under ${2/env/torchrun variables}: every rank ends in $3-$4 s, with the watchdog's line"
}
fault KILL gpus 0 2
fault KILL env 0 2
fault STOP env 4.5 8
fault STOP gpus 4.5 8
pkill -9 -f "stepgraph train.*$out" 2>/dev/null
echo "data_parallel_checks: $failures failed"
exit $failures
