"""Outside the training family: KSG-3 and InfoNet weights on dependence no training generator draws.

    python -m bench.out_of_family [--weights models/infonet-v1.safetensors models/infonet-v2.safetensors]

Cases (seeds 9_200_00x, used nowhere else), each as bias of the mean and mean
absolute error over independent windows:

- heavy tails: bivariate Student-t with nu = 1 (Cauchy) and 3 degrees of
  freedom at rho = 0, 0.5, 0.9 (tail dependence, which no Gaussian mixture has);
- non-monotone: y = f(x) + sigma * e with x, e standard normal, f = x^2 and
  sin(3x), at three noise levels;
- high MI beyond training: Gaussians at rho = 0.995 and 0.999 (2.3, 3.1 nats);
- sharp high MI (where the table's resolution runs out): Student-t nu = 3 at
  rho = 0.995, y = x^2 + 0.05 e, y = sin(3x) + 0.05 e, and an ADC pair (a Gaussian
  at rho = 0.998 with both axes quantised to 24 equal-width levels on [-3, 3];
  exact discrete MI from bivariate normal cell probabilities), at T = 2000 and 512;
- short windows: T = 64 and 128 on Gaussians and on y = x^2 + noise.

Ground truth: exact for Gaussians; otherwise the Monte-Carlo mean of
log p(x, y) - log p(x) - log p(y) over 200,000 samples (Student-t densities from
scipy) or 50,000 (the noisy maps: p(y) by quadrature over x), with its standard error.
Each weights file gives two columns: the estimator's default (high-MI refinement on) and
its table alone (``refine_high_mi=False``). Results: bench/results/out_of_family.{md,json}.
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import stats

from training.mixtures import GaussianMixture
from training.tasks import cell_mi, cell_probabilities, gaussian_mi

from .baselines import KSG
from .common import environment, write_results

SEED = 9_200_001
MC = 200_000
Sampler = Callable[[np.random.Generator, int], np.ndarray]  # (rng, n) -> (n, 2)


def student_t(nu: float, rho: float) -> tuple[Sampler, float, float]:
    joint = stats.multivariate_t(loc=[0.0, 0.0], shape=[[1.0, rho], [rho, 1.0]], df=nu)

    def sample(rng: np.random.Generator, n: int) -> np.ndarray:
        return np.asarray(joint.rvs(size=n, random_state=rng)).reshape(n, 2)

    z = sample(np.random.default_rng(SEED + 10), MC)
    pmi = joint.logpdf(z) - stats.t.logpdf(z[:, 0], nu) - stats.t.logpdf(z[:, 1], nu)
    return sample, float(pmi.mean()), float(pmi.std(ddof=1) / np.sqrt(MC))


@functools.cache
def noisy_map(f: Callable[[np.ndarray], np.ndarray], sigma: float) -> tuple[Sampler, float, float]:
    def sample(rng: np.random.Generator, n: int) -> np.ndarray:
        x = rng.standard_normal(n)
        return np.stack([x, f(x) + sigma * rng.standard_normal(n)], 1)

    n = MC // 4  # p(y) by quadrature costs 4,001 kernel terms per sample
    z = sample(np.random.default_rng(SEED + 11), n)
    grid = np.linspace(-8.0, 8.0, 4001)
    w = stats.norm.pdf(grid) * (grid[1] - grid[0]) / (sigma * np.sqrt(2 * np.pi))  # x ~ N(0, 1) quadrature
    fx = f(grid)
    log_py = np.empty(n)
    for lo in range(0, n, 1000):  # p(y) = E_x[phi_sigma(y - f(x))], in chunks to bound memory
        d = (z[lo : lo + 1000, 1:2] - fx) / sigma
        log_py[lo : lo + 1000] = np.log((w * np.exp(-0.5 * d * d)).sum(1))
    pmi = stats.norm.logpdf(z[:, 1] - f(z[:, 0]), scale=sigma) - log_py
    return sample, float(pmi.mean()), float(pmi.std(ddof=1) / np.sqrt(n))


def _sin3(x: np.ndarray) -> np.ndarray:
    return np.sin(3.0 * x)


def gaussian(rho: float) -> tuple[Sampler, float, float]:
    cov = [[1.0, rho], [rho, 1.0]]
    return (lambda rng, n: rng.multivariate_normal([0.0, 0.0], cov, size=n)), gaussian_mi(rho), 0.0


def adc_pair(rho: float, levels: int) -> tuple[Sampler, float, float]:
    """A Gaussian pair read through two ADCs: equal-width levels on [-3, 3] (clipped outside)."""
    edges = np.linspace(-3.0, 3.0, levels + 1)[1:-1]
    gm = GaussianMixture(np.ones(1), np.zeros((1, 2)), np.array([[[1.0, rho], [rho, 1.0]]]))
    pxy = cell_probabilities(gm, edges, edges)
    truth = cell_mi(pxy / pxy.sum())

    def sample(rng: np.random.Generator, n: int) -> np.ndarray:
        z = rng.multivariate_normal([0.0, 0.0], [[1.0, rho], [rho, 1.0]], size=n)
        return np.digitize(z, edges).astype(np.float64)

    return sample, truth, 0.0


def cases() -> list[tuple[str, str, Sampler, float, float, int, int]]:
    """(group, case, sampler, truth, its SE, window length, windows)."""
    out = []
    for nu in (1.0, 3.0):
        for rho in (0.0, 0.5, 0.9):
            out.append(("heavy tails", f"Student-t nu={nu:g} rho={rho:g}", *student_t(nu, rho), 2000, 20))
    for name, f in (("x^2", np.square), ("sin(3x)", _sin3)):
        for sigma in (0.1, 0.3, 1.0):
            out.append(("non-monotone", f"y={name}+{sigma:g}e", *noisy_map(f, sigma), 2000, 20))
    for rho in (0.995, 0.999):
        out.append(("high MI", f"Gaussian rho={rho:g}", *gaussian(rho), 2000, 20))
    for t in (2000, 512):
        out.append(("sharp high MI", f"Student-t nu=3 rho=0.995, T={t}", *student_t(3.0, 0.995), t, 20))
        out.append(("sharp high MI", f"y=x^2+0.05e, T={t}", *noisy_map(np.square, 0.05), t, 20))
        out.append(("sharp high MI", f"y=sin(3x)+0.05e, T={t}", *noisy_map(_sin3, 0.05), t, 20))
        out.append(("sharp high MI", f"ADC 24 levels rho=0.998, T={t}", *adc_pair(0.998, 24), t, 20))
    for t in (64, 128):
        for rho in (0.0, 0.5, 0.8):
            out.append(("short windows", f"Gaussian rho={rho:g}, T={t}", *gaussian(rho), t, 50))
        out.append(("short windows", f"y=x^2+0.3e, T={t}", *noisy_map(np.square, 0.3), t, 50))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", nargs="+", default=["models/infonet-v1.safetensors", "models/infonet-v2.safetensors"])
    args = ap.parse_args(argv)
    os.environ.setdefault("STREAMCORR_AOT", "0")  # accuracy only: the eager network gives the same numbers
    from streamcorr import Estimator

    t_start = time.perf_counter()
    ests: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {"KSG-3": KSG(3).estimate}
    for w in args.weights:
        name = os.path.basename(w).removesuffix(".safetensors")
        ests[name] = Estimator(w).estimate_batch
        ests[f"{name}, table only"] = Estimator(w, refine_high_mi=False).estimate_batch
    names = list(ests)
    rng = np.random.default_rng(SEED)
    rows: list[dict[str, Any]] = []
    for group, case, sample, truth, se, t, n in cases():
        z = np.stack([sample(rng, t).T for _ in range(n)])  # (n, 2, T)
        row: dict[str, Any] = {"group": group, "case": case, "mi": truth, "se": se, "window_len": t, "windows": n}
        for name, est in ests.items():
            err = est(z[:, 0], z[:, 1]) - truth
            row[name] = {"bias": float(err.mean()), "mae": float(np.abs(err).mean())}
        rows.append(row)
        print(case, round(truth, 3), {k: round(row[k]["bias"], 3) for k in names}, flush=True)
    md = [
        "# Outside the training family: bias of the mean (MAE in brackets), nats\n",
        "| group | case | true MI (SE) | " + " | ".join(names) + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    for r in rows:
        cells = " | ".join(f"{r[k]['bias']:+.3f} ({r[k]['mae']:.3f})" for k in names)
        md.append(f"| {r['group']} | {r['case']} | {r['mi']:.3f} ({r['se']:.3f}) | {cells} |")
    md.append("\n| group | " + " | ".join(f"{k}: mean MAE" for k in names) + " |")
    md.append("|---|" + "---|" * len(names))
    for g in dict.fromkeys(r["group"] for r in rows):
        sel = [r for r in rows if r["group"] == g]
        md.append(f"| {g} | " + " | ".join(f"{np.mean([r[k]['mae'] for r in sel]):.3f}" for k in names) + " |")
    md.append(f"\nCommand: `python -m bench.out_of_family --weights {' '.join(args.weights)}`; "
              f"{time.perf_counter() - t_start:.0f} s.")  # fmt: skip
    write_results("out_of_family", {"env": environment(), "rows": rows}, "\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
