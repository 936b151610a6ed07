"""PyTorch twin of a stepgraph network trained on MNIST. The module is the one
`stepgraph export --format safetensors` stores in the file's metadata
("stepgraph.torch_module": StepgraphNet for model.sequential, an nn.Sequential
for a model.layers MLP), the input scaling beside it (stepgraph.input_scale,
stepgraph.input_shift).
--mode parity: stepgraph's initial values (models/sequential.cpp,
  sequential_initial_parameters: the k-th layer with parameters in list order
  gets w<k> from param_key(seed, 2(k-1)), b<k> from 2(k-1)+1; layer_norm and
  batch_norm weight 1, bias 0, running mean 0, variance 1), stepgraph's batch
  order, the config's optimizer and lr schedule (apps/lr_schedule.cpp, set
  before every step), fp16 (precision.compute bf16: bf16) autocast with fp32
  master weights; then test loss and accuracy in eval mode. No dropout or
  augmentation (refused).
--mode speed (its --out file: `stepgraph bench --config CONFIG --torch-json FILE`
  prints both sides in one table): us/step of eager (fused optimizers), cuda_graph (the eager step,
  batch fetch by a device-side counter, hand-captured with torch.cuda.CUDAGraph)
  and compile_in_graph (the same with the model torch.compile(mode=
  "max-autotune-no-cudagraphs")d inside the captured graph): --warmup steps,
  then the median of --repeats timings of --steps steps. Dropout on, lr fixed.
Settings: flags, over --set key=value, over --config (read when PyYAML
imports), over stepgraph's defaults. Prints one JSON line.
"""
import argparse
import json
import math
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stepgraph_data as sd  # noqa: E402

# Setting -> (config path, stepgraph's default: apps/config/train_config.hpp).
SETTINGS = {
    "batch": ("data.batch_size", 32), "shuffle_seed": ("data.shuffle_seed", 1), "seed": ("run.seed", 0),
    "steps": ("run.steps", 0), "epochs": ("run.epochs", 0), "data_dir": ("data.dir", "data/mnist"),
    "train_limit": ("data.train_limit", 0), "test_limit": ("data.test_limit", 0),
    "eval_batch": ("data.eval_batch_size", 1000), "optim": ("optim.name", "sgd"), "lr": ("optim.lr", 0.01),
    "momentum": ("optim.momentum", 0.0), "weight_decay": ("optim.weight_decay", 0.0),
    "nesterov": ("optim.nesterov", False), "betas": ("optim.betas", [0.9, 0.999]), "eps": ("optim.eps", 1e-08),
    "alpha": ("optim.alpha", 0.99), "centered": ("optim.centered", False),
    "clip_grad_norm": ("optim.clip_grad_norm", 0.0), "schedule": ("optim.schedule.kind", "constant"),
    "warmup_steps": ("optim.schedule.warmup_steps", 0), "step_size": ("optim.schedule.step_size", 1000),
    "gamma": ("optim.schedule.gamma", 0.1), "min_lr": ("optim.schedule.min_lr", 0.0),
    "compute": ("precision.compute", "fp16"), "weights": ("precision.weights", "fp16"),
    "loss": ("model.loss", "softmax_xent"), "label_smoothing": ("model.label_smoothing", 0.0),
    "model_dropout": ("model.dropout", 0.0), "augment_translate": ("data.augment.translate", 0),
    "augment_flip": ("data.augment.flip", False), "format": ("data.format", ""), "train_x": ("data.train_x", ""),
}
# The flags that override settings, with their types (a list: the choices).
SETTING_FLAGS = [("batch", int), ("steps", int), ("epochs", int), ("seed", int), ("shuffle_seed", int),
                 ("optim", ["sgd", "adam", "adamw", "rmsprop"]), ("lr", float), ("momentum", float),
                 ("weight_decay", float), ("nesterov", bool), ("betas", str), ("eps", float), ("alpha", float),
                 ("centered", bool), ("clip_grad_norm", float), ("schedule", ["constant", "step", "cosine"]),
                 ("warmup_steps", int), ("step_size", int), ("gamma", float), ("min_lr", float),
                 ("compute", ["fp16", "bf16"]), ("label_smoothing", float)]


def parse_scalar(text):
    """A --set value as YAML reads it (PyYAML when there, else ints, floats, booleans, [lists], strings)."""
    try:
        import yaml
        return yaml.safe_load(text)
    except ImportError:
        pass
    t = text.strip()
    if t.startswith("[") and t.endswith("]"):
        return [parse_scalar(v) for v in t[1:-1].split(",") if v.strip()]
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    try:
        return float(t) if any(c in t for c in ".eE") else int(t)
    except ValueError:
        pass
    return t.strip("'\"")


def read_config(path, overrides):
    """The config file as nested dicts (empty without --config or PyYAML), --set paths applied over it."""
    cfg = {}
    if path:
        try:
            import yaml
        except ImportError:
            print(f"note: no PyYAML: {path} is not read (give its settings as flags or --set)", file=sys.stderr)
        else:
            with open(path) as f:
                cfg = yaml.safe_load(f) or {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item}: expected key=value, e.g. optim.lr=0.002")
        node, parts = cfg, key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SystemExit(f"--set {item}: {part} is not a section")
        node[parts[-1]] = parse_scalar(value)
        if key.strip() in ("run.steps", "run.epochs"):  # as stepgraph: setting one replaces the other
            cfg["run"].pop("epochs" if key.strip() == "run.steps" else "steps", None)
    return cfg


def resolve(args, cfg):
    """Every setting: the flag when given, else the config's value, else stepgraph's default."""
    s = {}
    for name, (path, default) in SETTINGS.items():
        node = cfg
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        s[name] = default if node is None else node
    for name, _ in SETTING_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            s[name] = value
    if args.steps is not None or args.epochs is not None:  # as stepgraph's --set: one replaces the other
        s["epochs" if args.steps is not None else "steps"] = 0
    s["betas"] = tuple(float(b) for b in (s["betas"].split(",") if isinstance(s["betas"], str) else s["betas"]))
    for name, (_, default) in SETTINGS.items():  # each as its default's type (YAML may give 1 for 1.0)
        if isinstance(default, (bool, int, float)):
            s[name] = type(default)(s[name])
    return s


def learning_rate_at(s, step, total):
    """apps/lr_schedule.cpp's learning_rate_at: linear warm-up, then constant, step decay or cosine to min_lr."""
    lr, warm = s["lr"], s["warmup_steps"]
    if warm > 0 and step < warm:
        return lr * (step + 1) / warm
    if s["schedule"] == "step":
        return lr * s["gamma"] ** (step // s["step_size"])
    if s["schedule"] == "cosine":
        span = max(1, total - warm)
        t = min(max((step - warm) / span, 0.0), 1.0)
        return s["min_lr"] + 0.5 * (lr - s["min_lr"]) * (1.0 + math.cos(math.pi * t))
    return lr


def module_source(path):
    """(code, input_scale, input_shift) from an exported safetensors file's header (no safetensors package)."""
    from export_roundtrip import safetensors_metadata
    meta = safetensors_metadata(path)
    if "stepgraph.torch_module" not in meta:
        raise SystemExit(f"{path}: no stepgraph.torch_module metadata (from stepgraph export --format safetensors)")
    return meta["stepgraph.torch_module"], float(meta["stepgraph.input_scale"]), float(meta["stepgraph.input_shift"])


DROPOUT_LINE = re.compile(r"^(\s*h\d+ = )(\S+)  # (dropout2d|dropout)\(p=([^)]*)\): off at inference$", re.M)


def dropout_rates(code):
    """The dropout probabilities the module code names (StepgraphNet's comments, nn.Sequential's nn.Dropout)."""
    rates = [float(m.group(4)) for m in DROPOUT_LINE.finditer(code)]
    return rates + [float(p) for p in re.findall(r"nn\.Dropout2?d?\(\s*(?:p\s*=\s*)?([0-9.eE+-]+)", code)]


def with_dropout(code):
    """StepgraphNet's code with its dropout layers on in train() (the export leaves them out: inference)."""
    on = r"\1F.\3(\2, p=\4, training=self.training)"
    return DROPOUT_LINE.sub(on, code)


def input_shape(code):
    """The per-example shape: StepgraphNet's forward comment "x: [N, C, H, W]", else [the first nn.Linear's in]."""
    m = re.search(r"def forward\(self, x\):\s*# x: \[N, ([0-9, ]+)\]", code) or re.search(r"nn\.Linear\((\d+),", code)
    if not m:
        raise SystemExit("the module code names no input shape (no 'x: [N, ...]' comment, no leading nn.Linear)")
    return [int(v) for v in m.group(1).split(",")]


def parameter_layers(children):
    """[(name, kind, weight shape, has bias)] of the layers with parameters, in list order. `children`: the module's
    (name, submodule) pairs; StepgraphNet's layer<i> sorted by i, nn.Sequential's by position."""
    out, digits = [], lambda name: int(re.sub(r"^layer", "", name)) if re.fullmatch(r"(layer)?\d+", name) else -1
    for name, mod in sorted(children, key=lambda item: digits(item[0])):
        kind = type(mod).__name__
        if kind in ("Linear", "Conv2d", "LayerNorm", "BatchNorm1d", "BatchNorm2d") and mod.weight is not None:
            out.append((name, kind, tuple(mod.weight.shape), getattr(mod, "bias", None) is not None))
        elif any(True for _ in mod.parameters()):
            raise SystemExit(f"{name}: {kind} has parameters, and stepgraph has no rule for their initial values here")
    return out


def initial_values(layers, seed):
    """{state-dict name: float32 array} as sequential_initial_parameters makes them (k counts the layers above)."""
    import numpy as np
    values = {}
    for k, (name, kind, shape, has_bias) in enumerate(layers, start=1):
        count, out = int(np.prod(shape)), shape[0]
        def draw(n, index, fan_in=count // out):
            return np.asarray(sd.linear_init(n, fan_in, sd.param_key(seed, index)), np.float32)
        if kind in ("Linear", "Conv2d"):  # fan_in = weight elements / out; then layer_norm, batch_norm: no draws
            values[f"{name}.weight"] = draw(count, 2 * (k - 1)).reshape(shape)
            if has_bias:
                values[f"{name}.bias"] = draw(out, 2 * (k - 1) + 1)
            continue
        ones, zeros = np.ones(shape, np.float32), np.zeros(shape, np.float32)
        values[f"{name}.weight"], values[f"{name}.bias"] = ones, zeros
        if kind.startswith("BatchNorm"):  # running mean 0, running variance 1
            values[f"{name}.running_mean"], values[f"{name}.running_var"] = zeros, ones
    return values


def build_model(code, seed, device, keep_dropout=False):
    """The exported module (StepgraphNet or nn.Sequential) with stepgraph's initial values."""
    import torch
    scope = {"nn": torch.nn, "torch": torch}
    if "class StepgraphNet" in code:
        exec(with_dropout(code) if keep_dropout else code, scope)
    model = scope["StepgraphNet"]() if "StepgraphNet" in scope else eval(code, scope)
    layers, state = parameter_layers(list(model.named_children())), model.state_dict()
    with torch.no_grad():
        for name, value in initial_values(layers, seed).items():
            if tuple(state[name].shape) != value.shape:
                raise SystemExit(f"{name}: the module has {tuple(state[name].shape)}, the rule gives {value.shape}")
            state[name].copy_(torch.from_numpy(value))
    return model.to(device)


def make_optimizer(s, params, captured=False, fast=False):
    """torch.optim's counterpart of optim.name with the config's settings (stepgraph's updates are PyTorch's formulas:
    ops/cpu/reference_ops.hpp). captured: capturable state on the GPU; fast: fused / foreach kernels."""
    import torch
    extra = {"foreach": True} if (fast or captured) else {}
    if s["optim"] == "sgd":
        params = list(params)
        make = lambda **kw: torch.optim.SGD(params, lr=s["lr"], momentum=s["momentum"],  # noqa: E731
                                            weight_decay=s["weight_decay"], nesterov=s["nesterov"], **kw)
        if fast and not captured:
            try:
                return make(fused=True)
            except (TypeError, RuntimeError):  # a PyTorch without fused SGD
                pass
        return make(**extra)
    if s["optim"] == "rmsprop":
        return torch.optim.RMSprop(params, lr=s["lr"], alpha=s["alpha"], eps=s["eps"], weight_decay=s["weight_decay"],
                                   momentum=s["momentum"], centered=s["centered"], capturable=captured, **extra)
    kind = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[s["optim"]]  # (parse_args/check_settings: no other)
    return kind(params, lr=s["lr"], betas=s["betas"], eps=s["eps"], weight_decay=s["weight_decay"],
                capturable=captured, **({"fused": True} if (fast or captured) else {}))


def check_settings(s, code, mode):
    if s["format"] not in ("", "idx") or s["train_x"]:
        raise SystemExit("data: only MNIST's IDX files (data.dir) are mirrored here, not data.train_x / npy / csv")
    if s["loss"] != "softmax_xent":
        raise SystemExit(f"model.loss {s['loss']}: only softmax_xent (MNIST's class labels) is mirrored here")
    for key, allowed in (("compute", ("fp16", "bf16")), ("optim", ("sgd", "adam", "adamw", "rmsprop")),
                         ("schedule", ("constant", "step", "cosine"))):
        if s[key] not in allowed:
            raise SystemExit(f"{SETTINGS[key][0]} {s[key]}: expected one of {', '.join(allowed)}")
    if mode != "parity":
        return
    if any(p > 0 for p in dropout_rates(code)) or s["model_dropout"] > 0:
        raise SystemExit("parity: the network has dropout p > 0: stepgraph's dropout masks (Philox, keyed per layer "
                         "and step) are not PyTorch's; train both with the dropout layers at p: 0")
    if s["augment_translate"] or s["augment_flip"]:
        raise SystemExit("parity: data.augment is on: stepgraph's per-step image augmentation is not mirrored; "
                         "turn it off on both sides")
    if s["weights"] != "fp32":
        print(f"note: precision.weights is {s['weights']}: stepgraph keeps {s['weights']} master weights, this twin "
              "fp32 ones (set precision.weights: fp32 on stepgraph's side for a like-for-like run)", file=sys.stderr)


class Data:
    """MNIST on the GPU: u8 rows, scaled and reshaped per batch as stepgraph's fetch does."""

    def __init__(self, s, folder, scale, shift, shape, device):
        import numpy as np
        import torch
        tx, ty = sd.load_split(folder, "train", s["train_limit"])
        vx, vy = sd.load_split(folder, "t10k", s["test_limit"])
        self.x, self.y, self.tx, self.ty = (torch.from_numpy(a.astype(d)).to(device) for a, d in
                                            ((tx, np.uint8), (ty, np.int64), (vx, np.uint8), (vy, np.int64)))
        self.rows, self.scale, self.shift, self.shape = tx.shape[0], scale, shift, [-1, *shape]
        if int(np.prod(shape)) != tx.shape[1]:
            raise SystemExit(f"the module takes {shape} per example, the data has {tx.shape[1]} values per row")

    def order(self, steps, s):
        import numpy as np
        import torch
        rows = np.array([sd.batch_rows(t, self.rows, s["batch"], s["shuffle_seed"]) for t in range(steps)], np.int64)
        return torch.from_numpy(rows).to(self.x.device)

    def inputs(self, raw):
        return (raw.float() * self.scale + self.shift).view(self.shape)


def train_step(s, net, model, opt, amp, x, y, zero=True):
    """Forward under autocast, cross-entropy, backward, clipping, the optimizer's step: stepgraph's training step."""
    import torch
    import torch.nn.functional as F
    with torch.autocast(x.device.type, dtype=amp):
        loss = F.cross_entropy(net(x), y, label_smoothing=s["label_smoothing"])
    if zero:
        opt.zero_grad(set_to_none=True)
    loss.backward()
    if s["clip_grad_norm"] > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), s["clip_grad_norm"])
    opt.step()
    return loss


def parity(s, code, data, device):
    import torch
    import torch.nn.functional as F
    model = build_model(code, s["seed"], device)
    amp = torch.bfloat16 if s["compute"] == "bf16" else torch.float16
    total = s["steps"] if s["steps"] > 0 else s["epochs"] * (data.rows // s["batch"])  # training_run.cpp's total_steps
    if total <= 0:
        raise SystemExit("no steps to train: give --steps or --epochs (or run.steps / run.epochs in the config)")
    order = data.order(total, s)
    opt = make_optimizer(s, model.parameters())
    losses, start = [], time.time()
    model.train()
    for step in range(total):
        for group in opt.param_groups:  # set before every step, as training_run.cpp does with a varying schedule
            group["lr"] = learning_rate_at(s, step, total)
        idx = order[step]
        losses.append(train_step(s, model, model, opt, amp, data.inputs(data.x[idx]), data.y[idx]).detach())
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds, losses = time.time() - start, torch.stack(losses).float()
    model.eval()
    loss_sum, correct, n = 0.0, 0, data.tx.shape[0]
    with torch.no_grad(), torch.autocast(device.type, dtype=amp):
        for first in range(0, n, s["eval_batch"]):
            logits = model(data.inputs(data.tx[first:first + s["eval_batch"]])).float()
            y = data.ty[first:first + s["eval_batch"]]
            loss_sum += F.cross_entropy(logits, y, reduction="sum", label_smoothing=s["label_smoothing"]).item()
            correct += int((logits.argmax(1) == y).sum().item())
    return {"mode": "parity", "test_loss": loss_sum / n, "test_accuracy": correct / n, "steps": total,
            "seconds": seconds, "final_train_loss_mean_last_100": float(losses[-100:].mean().item()),
            "losses_every_100": losses[::100].tolist(), "optim": s["optim"],
            "schedule": s["schedule"], "compute": s["compute"], "batch": s["batch"], "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if device.type == "cuda" else device.type}


def speed_runner(s, code, data, device, kind, order):
    """(run(n), state) for torch_bench.timed_record: eager, cuda_graph or compile_in_graph."""
    import torch
    model = build_model(code, s["seed"], device, keep_dropout=True)
    model.train()
    amp = torch.bfloat16 if s["compute"] == "bf16" else torch.float16
    captured = kind != "eager"
    opt = make_optimizer(s, model.parameters(), captured=captured, fast=True)
    compiled = kind == "compile_in_graph"
    net = torch.compile(model, mode="max-autotune-no-cudagraphs", dynamic=False) if compiled else model
    steps = order.shape[0]
    counter = torch.zeros(1, dtype=torch.int64, device=device)

    def step(at=None):  # at: the eager step's number; None: the captured step's, from the device-side counter
        idx = order[at % steps] if at is not None else order.index_select(0, counter).squeeze(0)
        loss = train_step(s, net, model, opt, amp, data.inputs(data.x[idx]), data.y[idx], zero=at is not None)
        if at is None:
            counter.add_(1).remainder_(steps)
        return loss

    state = {"s": 0, "loss": None}
    if not captured:
        def run(n):
            for _ in range(n):
                state["loss"], state["s"] = step(state["s"]).detach(), state["s"] + 1
        return run, state
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up before capture (CUDA-graph docs); compiles and autotunes the compiled model
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    opt.zero_grad(set_to_none=True)  # backward inside the graph writes fresh gradients each replay
    graph, static = torch.cuda.CUDAGraph(), {}
    with torch.cuda.graph(graph):
        static["loss"] = step()

    def run(n):
        for _ in range(n):
            graph.replay()
        state["loss"] = static["loss"]
    return run, state


def speed(s, code, data, device, a):
    import statistics
    import torch
    from torch_bench import timed_record
    torch.backends.cudnn.benchmark = True
    order = data.order(max(a.steps + a.warmup, 1), s)
    timing = argparse.Namespace(steps=a.steps, warmup=a.warmup, repeats=a.repeats)
    result = {"mode": "speed", "batch": s["batch"], "steps": a.steps, "repeats": a.repeats, "warmup": a.warmup,
              "optim": s["optim"], "compute": s["compute"], "dropout": [p for p in dropout_rates(code) if p > 0]}
    clocks, result["errors"] = [], {}
    for kind in a.modes.split(","):
        r = timed_record({}, lambda: speed_runner(s, code, data, device, kind, order), timing, s["batch"])
        result[f"{kind}_us"], result[f"{kind}_all_us"] = r.get("us_per_step"), r.get("all_us_per_step")
        clocks += [r[k] for k in ("sm_clock_mhz_before", "sm_clock_mhz_after") if r.get(k, math.nan) == r.get(k)]
        if "error" in r:
            result["errors"][kind] = r["error"]
        # What `stepgraph bench --config ... --torch-json` merges (width 0: a config's model).
        result.setdefault("records", []).append(
            {"mode": f"torch_{kind}", "width": 0, "batch": s["batch"], "us_per_step": r.get("us_per_step"),
             "error": r.get("error")})
        print(f"{kind}: {r.get('us_per_step', math.nan):.1f} us/step {r.get('error', '')}", file=sys.stderr, flush=True)
    result.update(sm_clock_mhz=statistics.median(clocks) if clocks else None, sm_clocks_mhz=clocks,
                  device=torch.cuda.get_device_name(), torch=torch.__version__)
    return result


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--module-from", required=True, help="the stepgraph export --format safetensors file")
    p.add_argument("--config", default="", help="the training config (read when PyYAML imports)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override, e.g. optim.lr=0.1")
    p.add_argument("--data", default=None, help="MNIST's IDX folder (default: data.dir)")
    p.add_argument("--mode", choices=["parity", "speed"], default="parity")
    p.add_argument("--device", default="cuda")
    p.add_argument("--repeats", type=int, default=5, help="speed: timings per setting (the median is reported)")
    p.add_argument("--warmup", type=int, default=50, help="speed: untimed steps before timing")
    p.add_argument("--modes", default="eager,cuda_graph,compile_in_graph", help="speed: the settings timed")
    p.add_argument("--out", default="", help="also write the JSON here")
    g = p.add_argument_group("settings (override the config)")
    for name, kind in SETTING_FLAGS:
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            g.add_argument(flag, action="store_true", default=None)
        elif isinstance(kind, list):
            g.add_argument(flag, choices=kind)
        else:
            g.add_argument(flag, type=kind, help="parity: training steps (replaces run.epochs); speed: timed steps "
                           "per repeat (default 200)" if name == "steps" else None)
    return p.parse_args(argv)


def main(argv=None):
    a = parse_args(argv)
    s = resolve(a, read_config(a.config, a.set))
    code, scale, shift = module_source(a.module_from)
    check_settings(s, code, a.mode)
    import torch
    device = torch.device(a.device)
    data = Data(s, a.data or s["data_dir"], scale, shift, input_shape(code), device)
    a.steps = 200 if a.steps is None else a.steps  # speed's timed steps (parity reads s["steps"])
    result = parity(s, code, data, device) if a.mode == "parity" else speed(s, code, data, device, a)
    line = json.dumps(result)
    print(line, flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
