"""PyTorch DDP baseline for stepgraph's data-parallel training (issues 25, 38):
--model mlp: the MLP 784-W-...-W-10 (--depth hidden layers) with SGD (lr
0.01); --model report_cnn: configs/mnist_cnn.yaml's CNN (torch_cnn.py) with
SGD lr 0.01, momentum 0.5; --model config: the module `stepgraph export
--format safetensors` wrote (--module-from) with the config's optimizer,
compute dtype, input scaling and label smoothing (--config, --set: as
bench/torch_sequential.py reads them; a constant lr). fp16 autocast (the
config's compute dtype for --model config), fp32 master weights, one process
per GPU under torchrun (NCCL). DDP at its best setting by default (issue 38):
gradients compressed to bf16 for the all-reduce (bf16_compress_hook),
gradient_as_bucket_view, static_graph; --plain turns all three off.
Every rank takes its slice of each global batch of world * --batch rows in
stepgraph's order (rank r: rows r*B .. r*B+B-1 of sd.batch_rows for the
global batch), as `stepgraph train --gpus N` does. Prints one JSON line
from rank 0: samples/s over all ranks (median of --repeats timings of
--steps steps, CUDA events, after --warmup steps).
Usage: torchrun --nproc_per_node N bench/torch_ddp.py --data data/mnist --width 8192 --batch 256
       torchrun --nproc_per_node N bench/torch_ddp.py --data data/mnist --model report_cnn --batch 64
       torchrun --nproc_per_node N bench/torch_ddp.py --data data/mnist --model config \
           --config configs/mnist_cnn_fast.yaml --module-from runs/x/module.safetensors --batch 128
"""
import argparse
import json
import os
import statistics

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

import stepgraph_data as sd
from torch_cnn import ReportNet


def from_config(a):
    """--model config: (module, inputs(raw u8 rows), loss(out, y), optimizer(params), autocast dtype), as
    bench/torch_sequential.py builds them for `stepgraph bench --torch` (stepgraph's initial values)."""
    import torch_sequential as ts
    if not a.module_from:
        raise SystemExit("--model config needs --module-from (stepgraph export --format safetensors)")
    flags = argparse.Namespace(**{name: None for name, _ in ts.SETTING_FLAGS})
    s = ts.resolve(flags, ts.read_config(a.config, a.set))
    code, scale, shift = ts.module_source(a.module_from)
    shape = [-1, *ts.input_shape(code)]
    model = ts.build_model(code, s["seed"], "cuda", keep_dropout=True)
    amp = torch.bfloat16 if s["compute"] == "bf16" else torch.float16

    def loss_of(out, y):
        return F.cross_entropy(out, y, label_smoothing=s["label_smoothing"])
    return (model, lambda raw: (raw.float() * scale + shift).view(shape), loss_of,
            lambda params: ts.make_optimizer(s, params, fast=True), amp)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--width", type=int, default=8192)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--batch", type=int, default=256, help="rows per GPU")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--model", choices=["mlp", "report_cnn", "config"], default="mlp")
    p.add_argument("--module-from", default="", help="--model config: the stepgraph export safetensors file")
    p.add_argument("--config", default="", help="--model config: the training config")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="--model config: an override")
    p.add_argument("--plain", action="store_true", help="DDP without the bf16 hook, bucket views and static graph")
    a = p.parse_args()
    local = int(os.environ["LOCAL_RANK"])  # torchrun sets these
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()

    images, labels = sd.load_split(a.data, "train")
    x_all = torch.from_numpy(images.copy()).cuda()
    y_all = torch.from_numpy(labels.astype(np.int64)).cuda()
    n, total = x_all.shape[0], a.warmup + a.steps * a.repeats
    order = torch.tensor([sd.batch_rows(s, n, a.batch * world, 1)[rank * a.batch:(rank + 1) * a.batch]
                          for s in range(total)], device="cuda")

    if a.model == "mlp":
        mods, fan_in = [], 784
        for _ in range(a.depth):
            mods += [torch.nn.Linear(fan_in, a.width), torch.nn.ReLU()]
            fan_in = a.width
        model = torch.nn.Sequential(*mods, torch.nn.Linear(fan_in, 10)).cuda()
        shape, momentum = (-1, 784), 0.0
    elif a.model == "report_cnn":
        model, shape, momentum = ReportNet().cuda(), (-1, 1, 28, 28), 0.5
    else:
        model, inputs, loss_of, make_opt, amp = from_config(a)
    if a.model != "config":
        amp, inputs = torch.float16, (lambda raw: (raw.float() / 255.0).view(*shape))
        # ReportNet ends in log_softmax: NLL of it is the cross-entropy
        loss_of = F.cross_entropy if a.model == "mlp" else F.nll_loss
        make_opt = lambda params: torch.optim.SGD(params, lr=0.01, momentum=momentum)  # noqa: E731
    best = {} if a.plain else {"gradient_as_bucket_view": True, "static_graph": True}
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local], **best)
    if not a.plain:
        ddp.register_comm_hook(None, bf16_compress_hook)
    opt = make_opt(ddp.parameters())
    step = [0]

    def run(k):
        for _ in range(k):
            idx = order[step[0]]
            with torch.autocast("cuda", dtype=amp):
                loss = loss_of(ddp(inputs(x_all[idx])), y_all[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step[0] += 1

    run(a.warmup)
    torch.cuda.synchronize()
    times = []
    for _ in range(a.repeats):
        dist.barrier()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run(a.steps)
        stop.record()
        stop.synchronize()
        t = torch.tensor([start.elapsed_time(stop) / 1e3], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        times.append(t.item())
    seconds = statistics.median(times)
    if rank == 0:
        print(json.dumps({"impl": "torch_ddp" + ("" if a.plain else "_bf16hook_static"), "model": a.model,
                          "world": world, "width": a.width, "depth": a.depth,
                          "batch_per_gpu": a.batch, "samples_per_s": a.steps * a.batch * world / seconds,
                          "us_per_step": 1e6 * seconds / a.steps}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
