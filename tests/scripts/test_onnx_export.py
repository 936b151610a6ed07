#!/usr/bin/python3
"""CI check of `stepgraph export --format onnx` with Debian's python3-onnx (1.12).

Trains a tiny classifier on the CPU backend from an .npy dataset this script
writes, exports it to ONNX, runs onnx.checker and onnx's shape inference on
the file, and compares the ONNX graph's logits with `stepgraph predict
--output logits` on the CPU backend. onnx 1.12 has no reference evaluator, so
the graph is evaluated by the small numpy interpreter below: it is the TEST
ORACLE (the node types the exporter writes: Mul, Add, Gemm, Relu, Tanh,
Sigmoid, Erf, Softmax), not part of stepgraph.

Usage: test_onnx_export.py STEPGRAPH_BINARY. Exits 77 (skipped) without numpy
or onnx, or when the binary was built without ONNX support.
"""
import math
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import onnx
    from onnx import numpy_helper, shape_inference
except ImportError as e:  # visible skip, as ctest reports exit 77
    print(f"SKIPPED: needs numpy and onnx (Debian: python3-numpy python3-onnx): {e}")
    sys.exit(77)


def evaluate(model, x):
    """The test oracle: a numpy evaluation of the exported graph."""
    env = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    env[model.graph.input[0].name] = x.astype(np.float64)
    erf = np.vectorize(math.erf)
    for n in model.graph.node:
        a = [env[i] for i in n.input]
        attrs = {at.name: at.i for at in n.attribute}
        if n.op_type == "Mul":
            y = a[0] * a[1]
        elif n.op_type == "Add":
            y = a[0] + a[1]
        elif n.op_type == "Gemm":
            w = a[1].T if attrs.get("transB", 0) else a[1]
            y = a[0] @ w + (a[2] if len(a) > 2 else 0)
        elif n.op_type == "Relu":
            y = np.maximum(a[0], 0)
        elif n.op_type == "Tanh":
            y = np.tanh(a[0])
        elif n.op_type == "Sigmoid":
            y = 1 / (1 + np.exp(-a[0]))
        elif n.op_type == "Erf":
            y = erf(a[0])
        elif n.op_type == "Softmax":
            z = np.exp(a[0] - a[0].max(axis=attrs.get("axis", -1), keepdims=True))
            y = z / z.sum(axis=attrs.get("axis", -1), keepdims=True)
        else:
            raise SystemExit(f"FAIL: the oracle does not know op {n.op_type}")
        env[n.output[0]] = y
    return {o.name: env[o.name] for o in model.graph.output}


def run(*args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        return r.returncode, (r.stdout + r.stderr).strip().splitlines()[-1:]
    return 0, []


def main():
    stepgraph = sys.argv[1]
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        rng = np.random.default_rng(0)
        n, dim = 400, 10
        y = rng.integers(0, 4, n)
        x = (rng.normal(size=(n, dim)) + np.eye(4, dim)[y] * 2.5).astype(np.float32)
        np.save(f"{d}/x.npy", x)
        np.save(f"{d}/y.npy", y)
        for activation, dropout in [("relu", 0.0), ("gelu", 0.0), ("gelu_tanh", 0.0), ("silu", 0.0), ("tanh", 0.0),
                                    ("sigmoid", 0.0), ("identity", 0.0), ("relu", 0.25)]:
            ck = f"{d}/{activation}.sgck"
            cfg = f"{d}/c.yaml"
            with open(cfg, "w") as f:
                f.write(f"model: {{layers: [{dim}, 24, 16, 4], activation: {activation}, dropout: {dropout}}}\n"
                        f"data: {{train_x: {d}/x.npy, train_y: {d}/y.npy, test_fraction: 0.25, batch_size: 20,"
                        f" eval_batch_size: 50, normalize: true, mean: 0.3, std: 1.7}}\n"
                        f"optim: {{lr: 0.05}}\nrun: {{epochs: 3, out_dir: {d}/run, checkpoint: {ck}, log_every: 1000}}\n"
                        "backend: {kind: cpu}\n")
            rc, msg = run(stepgraph, "train", "-c", cfg)
            if rc != 0:
                print(f"FAIL {activation}: train: {msg}")
                failures += 1
                continue
            rc, msg = run(stepgraph, "export", "--checkpoint", ck, "--format", "onnx", "-o", f"{d}/m.onnx")
            if rc != 0:
                if any("no ONNX support" in m for m in msg):
                    print("SKIPPED: this stepgraph build has no ONNX support")
                    sys.exit(77)
                print(f"FAIL {activation}: export: {msg}")
                failures += 1
                continue
            model = onnx.load(f"{d}/m.onnx")
            onnx.checker.check_model(model)
            inferred = shape_inference.infer_shapes(model, strict_mode=True)
            onnx.checker.check_model(inferred)
            outs = [o.name for o in model.graph.output]
            rc, msg = run(stepgraph, "predict", "--checkpoint", ck, "--input", f"{d}/x.npy", "-o", f"{d}/p.npy",
                          "--backend", "cpu", "--output", "logits", "--batch-size", "64")
            if rc != 0:
                print(f"FAIL {activation}: predict: {msg}")
                failures += 1
                continue
            ours = np.load(f"{d}/p.npy").astype(np.float64)
            got = evaluate(model, x)
            rel = np.linalg.norm(got["logits"] - ours) / max(np.linalg.norm(ours), 1e-30)
            probs_sum = np.abs(got["probabilities"].sum(axis=1) - 1).max()
            # stepgraph's CPU backend rounds activations to the model's f16 compute dtype as the GPU does; the
            # ONNX graph is f32: 1e-3 relative (the bound) covers that rounding, not a wrong layer.
            ok = outs == ["logits", "probabilities"] and rel < 1e-3 and probs_sum < 1e-6
            print(f"{'PASS' if ok else 'FAIL'} {activation}, dropout {dropout}: onnx {onnx.__version__} checker + strict shape inference "
                  f"ok; outputs {outs}; logits vs stepgraph predict (cpu) relative error {rel:.2e}")
            failures += not ok
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
