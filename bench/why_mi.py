"""The README's picture: relations where Pearson's r is near zero and MI is not.

python -m bench.why_mi   ->  bench/results/why_mi.png
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from streamcorr import estimate_mi_batch

from .common import RESULTS


def main() -> int:
    rng = np.random.default_rng(7)
    t = 2000
    x = rng.standard_normal(t)
    angle = rng.uniform(-np.pi, np.pi, t)
    cases = {
        "linear": (x, 0.8 * x + 0.6 * rng.standard_normal(t)),
        "quadratic": (x, x**2 + 0.3 * rng.standard_normal(t)),
        "circle": (np.cos(angle) + 0.05 * rng.standard_normal(t), np.sin(angle) + 0.05 * rng.standard_normal(t)),
        "sign flip": (x, np.abs(x) * rng.choice([-1.0, 1.0], t)),
        "independent": (x, rng.standard_normal(t)),
    }
    xs = np.stack([a for a, _ in cases.values()])
    ys = np.stack([b for _, b in cases.values()])
    mi = estimate_mi_batch(xs, ys)
    fig, axes = plt.subplots(1, len(cases), figsize=(3 * len(cases), 3.2))
    for ax, (name, (a, b)), m in zip(axes, cases.items(), mi, strict=True):
        ax.scatter(a, b, s=2, alpha=0.4)
        ax.set_title(f"{name}\nPearson r = {np.corrcoef(a, b)[0, 1]:+.2f}   MI = {m:.2f} nats", fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    out = RESULTS / "why_mi.png"
    fig.savefig(out, dpi=90)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
