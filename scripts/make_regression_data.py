#!/usr/bin/env python3
"""Writes configs/data/inr_pattern.csv, the data of configs/regression_mse.yaml.

An implicit neural representation of a small synthetic two-channel image:
each row is one pixel of a 64x64 grid, its coordinates (x, y) in [-1, 1]
as the two features and the image's two channels there as the targets

    ring  = exp(-8 (r - 0.6)^2),  r = sqrt(x^2 + y^2)   (a bright ring)
    waves = sin(3 pi x / 2) * cos(pi y)                  (a smooth wave pattern)

so the network learns a continuous function R^2 -> R^2 from samples of it.
Deterministic (no randomness): running it again rewrites the same bytes.
Usage: python3 scripts/make_regression_data.py [out.csv]
"""
import math
import sys

SIZE = 64


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "configs/data/inr_pattern.csv"
    lines = ["x,y,ring,waves"]
    for i in range(SIZE):
        for j in range(SIZE):
            x = -1.0 + 2.0 * j / (SIZE - 1)
            y = -1.0 + 2.0 * i / (SIZE - 1)
            r = math.hypot(x, y)
            ring = math.exp(-8.0 * (r - 0.6) ** 2)
            waves = math.sin(1.5 * math.pi * x) * math.cos(math.pi * y)
            lines.append(f"{x:.5f},{y:.5f},{ring:.5f},{waves:.5f}")
    with open(out, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
