#!/usr/bin/env python3
"""Export round trip on the GPU image (issue 23): train small models with
stepgraph, export them, and check that PyTorch (safetensors) and onnxruntime
(ONNX) compute the logits of `stepgraph predict`.

For each activation (and one model with dropout, which shifts nn.Sequential's
indices), and for model.sequential networks (issue 37: a CNN, a residual CNN
with the residual: short form and a projection, a CNN with avg_pool2d,
global average pooling and layer_norm, a pre-norm residual MLP, branches
joined by concat, a residual CNN with batch_norm 2d and 1d whose eval-mode
module and ONNX BatchNormalization use the running statistics, also exported
with --fold-batch-norm), on a synthetic float32
dataset:
  stepgraph train (backend auto: the GPU) -> checkpoint
  stepgraph export --format safetensors / onnx
  stepgraph predict --output logits --backend cuda and --backend cpu
  PyTorch: the nn.Sequential named in the safetensors metadata (an MLP) or
           the StepgraphNet class whose code it holds (a model.sequential
           network), load_state_dict(safetensors.torch.load_file(...)),
           eval(), on x * input_scale + input_shift (also from the metadata)
  onnxruntime: the ONNX file on the raw x (its graph does the scaling and,
           for an image model, the reshape to [N, C, H, W])
Prints one PASS/FAIL line per comparison: relative error by norm
(||a - b|| / ||b||) within 1e-3 against stepgraph predict on the GPU (f16
activations), and against predict on the CPU backend (f32).

Usage: bench/export_roundtrip.py [--stepgraph build/apps/stepgraph] [--keep DIR] [--stage all|prepare|check]
                                 [--only all|mlps|graphs]

The GPU image's build has no ONNX support (no libonnx-dev there). Then run
`--stage prepare --keep runs/export_roundtrip` on a machine whose build has it
(trains on its backend, exports both formats; needs only numpy), bring that
folder to the GPU machine and run `--stage check --keep runs/export_roundtrip`
there (predict on the GPU and the CPU, PyTorch, onnxruntime). `--stage all`
(default) does both in one place.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

TOL = 1e-3


def rel(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def report(ok, what, detail):
    print(f"{'PASS' if ok else 'FAIL'} {what}: {detail}")
    return ok


def sh(*args):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args[:2]))}: {(r.stdout + r.stderr).strip().splitlines()[-1:]}")
    return r.stdout


def safetensors_metadata(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))["__metadata__"]


CASES = [("relu", 0.0), ("gelu", 0.0), ("gelu_tanh", 0.0), ("silu", 0.0), ("tanh", 0.0), ("sigmoid", 0.0),
         ("identity", 0.0), ("relu", 0.2)]
DIM, CLASSES = 40, 5
# model.sequential networks on the 40 features seen as 1 x 8 x 5 images.
GRAPHS = {
    "cnn": "[{conv2d: {out: 4, kernel: 3, padding: 1}}, relu, {max_pool2d: {kernel: 2}}, flatten, {linear: {out: 5}}]",
    "resnet": "[{conv2d: {out: 4, kernel: 3, padding: 1}}, relu,"
              " {residual: {layers: [{conv2d: {out: 4, kernel: 3, padding: 1}}, gelu, {conv2d: {out: 4, kernel: 3, padding: 1}}]}},"
              " relu, {residual: {layers: [{conv2d: {out: 8, kernel: 3, padding: 1, stride: 2}}],"
              " projection: {conv2d: {out: 8, kernel: 1, stride: 2}}, name: down}}, flatten, {linear: {out: 5}}]",
    "pooled": "[{conv2d: {out: 6, kernel: 3, padding: 1}}, layer_norm, relu, {avg_pool2d: {kernel: 2}},"
              " {conv2d: {out: 8, kernel: 3, padding: 1}}, silu, global_avg_pool2d, {layer_norm: {eps: 0.001}}, {linear: {out: 5}}]",
    "branched": "[{conv2d: {out: 4, kernel: 3, padding: 1}}, {relu: {name: stem}}, {conv2d: {out: 4, kernel: 3, padding: 1, name: a}},"
                " {conv2d: {out: 2, kernel: 1, inputs: [stem], name: b}}, {concat: {inputs: [a, b, stem]}}, relu, flatten,"
                " {linear: {out: 5}}]",
    "resmlp": "[flatten, {linear: {out: 32}}, {residual: {layers: [layer_norm, {linear: {out: 32}}, silu, {linear: {out: 32}}]}},"
              " layer_norm, {linear: {out: 5}}]",
    # (Its batch_norm 1d normalises a linear layer of the flattened features: after the global mean, 4 features
    # vary by ~0.05 around ~0.5, and f16 activations lose ~2e-3 of their normalised values, which a
    # conditioning test of f16 inference, not of the export, would measure.)
    "batchnorm": "[{conv2d: {out: 4, kernel: 3, padding: 1}}, batch_norm, relu,"
                 " {residual: {layers: [{conv2d: {out: 4, kernel: 3, padding: 1}}, {batch_norm: {momentum: 0.2}}]}},"
                 " relu, flatten, {linear: {out: 8}}, {batch_norm: {eps: 0.001}}, relu, {linear: {out: 5}}]",
}
GRAPH_INPUT = (1, 8, 5)


def case_name(activation, dropout):
    return activation + (f"+dropout{dropout}" if dropout else "")


def selected(names, only):
    """The case names `--only` keeps: all, mlps (the activation cases) or graphs (model.sequential)."""
    return [n for n in names if only == "all" or (only == "graphs") == (n in GRAPHS)]


def prepare(stepgraph, work, only):
    """Data, training (the build's default backend: the GPU where there is one) and both exports."""
    ok = True
    rng = np.random.default_rng(0)
    n = 2048
    y = rng.integers(0, CLASSES, n)
    x = (rng.normal(size=(n, DIM)) + np.eye(CLASSES, DIM)[y] * 2.0).astype(np.float32)
    np.save(f"{work}/x.npy", x)
    np.save(f"{work}/y.npy", y)
    models = [(case_name(a, d), f"{{layers: [{DIM}, 64, 32, {CLASSES}], activation: {a}, dropout: {d}}}")
              for a, d in CASES]
    models += [(name, f"{{input: {list(GRAPH_INPUT)}, sequential: {layers}}}") for name, layers in GRAPHS.items()]
    for name, model in models:
        if name not in selected([name], only):
            continue
        ck = f"{work}/{name}.sgck"
        cfg = f"{work}/{name}.yaml"
        with open(cfg, "w") as f:
            f.write(f"model: {model}\n"
                    f"data: {{train_x: {work}/x.npy, train_y: {work}/y.npy, test_fraction: 0.25, batch_size: 32,"
                    f" eval_batch_size: 64, normalize: true, mean: 0.2, std: 1.3}}\n"
                    f"optim: {{lr: 0.05}}\nprecision: {{weights: fp32}}\n"
                    f"run: {{epochs: 2, out_dir: {work}/run-{name}, checkpoint: {ck}, log_every: 1000}}\n")
        try:
            sh(stepgraph, "train", "-c", cfg)
            sh(stepgraph, "export", "--checkpoint", ck, "--format", "safetensors", "-o", f"{work}/{name}.safetensors")
        except RuntimeError as e:
            ok = report(False, f"{name} train/export", str(e)) and ok
            continue
        try:
            sh(stepgraph, "export", "--checkpoint", ck, "--format", "onnx", "-o", f"{work}/{name}.onnx")
            if "batch_norm" in model:  # also with each batch_norm after a conv folded into it
                sh(stepgraph, "export", "--checkpoint", ck, "--format", "onnx", "--fold-batch-norm",
                   "-o", f"{work}/{name}.folded.onnx")
        except RuntimeError as e:
            if "no ONNX support" in str(e):
                print(f"NOTE {name}: this build has no ONNX support: no .onnx written (run --stage prepare where "
                      "stepgraph is built with libonnx-dev)")
            else:
                ok = report(False, f"{name} onnx export", str(e)) and ok
    return ok


def check(stepgraph, work, only):
    try:
        import torch
        from torch import nn
        import safetensors.torch
    except ImportError as e:
        return report(False, "setup", f"needs torch and safetensors: {e}")
    try:
        import onnxruntime as ort
    except ImportError as e:
        ort = None
        report(False, "setup", f"onnxruntime missing ({e}); the ONNX checks are not run")
    ok = ort is not None
    x = np.load(f"{work}/x.npy")
    for name in selected([case_name(a, d) for a, d in CASES] + list(GRAPHS), only):
        ck, st = f"{work}/{name}.sgck", f"{work}/{name}.safetensors"
        preds = {}
        try:
            for backend in ["cuda", "cpu"]:
                out = f"{work}/{name}.{backend}.npy"
                sh(stepgraph, "predict", "--checkpoint", ck, "--input", f"{work}/x.npy", "-o", out,
                   "--backend", backend, "--output", "logits", "--batch-size", "300")
                preds[backend] = np.load(out)
        except RuntimeError as e:
            ok = report(False, f"{name} predict", str(e)) and ok
            continue
        meta = safetensors_metadata(st)
        code = meta["stepgraph.torch_module"]
        if name in GRAPHS:  # the module's code, as `stepgraph export` prints it
            scope = {}
            exec(code, scope)
            model, shape = scope["StepgraphNet"](), (-1, *GRAPH_INPUT)
        else:
            model, shape = eval(code, {"nn": nn}), (-1, DIM)
        model.load_state_dict(safetensors.torch.load_file(st))
        model.eval()
        scale, shift = float(meta["stepgraph.input_scale"]), float(meta["stepgraph.input_shift"])
        with torch.no_grad():
            torch_logits = model((torch.from_numpy(x) * scale + shift).reshape(shape)).numpy()
        for backend in ["cuda", "cpu"]:
            e = rel(torch_logits, preds[backend])
            ok = report(e < TOL, f"{name} safetensors -> PyTorch vs stepgraph predict ({backend})",
                        f"relative error {e:.2e} (limit {TOL:g}); {code.splitlines()[-1] if name in GRAPHS else code}") and ok
        if ort is None:
            continue
        onnx_file = f"{work}/{name}.onnx"
        if not os.path.exists(onnx_file):
            ok = report(False, f"{name} ONNX", f"{onnx_file} missing: export it with --stage prepare on a build with "
                        "ONNX support") and ok
            continue
        session = ort.InferenceSession(onnx_file, providers=["CPUExecutionProvider"])
        logits, probs = session.run(["logits", "probabilities"], {"input": x})
        for backend in ["cuda", "cpu"]:
            e = rel(logits, preds[backend])
            ok = report(e < TOL, f"{name} ONNX -> onnxruntime vs stepgraph predict ({backend})",
                        f"relative error {e:.2e} (limit {TOL:g})") and ok
        ok = report(np.abs(probs.sum(axis=1) - 1).max() < 1e-5, f"{name} ONNX probabilities", "rows sum to 1") and ok
        folded_file = f"{work}/{name}.folded.onnx"
        if os.path.exists(folded_file):
            session = ort.InferenceSession(folded_file, providers=["CPUExecutionProvider"])
            (logits,) = session.run(["logits"], {"input": x})
            for backend in ["cuda", "cpu"]:
                e = rel(logits, preds[backend])
                ok = report(e < TOL, f"{name} ONNX with batch_norm folded -> onnxruntime vs stepgraph predict ({backend})",
                            f"relative error {e:.2e} (limit {TOL:g})") and ok
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stepgraph", default="build/apps/stepgraph")
    ap.add_argument("--keep", default="")
    ap.add_argument("--stage", choices=["all", "prepare", "check"], default="all")
    ap.add_argument("--only", choices=["all", "mlps", "graphs"], default="all",
                    help="the MLP cases (activations, dropout), the model.sequential graphs, or both")
    args = ap.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="sg-export-")
    os.makedirs(work, exist_ok=True)
    ok = True
    if args.stage in ("all", "prepare"):
        ok = prepare(args.stepgraph, work, args.only) and ok
    if args.stage in ("all", "check"):
        ok = check(args.stepgraph, work, args.only) and ok
    done = {"prepare": "PREPARED", "check": "ALL PASS", "all": "ALL PASS"}[args.stage]
    print(done if ok else "SOME FAILED", f"(stage {args.stage}; files in {work})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
