"""PyTorch run of the reference setup, for comparison with `stepgraph train
--config configs/parity_reference.yaml`: same initial weights and the same
batches (bench/stepgraph_data.py mirrors the runtime's RNG), fp16 autocast
(--compute bf16: bf16 autocast, for precision.compute: bf16) with fp32 master
weights, plain SGD. --activation and --loss (mse: the one-hot class vector
regressed with MSE, as `model.loss: mse` on bench/parity_check.sh's npz copy
of MNIST) cover issue 21's activations and regression loss;
--optim adam|adamw (--betas, --eps, --weight-decay), --optim rmsprop (--alpha,
--eps, --momentum, --centered, --weight-decay), --nesterov and
--clip-grad-norm cover its optimizers. --model report_cnn runs issue 22's
CNN (bench/torch_cnn.py, configs/mnist_cnn.yaml's network, dropout off) from
stepgraph's initial weights instead of the --layers MLP."""
import argparse
import json
import math
import time

import numpy as np
import torch
import torch.nn.functional as F

import stepgraph_data as sd
from torch_cnn import build_report_cnn


# stepgraph's model.activation -> the PyTorch module (gelu is the exact erf
# GELU, gelu_tanh PyTorch's approximate='tanh').
ACTIVATIONS = {
    "relu": torch.nn.ReLU,
    "gelu": torch.nn.GELU,
    "gelu_tanh": lambda: torch.nn.GELU(approximate="tanh"),
    "silu": torch.nn.SiLU,
    "tanh": torch.nn.Tanh,
    "sigmoid": torch.nn.Sigmoid,
    "identity": torch.nn.Identity,
}


def build_model(layers, seed, device, activation="relu"):
    mods = []
    for l, (w, b) in enumerate(sd.initial_parameters(layers, seed)):
        lin = torch.nn.Linear(layers[l], layers[l + 1])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(np.asarray(w, dtype=np.float32).reshape(layers[l + 1], layers[l])))
            lin.bias.copy_(torch.from_numpy(np.asarray(b, dtype=np.float32)))
        mods.append(lin)
        if l + 2 < len(layers):
            mods.append(ACTIVATIONS[activation]())
    return torch.nn.Sequential(*mods).to(device)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", default="data/mnist")
    p.add_argument("--model", choices=["mlp", "report_cnn"], default="mlp",
                   help="mlp: the --layers MLP; report_cnn: configs/mnist_cnn.yaml's CNN with its dropouts off")
    p.add_argument("--layers", default="784,128,128,128,10")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shuffle-seed", type=int, default=1)
    p.add_argument("--normalize", action="store_true")
    p.add_argument("--compute", choices=["fp16", "bf16"], default="fp16",
                   help="autocast dtype: matmul inputs and activations (stepgraph's precision.compute)")
    p.add_argument("--activation", choices=sorted(ACTIVATIONS), default="relu", help="stepgraph's model.activation")
    p.add_argument("--loss", choices=["softmax_xent", "mse", "l1"], default="softmax_xent",
                   help="stepgraph's model.loss; mse/l1 regress the one-hot class vector")
    p.add_argument("--label-smoothing", type=float, default=0.0, help="stepgraph's model.label_smoothing")
    p.add_argument("--optim", choices=["sgd", "adam", "adamw", "rmsprop"], default="sgd", help="stepgraph's optim.name")
    p.add_argument("--betas", default="0.9,0.999", help="optim.betas (adam, adamw)")
    p.add_argument("--eps", type=float, default=1e-8, help="optim.eps (adam, adamw, rmsprop)")
    p.add_argument("--alpha", type=float, default=0.99, help="optim.alpha (rmsprop)")
    p.add_argument("--centered", action="store_true", help="optim.centered (rmsprop)")
    p.add_argument("--nesterov", action="store_true", help="optim.nesterov (sgd)")
    p.add_argument("--clip-grad-norm", type=float, default=0.0, help="optim.clip_grad_norm (0: off)")
    p.add_argument("--schedule", choices=["constant", "cosine"], default="constant",
                   help="optim.schedule.kind (no warm-up, min_lr 0): step s of S runs at lr * (1 + cos(pi s / S)) / 2")
    p.add_argument("--out", default="")
    a = p.parse_args()

    device = torch.device("cuda")
    amp_dtype = torch.bfloat16 if a.compute == "bf16" else torch.float16
    layers = [int(x) for x in a.layers.split(",")]
    train_x, train_y = sd.load_split(a.data, "train")
    test_x, test_y = sd.load_split(a.data, "t10k")
    scale, shift = sd.input_affine(a.normalize)
    gx = torch.from_numpy(train_x.copy()).to(device)
    gy = torch.from_numpy(train_y.astype(np.int64)).to(device)
    n = gx.shape[0]
    order = torch.tensor([sd.batch_rows(s, n, a.batch, a.shuffle_seed) for s in range(a.steps)], device=device)

    cnn = a.model == "report_cnn"
    model = build_report_cnn(a.seed, device, dropout=0.0) if cnn else build_model(layers, a.seed, device, a.activation)
    classes = 10 if cnn else layers[-1]
    as_input = (lambda x: x.view(-1, 1, 28, 28)) if cnn else (lambda x: x)  # the CNN's [C, H, W] examples

    def criterion(out, y):
        if a.loss == "softmax_xent":
            return F.cross_entropy(out, y, label_smoothing=a.label_smoothing)
        target = F.one_hot(y, classes).float()
        return (F.mse_loss if a.loss == "mse" else F.l1_loss)(out.float(), target)

    if a.optim == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay,
                              nesterov=a.nesterov)
    elif a.optim == "rmsprop":
        opt = torch.optim.RMSprop(model.parameters(), lr=a.lr, alpha=a.alpha, eps=a.eps, weight_decay=a.weight_decay,
                                  momentum=a.momentum, centered=a.centered)
    else:
        betas = tuple(float(b) for b in a.betas.split(","))
        kind = torch.optim.AdamW if a.optim == "adamw" else torch.optim.Adam
        opt = kind(model.parameters(), lr=a.lr, betas=betas, eps=a.eps, weight_decay=a.weight_decay)
    losses = []
    start = time.time()
    for s in range(a.steps):
        if a.schedule == "cosine":  # apps/lr_schedule.cpp's learning_rate_at, set before step s as the trainer does
            for group in opt.param_groups:
                group["lr"] = 0.5 * a.lr * (1.0 + math.cos(math.pi * s / a.steps))
        idx = order[s]
        x = gx[idx].float() * scale + shift
        with torch.autocast("cuda", dtype=amp_dtype):
            loss = criterion(model(as_input(x)), gy[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if a.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_grad_norm)
        opt.step()
        losses.append(loss.detach())
    torch.cuda.synchronize()
    seconds = time.time() - start
    losses = torch.stack(losses).float().cpu().numpy()

    with torch.no_grad(), torch.autocast("cuda", dtype=amp_dtype):
        tx = torch.from_numpy(test_x.copy()).to(device).float() * scale + shift
        ty = torch.from_numpy(test_y.astype(np.int64)).to(device)
        logits = model(as_input(tx)).float()
        test_loss = criterion(logits, ty).item()
        test_acc = (logits.argmax(1) == ty).float().mean().item()
    result = {
        "final_train_loss_mean_last_100": float(losses[-100:].mean()),
        "test_loss": test_loss,
        "test_accuracy": test_acc,
        "steps": a.steps,
        "compute": a.compute,
        "activation": a.activation,
        "loss": a.loss,
        "optim": a.optim,
        "schedule": a.schedule,
        "losses_every_100": [float(v) for v in losses[::100]],
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "seconds": seconds,
    }
    print(f"torch parity: {a.steps} steps, train loss (mean of last 100) {result['final_train_loss_mean_last_100']:.4f}, "
          f"test loss {test_loss:.4f}, test accuracy {100 * test_acc:.2f}%", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
