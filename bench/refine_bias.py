"""The high-MI refinement on fresh windows: its bias where it acts, and whether reflecting y changes it.

    python -m bench.refine_bias [--weights models/infonet-v2.safetensors]

Two sets, from seeds used nowhere else (models/README.md, "High MI" and table 3 cite them):

- reflection (seed 9_100_001): Gaussians at rho = 0.97, 0.99, 0.995 and y = f(x) + U(-w, w) bands
  (identity at w = 3% and 8% of the range, sine and cube at 5%, exp and sine at 10%), T = 1024 and 2000,
  8 windows per case, each estimated as (x, y) and as (x, -y): MI is the same, so the two columns should be.
- Gaussians (seed 9_500_001): 40 windows at rho = +0.99, -0.99 and 0.995, T = 2000, refined and table alone,
  with the standard error of the mean bias.

Results: bench/results/refine_bias.{md,json}.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

from training.tasks import bounded_noise_draw, gaussian_mi

from .common import environment, write_results

REFLECTION_SEED = 9_100_001
GAUSS_SEED = 9_500_001
BANDS = (("identity", 0.03), ("identity", 0.08), ("sine", 0.05), ("cube", 0.05), ("exp", 0.1), ("sine", 0.1))


def reflection_cases(draws: int = 8) -> list[tuple[str, float, np.ndarray, np.ndarray]]:
    """(case, true MI, x (draws, T), y (draws, T))."""
    rng = np.random.default_rng(REFLECTION_SEED)
    cases = []
    for t in (1024, 2000):
        for rho in (0.97, 0.99, 0.995):
            z = rng.multivariate_normal([0, 0], [[1, rho], [rho, 1]], size=(draws, t))
            cases.append((f"T={t} Gaussian rho={rho}", gaussian_mi(rho), z[..., 0], z[..., 1]))
        for name, width in BANDS:
            d = [bounded_noise_draw(name, width, rng, t, 0) for _ in range(draws)]
            x, y = np.stack([a.window[:, 0] for a in d]), np.stack([a.window[:, 1] for a in d])
            cases.append((f"T={t} {name}(x)+U(+-{width:g} range)", d[0].mi, x, y))
    return cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default="models/infonet-v2.safetensors")
    args = ap.parse_args(argv)
    os.environ.setdefault("STREAMCORR_AOT", "0")  # accuracy only: the eager network gives the same numbers
    from streamcorr import Estimator

    t_start = time.perf_counter()
    est, table = Estimator(args.weights), Estimator(args.weights, refine_high_mi=False)
    md = [f"# The high-MI refinement on fresh windows (`{args.weights}`)\n",
          f"## Reflecting y (seed {REFLECTION_SEED}): bias of the mean of 8 windows, refined\n",
          "| case | true MI | (x, y) | (x, -y) |", "|---|---|---|---|"]  # fmt: skip
    rows: list[dict[str, Any]] = []
    for case, mi, x, y in reflection_cases():
        rising, falling = est.estimate_batch(x, y) - mi, est.estimate_batch(x, -y) - mi
        rows.append({"case": case, "mi": mi, "bias": float(rising.mean()), "bias_reflected": float(falling.mean())})
        md.append(f"| {case} | {mi:.3f} | {rows[-1]['bias']:+.3f} | {rows[-1]['bias_reflected']:+.3f} |")
    both = np.array([[r["bias"], r["bias_reflected"]] for r in rows])
    md.append(f"\nMean |bias| over both columns {np.abs(both).mean():.4f}, largest {np.abs(both).max():.3f}; "
              f"largest |(x, y) - (x, -y)| {np.abs(both[:, 0] - both[:, 1]).max():.3f}.\n")  # fmt: skip

    md += [f"## Gaussians (seed {GAUSS_SEED}): 40 windows, T = 2000\n",
           "| rho | true MI | refined bias (SE) | spread of one estimate | table alone bias |",
           "|---|---|---|---|---|"]  # fmt: skip
    rng = np.random.default_rng(GAUSS_SEED)
    gauss: list[dict[str, Any]] = []
    for rho in (0.99, -0.99, 0.995):
        z = rng.multivariate_normal([0, 0], [[1, rho], [rho, 1]], size=(40, 2000))
        mi = gaussian_mi(rho)
        err = est.estimate_batch(z[..., 0], z[..., 1]) - mi
        t_err = table.estimate_batch(z[..., 0], z[..., 1]) - mi
        gauss.append({"rho": rho, "mi": mi, "bias": float(err.mean()), "sd": float(err.std()),
                      "table_bias": float(t_err.mean())})  # fmt: skip
        md.append(f"| {rho:+.3f} | {mi:.3f} | {err.mean():+.3f} ({err.std() / np.sqrt(40):.3f}) | {err.std():.3f} "
                  f"| {t_err.mean():+.3f} |")  # fmt: skip
    md.append(f"\nCommand: `python -m bench.refine_bias --weights {args.weights}`; "
              f"{time.perf_counter() - t_start:.0f} s.")  # fmt: skip
    write_results("refine_bias", {"env": environment(), "reflection": rows, "gaussians": gauss}, "\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
