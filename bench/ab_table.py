#!/usr/bin/env python3
"""Table of a bench/ab_compare.sh run: per mode, width and batch, the median
us/step of the base and new builds over their rounds and the change in %."""
import glob
import json
import os
import statistics
import sys


def load(out, side):
    runs = {}
    for path in sorted(glob.glob(os.path.join(out, f"{side}_*", "bench.json"))):
        with open(path) as f:
            data = json.load(f)
        for r in data["records"]:
            runs.setdefault((r["mode"], r["width"], r["batch"]), []).append(r["us_per_step"])
        device = data.get("device", "?")
    return runs, device


def main():
    out = sys.argv[1]
    base, device = load(out, "base")
    new, _ = load(out, "new")
    print(f"device: {device}; median over rounds of each run's median us/step\n")
    print("| mode | width | batch | base us | new us | change |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for key in sorted(set(base) & set(new)):
        b, n = statistics.median(base[key]), statistics.median(new[key])
        change = 100.0 * (n - b) / b
        if key[0] == "graph_replay":
            worst = max(worst, change)
        print(f"| {key[0]} | {key[1]} | {key[2]} | {b:.1f} | {n:.1f} | {change:+.1f}% |")
    print(f"\nlargest graph_replay slowdown: {worst:+.1f}%")


if __name__ == "__main__":
    main()
