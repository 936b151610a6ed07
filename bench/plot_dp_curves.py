"""The loss curves of data parallel against one GPU (issue 38): test loss by
step of N GPUs x batch B and 1 GPU x batch N*B, from the runs' metrics.csv,
drawn as one SVG (two panels) with no plotting library, and the largest
relative difference of the two at each evaluation.
Usage: python3 bench/plot_dp_curves.py OUT.svg "TITLE" N_GPU.csv ONE_GPU.csv ["TITLE" N_GPU.csv ONE_GPU.csv ...]"""
import csv
import sys


def test_losses(path):
    with open(path) as f:
        return [(int(r["step"]), float(r["test_loss"])) for r in csv.DictReader(f) if r["test_loss"]]


def panel(x0, title, many, one, width=420, height=260):
    steps = [s for s, _ in many + one]
    losses = [v for _, v in many + one]
    s_max, v_max = max(steps), max(losses) * 1.05
    px = lambda s: x0 + 50 + (width - 70) * s / s_max
    py = lambda v: 30 + (height - 70) * (1 - v / v_max)
    out = [f'<text x="{x0 + width / 2}" y="18" text-anchor="middle" font-size="13">{title}</text>',
           f'<line x1="{x0 + 50}" y1="{py(0)}" x2="{x0 + width - 20}" y2="{py(0)}" stroke="black"/>',
           f'<line x1="{x0 + 50}" y1="30" x2="{x0 + 50}" y2="{py(0)}" stroke="black"/>',
           f'<text x="{x0 + width / 2}" y="{height - 8}" text-anchor="middle" font-size="11">step</text>']
    for k in range(5):
        v = v_max * k / 4
        out.append(f'<text x="{x0 + 45}" y="{py(v) + 4}" text-anchor="end" font-size="10">{v:.2f}</text>')
    for k in range(5):
        s = round(s_max * k / 4)
        out.append(f'<text x="{px(s)}" y="{py(0) + 14}" text-anchor="middle" font-size="10">{s}</text>')
    for points, colour, dash in ((one, "#1f77b4", ""), (many, "#d62728", ' stroke-dasharray="5,3"')):
        path = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"{dash}/>')
    return out


def main():
    out_path, rest = sys.argv[1], sys.argv[2:]
    panels = [rest[i:i + 3] for i in range(0, len(rest), 3)]
    body = []
    for k, (title, many_csv, one_csv) in enumerate(panels):
        many, one = test_losses(many_csv), test_losses(one_csv)
        one_at = dict(one)
        worst = max(abs(v - one_at[s]) / one_at[s] for s, v in many if s in one_at)
        final = abs(many[-1][1] - one[-1][1]) / one[-1][1]
        print(f"{title}: largest relative test-loss difference {worst:.2e}, final {final:.2e}")
        body += panel(440 * k, title, many, one)
    legend_y = 275
    body += [f'<line x1="60" y1="{legend_y}" x2="90" y2="{legend_y}" stroke="#1f77b4" stroke-width="1.5"/>',
             f'<text x="95" y="{legend_y + 4}" font-size="11">1 GPU, batch 2B</text>',
             f'<line x1="220" y1="{legend_y}" x2="250" y2="{legend_y}" stroke="#d62728" stroke-width="1.5" stroke-dasharray="5,3"/>',
             f'<text x="255" y="{legend_y + 4}" font-size="11">2 GPUs, batch B each (--gpus 2)</text>']
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{440 * len(panels)}" height="290" font-family="sans-serif">'
           '<rect width="100%" height="100%" fill="white"/>' + "".join(body) + "</svg>\n")
    with open(out_path, "w") as f:
        f.write(svg)


if __name__ == "__main__":
    main()
