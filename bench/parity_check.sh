#!/usr/bin/env bash
# The reference setup twice: stepgraph (configs/parity_reference.yaml) and
# PyTorch (bench/torch_parity.py: fp16 autocast, same initial weights, same
# batches). Passes when the test losses agree within 2% and the test
# accuracies within 0.5 points. Usage: bench/parity_check.sh [OUT=runs/parity]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/parity}"
data="${DATA:-data/mnist}"
mkdir -p "$out"
data_abs="$(realpath -m "$data")"
out_abs="$(realpath -m "$out")"
build/apps/stepgraph train --config configs/parity_reference.yaml --set data.dir="$data" \
  --set run.out_dir="$out/stepgraph" | tee "$out/stepgraph.log"
(cd bench && PYTHONUNBUFFERED=1 python3 torch_parity.py --data "$data_abs" --steps 5000 \
  --batch 32 --lr 0.003 --layers 784,128,128,128,10 --out "$out_abs/torch.json")
python3 - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
torch = json.load(open(f"{out}/torch.json"))
line = [l for l in open(f"{out}/stepgraph.log") if l.startswith("test accuracy")][-1]
ours_acc = float(re.search(r"test accuracy ([\d.]+)%", line).group(1)) / 100
ours_loss = float(re.search(r"test loss ([\d.]+)", line).group(1))
loss_gap = abs(ours_loss - torch["test_loss"]) / torch["test_loss"]
acc_gap = abs(ours_acc - torch["test_accuracy"]) * 100
ok = loss_gap <= 0.02 and acc_gap <= 0.5
result = {"stepgraph": {"test_loss": ours_loss, "test_accuracy": ours_acc},
          "torch": {"test_loss": torch["test_loss"], "test_accuracy": torch["test_accuracy"],
                    "train_loss_mean_last_100": torch["final_train_loss_mean_last_100"]},
          "test_loss_rel_gap": loss_gap, "test_accuracy_gap_points": acc_gap, "pass": ok}
json.dump(result, open(f"{out}/parity.json", "w"), indent=2)
print(f"parity: stepgraph test loss {ours_loss:.4f} acc {100*ours_acc:.2f}% | torch test loss "
      f"{torch['test_loss']:.4f} acc {100*torch['test_accuracy']:.2f}% | loss gap {100*loss_gap:.2f}% "
      f"(<= 2%), accuracy gap {acc_gap:.2f} points (<= 0.5): {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
