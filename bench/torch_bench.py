"""PyTorch baselines for `stepgraph bench`: the MLP 784-H-H-H-10 trained with
SGD (lr 0.01) under fp16 autocast (--compute bf16: bf16 autocast, the
counterpart of `stepgraph bench --compute bf16`) with fp32 master weights, on MNIST
preloaded on the GPU, batches in the runtime's order. Modes:
  torch_eager      plain eager loop (fused SGD when available)
  torch_compile    torch.compile(mode="max-autotune", fullgraph=True) of
                   forward+loss (inductor also CUDA-graphs it); backward and
                   the optimizer step stay eager
  torch_cudagraph  the whole step (batch fetch by a device-side counter,
                   forward, backward, SGD step) hand-captured with
                   torch.cuda.CUDAGraph and replayed
  torch_cudagraph_xK  the same with K steps captured per graph (the
                   counterpart of `stepgraph bench --multi-step K`); a
                   remainder of fewer than K steps replays a one-step graph
--optim adamw (or adam) swaps SGD for torch.optim.AdamW(fused=True) (lr 1e-3,
weight decay 0.01, betas 0.9/0.999, eps 1e-8: `stepgraph bench --optim adamw`);
--optim rmsprop for torch.optim.RMSprop(foreach=True) (lr 1e-3, alpha 0.99, eps
1e-8: `stepgraph bench --optim rmsprop`; PyTorch has no fused RMSprop);
the captured modes use AdamW(fused=True, capturable=True). --depth sets the
hidden layers (2 for the issue's 784-1024-1024-10).
Each point: --warmup untimed steps, then --repeats timings of --steps steps
with CUDA events; the median is reported with the SM clock before/after.
"""
import argparse
import datetime
import json
import statistics
import sys

import numpy as np
import torch
import torch.nn.functional as F

import stepgraph_data as sd
from torch_parity import ACTIVATIONS  # stepgraph's model.activation -> the PyTorch module


def sm_clock():
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
    except Exception:
        return float("nan")


# The hidden depth of every model (--depth; 3: 784-H-H-H-10).
DEPTH = [3]
# The activation between hidden layers (--activation: stepgraph's model.activation).
ACTIVATION = ["relu"]


def make_model(width):
    mods, fan_in = [], 784
    for _ in range(DEPTH[0]):
        mods += [torch.nn.Linear(fan_in, width), ACTIVATIONS[ACTIVATION[0]]()]
        fan_in = width
    return torch.nn.Sequential(*mods, torch.nn.Linear(fan_in, 10)).cuda()


def make_sgd(model, lr):
    try:
        return torch.optim.SGD(model.parameters(), lr=lr, fused=True)
    except (TypeError, RuntimeError):
        return torch.optim.SGD(model.parameters(), lr=lr, foreach=True)


def make_optimizer(model, optim, lr, captured):
    """SGD as before, Adam/AdamW fused (capturable inside a CUDA graph), or RMSprop (PyTorch's
    defaults, as `stepgraph bench --optim rmsprop`: alpha 0.99, eps 1e-8; foreach, capturable)."""
    if optim == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, foreach=True) if captured else make_sgd(model, lr)
    if optim == "rmsprop":
        return torch.optim.RMSprop(model.parameters(), lr=lr, alpha=0.99, eps=1e-8, foreach=True,
                                   capturable=captured)
    kind = torch.optim.AdamW if optim == "adamw" else torch.optim.Adam
    wd = 0.01 if optim == "adamw" else 0.0
    return kind(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd, fused=True,
                capturable=captured)


class Data:
    def __init__(self, folder, batch, steps):
        images, labels = sd.load_split(folder, "train")
        self.x = torch.from_numpy(images.copy()).cuda()
        self.y = torch.from_numpy(labels.astype(np.int64)).cuda()
        n = self.x.shape[0]
        self.order = torch.tensor([sd.batch_rows(s, n, batch, 1) for s in range(steps)], device="cuda")
        self.scale = 1.0 / 255.0

    def batch(self, idx):
        return self.x[idx].float() * self.scale, self.y[idx]


def time_loop(run, steps, repeats):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        run(steps)
        stop.record()
        stop.synchronize()
        times.append(1e3 * start.elapsed_time(stop) / steps)
    return times


def timed_record(record, make_runner, args, batch):
    """Fills `record` for the runner make_runner() returns: --warmup untimed
    steps, then the median of --repeats timings of --steps steps with the SM
    clock around them; a mode that fails (OOM, compile error) is recorded, not fatal."""
    try:
        run, state = make_runner()
        run(args.warmup)
        torch.cuda.synchronize()
        record["sm_clock_mhz_before"] = sm_clock()
        times = time_loop(run, args.steps, args.repeats)
        record["sm_clock_mhz_after"] = sm_clock()
        record["all_us_per_step"] = times
        record["us_per_step"] = statistics.median(times)
        record["samples_per_s"] = batch * 1e6 / record["us_per_step"]
        record["final_loss"] = float(state["loss"].item())
    except Exception as e:
        record["error"] = f"{type(e).__name__}: {e}"[:500]
    finally:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return record


def eager_runner(width, data, lr, compiled, amp_dtype=torch.float16, optim="sgd"):
    model = make_model(width)
    opt = make_optimizer(model, optim, lr, captured=False)

    def forward_loss(x, y):
        with torch.autocast("cuda", dtype=amp_dtype):
            return F.cross_entropy(model(x), y)

    fl = torch.compile(forward_loss, mode="max-autotune", fullgraph=True) if compiled else forward_loss
    state = {"s": 0, "loss": None}
    steps = data.order.shape[0]

    def run(n):
        loss = None
        for _ in range(n):
            if compiled:
                # Tells inductor's CUDA-graph trees that a new training step begins, so
                # replays are not re-recorded while the previous step's tensors are alive.
                torch.compiler.cudagraph_mark_step_begin()
            x, y = data.batch(data.order[state["s"] % steps])
            loss = fl(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            state["s"] += 1
        if loss is not None:
            state["loss"] = loss.detach().clone()
    return run, state


def cudagraph_runner(width, data, lr, steps_per_graph=1, amp_dtype=torch.float16, optim="sgd"):
    model = make_model(width)
    opt = make_optimizer(model, optim, lr, captured=True)
    counter = torch.zeros(1, dtype=torch.int64, device="cuda")
    steps = data.order.shape[0]
    static = {}

    def step():
        idx = data.order.index_select(0, counter).squeeze(0)
        x, y = data.batch(idx)
        with torch.autocast("cuda", dtype=amp_dtype):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        counter.add_(1).remainder_(steps)
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up before capture, as the CUDA-graph docs require
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static["loss"] = step()
    many = None
    if steps_per_graph > 1:
        many = torch.cuda.CUDAGraph()
        with torch.cuda.graph(many):
            for _ in range(steps_per_graph):
                opt.zero_grad(set_to_none=True)  # each step's backward writes fresh gradients
                static["many_loss"] = step()

    state = {"loss": None}

    def run(n):
        last = "loss"
        if many is not None:
            for _ in range(n // steps_per_graph):
                many.replay()
                last = "many_loss"
            n %= steps_per_graph
        for _ in range(n):
            graph.replay()
            last = "loss"
        state["loss"] = static[last]
    return run, state


def measure(mode, width, batch, args, data):
    record = {"mode": mode, "width": width, "batch": batch, "steps": args.steps, "repeats": args.repeats,
              "compute": args.compute, "optim": args.optim, "depth": DEPTH[0],
              "activation": ACTIVATION[0]}
    amp_dtype = torch.bfloat16 if args.compute == "bf16" else torch.float16

    def make_runner():
        if mode.startswith("torch_cudagraph"):
            per_graph = int(mode.split("_x")[1]) if "_x" in mode else 1
            return cudagraph_runner(width, data, args.lr, per_graph, amp_dtype, args.optim)
        return eager_runner(width, data, args.lr, compiled=(mode == "torch_compile"), amp_dtype=amp_dtype,
                            optim=args.optim)
    return timed_record(record, make_runner, args, batch)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/mnist")
    p.add_argument("--widths", default="128,256,512,1024,2048,4096,8192")
    p.add_argument("--batches", default="32,256,1024")
    p.add_argument("--modes", default="torch_eager,torch_compile,torch_cudagraph")
    p.add_argument("--compile-batches", default="32", help="batches at which torch_compile runs (it compiles for minutes per shape)")
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--lr", type=float, default=None, help="default: 0.01 for sgd, 1e-3 for adam/adamw/rmsprop")
    p.add_argument("--optim", choices=["sgd", "adam", "adamw", "rmsprop"], default="sgd")
    p.add_argument("--depth", type=int, default=3, help="hidden layers (784-H x depth-10)")
    p.add_argument("--compute", choices=["fp16", "bf16"], default="fp16", help="autocast dtype")
    p.add_argument("--activation", choices=sorted(ACTIVATIONS), default="relu",
                   help="between hidden layers (stepgraph bench --activation)")
    p.add_argument("--quick", action="store_true", help="widths 128,1024, batch 32, 500 steps, 3 repeats")
    p.add_argument("--out", default="")
    a = p.parse_args()
    if a.quick:
        a.widths, a.batches, a.steps, a.repeats = "128,1024", "32", 500, 3
    if a.lr is None:
        a.lr = 0.01 if a.optim == "sgd" else 1e-3
    DEPTH[0] = a.depth
    ACTIVATION[0] = a.activation
    widths = [int(w) for w in a.widths.split(",")]
    batches = [int(b) for b in a.batches.split(",")]
    compile_batches = {int(b) for b in a.compile_batches.split(",")} if a.compile_batches else set(batches)
    modes = a.modes.split(",")

    records = []
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")}

    def save():  # after every point, so a run cut short keeps what it measured
        if a.out:
            with open(a.out, "w") as f:
                json.dump({**meta, "records": records}, f, indent=2)

    for b in batches:
        data = Data(a.data, b, a.steps)
        for w in widths:
            for mode in modes:
                if mode == "torch_compile" and b not in compile_batches:
                    continue
                r = measure(mode, w, b, a, data)
                records.append(r)
                shown = f"{r['us_per_step']:.1f} us/step" if "us_per_step" in r else r["error"]
                print(f"H={w} B={b} {mode}: {shown}", flush=True)
                save()
    save()
    print(f"{'mode':<18}{'width':>7}{'batch':>7}{'us/step':>12}")
    for r in records:
        print(f"{r['mode']:<18}{r['width']:>7}{r['batch']:>7}{r.get('us_per_step', float('nan')):>12.1f}")


if __name__ == "__main__":
    sys.exit(main())
