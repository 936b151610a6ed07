"""PyTorch baselines for `stepgraph bench --config configs/mnist_cnn.yaml`: the
report's MNIST CNN (bench/torch_cnn.py) trained with SGD (lr 0.01, momentum
0.5; --optim adamw: lr 1e-3, weight decay 0.01; --optim rmsprop: lr 1e-3,
the config's optim section changed alike on stepgraph's side), dropout on, MNIST preloaded on the GPU and normalized, batches in the
runtime's order. Modes, each in fp32 (the report's setup) and under fp16
autocast (stepgraph's precision: fp16 activations, fp32 master weights):
  torch_eager[_amp]      eager loop, batches gathered on the GPU
  torch_cudagraph[_amp]  the whole step (batch fetch by a device-side counter,
                         forward, backward, SGD step) hand-captured with
                         torch.cuda.CUDAGraph and replayed
Each point: --warmup untimed steps, then --repeats timings of --steps steps
with CUDA events; the median, with the SM clock before/after. Rows have
width 0 (a config's model in stepgraph bench's table)."""
import argparse
import datetime
import json

import numpy as np
import torch
import torch.nn.functional as F

import stepgraph_data as sd
from torch_bench import timed_record
from torch_cnn import build_report_cnn


class Data:
    def __init__(self, folder, batch, steps):
        images, labels = sd.load_split(folder, "train")
        self.x = torch.from_numpy(images.copy()).cuda()
        self.y = torch.from_numpy(labels.astype(np.int64)).cuda()
        n = self.x.shape[0]
        self.order = torch.tensor([sd.batch_rows(s, n, batch, 1) for s in range(steps)], device="cuda")
        self.scale, self.shift = sd.input_affine(True)

    def batch(self, idx):
        return (self.x[idx].float() * self.scale + self.shift).view(-1, 1, 28, 28), self.y[idx]


def make_step(model, opt, data, amp, counter=None):
    steps = data.order.shape[0]

    def step(s=None):
        idx = data.order.index_select(0, counter).squeeze(0) if counter is not None else data.order[s % steps]
        x, y = data.batch(idx)
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            loss = F.nll_loss(model(x), y)
        opt.zero_grad(set_to_none=counter is None)
        loss.backward()
        opt.step()
        if counter is not None:
            counter.add_(1).remainder_(steps)
        return loss
    return step


def make_optimizer(name, params, capturable):
    """The report's SGD, or AdamW / RMSprop with stepgraph bench's defaults;
    foreach (and capturable, for the step counter on the GPU) inside a CUDA graph."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.5, foreach=capturable or None)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=True, capturable=capturable)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=1e-3, foreach=True, capturable=capturable)
    raise ValueError(f"unknown optimizer {name}")


def eager_runner(data, amp, optim):
    model = build_report_cnn(0, "cuda")
    opt = make_optimizer(optim, model.parameters(), capturable=False)
    step = make_step(model, opt, data, amp)
    state = {"s": 0, "loss": None}

    def run(n):
        loss = None
        for _ in range(n):
            loss = step(state["s"])
            state["s"] += 1
        if loss is not None:
            state["loss"] = loss.detach().clone()
    return run, state


def cudagraph_runner(data, amp, optim):
    model = build_report_cnn(0, "cuda")
    opt = make_optimizer(optim, model.parameters(), capturable=True)
    counter = torch.zeros(1, dtype=torch.int64, device="cuda")
    step = make_step(model, opt, data, amp, counter)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up before capture, as the CUDA-graph docs require
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    static = {}
    with torch.cuda.graph(graph):
        static["loss"] = step()
    state = {"loss": None}

    def run(n):
        for _ in range(n):
            graph.replay()
        state["loss"] = static["loss"]
    return run, state


def measure(mode, batch, args, data):
    record = {"mode": mode, "width": 0, "batch": batch, "steps": args.steps, "repeats": args.repeats,
              "model": "report_cnn", "optim": args.optim}
    amp = mode.endswith("_amp")
    runner = cudagraph_runner if mode.startswith("torch_cudagraph") else eager_runner
    return timed_record(record, lambda: runner(data, amp, args.optim), args, batch)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", default="data/mnist")
    p.add_argument("--batches", default="64,256")
    p.add_argument("--modes", default="torch_eager,torch_eager_amp,torch_cudagraph,torch_cudagraph_amp")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--eager-steps", type=int, default=100, help="timed steps per repeat of the eager modes")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--optim", choices=["sgd", "adamw", "rmsprop"], default="sgd")
    p.add_argument("--out", default="torch_cnn_bench.json")
    a = p.parse_args()
    torch.backends.cudnn.benchmark = True  # PyTorch's fastest cuDNN algorithms for these shapes
    records = []
    for batch in [int(b) for b in a.batches.split(",")]:
        data = Data(a.data, batch, max(a.steps, a.eager_steps) + a.warmup + 10)
        for mode in a.modes.split(","):
            args = argparse.Namespace(**vars(a))
            if mode.startswith("torch_eager"):
                args.steps = a.eager_steps
            r = measure(mode, batch, args, data)
            records.append(r)
            print(f"{mode:<22} batch {batch:>4}: {r.get('us_per_step', float('nan')):9.1f} us/step "
                  f"{r.get('error', '')}", flush=True)
    out = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
           "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "records": records}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
