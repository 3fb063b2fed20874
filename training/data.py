"""Training batches: random distributions, a window of ranks, fresh samples, true MI.

Each item is summarised exactly as the estimator sees it at run time (the
linear-binned histogram of the window's mid-ranks, via streamcorr.copula), plus
the histogram of fresh samples of the same distribution at their exact copula
coordinates (true marginal CDFs), on which the DV objective is computed, and a
ground-truth MI (analytic, or Monte-Carlo over the fresh samples).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from streamcorr.copula import marginal_histograms, pair_histograms, rank_transform

from .mixtures import random_mixture


@dataclass(frozen=True)
class DataConfig:
    grid: int = 32
    min_window: int = 32
    max_window: int = 8192
    n_fresh: int = 2048
    k_max: int = 20
    p_independent: float = 0.10  # the paper's generator almost never gives MI < 0.05
    p_gaussian: float = 0.15  # single Gaussians with MI uniform in [0, max_gaussian_mi]
    max_gaussian_mi: float = 2.5


def _gaussian_item(rng: np.random.Generator, cfg: DataConfig, t: int) -> tuple[np.ndarray, np.ndarray, float]:
    mi = rng.uniform(0.0, cfg.max_gaussian_mi)
    rho = np.sqrt(1.0 - np.exp(-2.0 * mi)) * rng.choice([-1.0, 1.0])
    cov = np.array([[1.0, rho], [rho, 1.0]])
    z = rng.multivariate_normal(np.zeros(2), cov, size=t + cfg.n_fresh)
    return z[:t], ndtr(z[t:]), float(mi)


def make_item(rng: np.random.Generator, cfg: DataConfig, t: int) -> tuple[np.ndarray, np.ndarray, float]:
    """One distribution: window samples (t, 2), fresh copula coordinates (n_fresh, 2), MI."""
    r = rng.uniform()
    if r < cfg.p_gaussian:
        return _gaussian_item(rng, cfg, t)
    gm = random_mixture(rng, dim=2, k_max=cfg.k_max)
    z = gm.sample(t + cfg.n_fresh, rng)
    window, fresh = z[:t], z[t:]
    uv = np.stack([gm.cdf1d(fresh[:, 0], 0), gm.cdf1d(fresh[:, 1], 1)], axis=1)
    if r < cfg.p_gaussian + cfg.p_independent:
        window[:, 1] = rng.permutation(window[:, 1])
        uv[:, 1] = rng.permutation(uv[:, 1])
        return window, uv, 0.0
    return window, uv, float(gm.pointwise_pmi(fresh, (0,), (1,)).mean())


def window_histograms(window: np.ndarray, grid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Joint (G, G) and marginal (G,), (G,) histograms of a window (T, 2), as at run time."""
    u = rank_transform(window.T)  # (2, T)
    hist = pair_histograms(u[:1], u[1:], grid)[0]
    marg = marginal_histograms(u, grid)
    return hist, marg[0], marg[1]


def make_batch(rng: np.random.Generator, cfg: DataConfig, batch: int) -> dict[str, np.ndarray]:
    g = cfg.grid
    out = {
        "hist": np.empty((batch, g, g), np.float32),
        "mx": np.empty((batch, g), np.float32),
        "my": np.empty((batch, g), np.float32),
        "fresh": np.empty((batch, g, g), np.float32),
        "mi": np.empty(batch, np.float32),
    }
    lo, hi = np.log(cfg.min_window), np.log(cfg.max_window)
    for b in range(batch):
        t = int(np.exp(rng.uniform(lo, hi)))
        window, uv, mi = make_item(rng, cfg, t)
        out["hist"][b], out["mx"][b], out["my"][b] = window_histograms(window, g)
        fresh = np.clip(uv, 0.0, 1.0).T.copy()
        out["fresh"][b] = pair_histograms(fresh[:1], fresh[1:], g)[0] / cfg.n_fresh
        out["mi"][b] = mi
    return out
