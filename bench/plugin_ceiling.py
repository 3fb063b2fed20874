"""The plug-in ceiling of a G-node table on the sharp cases of issue 13 (bounded noise, Gaussian rho = 0.99).

    python -m bench.plugin_ceiling [--samples 200000] [--quick]

InfoNet reads MI out of a G x G table theta by the DV formula over the window's linear-binned
histogram H (model card, step 6). Over all tables, the largest value that read-out can give is
the KL divergence between the binned joint and the product of its binned marginals, sum
p log(p / (px py)): the plug-in MI of the binned copula. Measured here from a large sample (so the
finite-window bias is negligible), it is the best any G-node table can do: a shortfall from the true MI
at G = 64 cannot be trained away, only removed by a finer table or another head. Results:
bench/results/plugin_ceiling.md.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from streamcorr.estimate.copula import marginal_histograms, pair_histograms, rank_transform
from training.tasks import bounded_noise_draw, gaussian_mi, uniform_noise_mi

from .common import environment, write_results

GRIDS = (32, 64, 128)
SEED = 9_300_001


def binned_plugin(x: np.ndarray, y: np.ndarray, grid: int) -> float:
    """KL(binned joint || product of binned marginals) of the copula of (x, y) on a grid x grid node lattice."""
    u = rank_transform(np.stack([x, y]), "jitter")
    h = pair_histograms(u[:1], u[1:], grid)[0].astype(np.float64)
    m = marginal_histograms(u, grid).astype(np.float64)
    p, px, py = h / h.sum(), m[0] / m[0].sum(), m[1] / m[1].sum()
    q = px[:, None] * py[None, :]
    nz = p > 0
    return float((p[nz] * np.log(p[nz] / q[nz])).sum())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--quick", action="store_true", help="20,000 samples (a smoke test)")
    args = ap.parse_args(argv)
    if args.quick:
        args.samples = 20_000
    t0 = time.perf_counter()
    rng = np.random.default_rng(SEED)
    cases: list[tuple[str, float, np.ndarray]] = []
    for eps in (0.05, 0.15, 0.24):
        d = bounded_noise_draw("identity", eps, rng, args.samples, 0)
        cases.append((f"x+U(+-{eps:.2f})", uniform_noise_mi(eps), d.window.T))
    for name in ("cube", "sine", "exp"):
        d = bounded_noise_draw(name, 0.05, rng, args.samples, 0)
        cases.append((f"{name}(x)+U(+-0.05 range)", d.mi, d.window.T))
    z = rng.multivariate_normal([0, 0], [[1, 0.99], [0.99, 1]], size=args.samples)
    cases.append(("Gaussian rho=0.99", gaussian_mi(0.99), z.T))
    rows: list[dict[str, Any]] = []
    for name, mi, w in cases:
        ceil = {g: binned_plugin(w[0], w[1], g) for g in GRIDS}
        rows.append({"case": name, "true_mi": mi, "ceiling": ceil, "shortfall": {g: c - mi for g, c in ceil.items()}})
        print(rows[-1], flush=True)
    md = [
        f"# Plug-in ceiling of a G-node table ({args.samples:,} samples per case)\n",
        "Best MI any G x G table can give under InfoNet's DV read-out (the binned copula's plug-in MI), minus the "
        "true MI. Negative: the table cannot represent the copula's sharpness.\n",
        "| case | true MI | " + " | ".join(f"G = {g}" for g in GRIDS) + " |",
        "|---|---|" + "---|" * len(GRIDS),
    ]
    for r in rows:
        md.append(f"| {r['case']} | {r['true_mi']:.3f} | "
                  + " | ".join(f"{r['shortfall'][g]:+.3f}" for g in GRIDS) + " |")  # fmt: skip
    md += ["", f"Command: `python -m bench.plugin_ceiling --samples {args.samples}`; {time.perf_counter() - t0:.0f} s."]
    data = {"env": environment(), "samples": args.samples, "rows": rows}
    write_results("plugin_ceiling_quick" if args.quick else "plugin_ceiling", data, "\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
