"""A fixed held-out validation set (its own seed, never used for training batches)."""

from __future__ import annotations

import numpy as np

from streamcorr.estimate.copula import Ties

from .data import window_histograms
from .tasks import (
    Quantiser,
    bounded_noise_draw,
    gaussian_mi,
    gaussian_mixture,
    mc_mutual_information,
    quantised_draw,
    random_mixture,
)

VAL_SEED = 424242


def validation_set(
    grid: int, n_mixtures: int = 256, window_len: int = 2000, ties: Ties = "mid", n_quantised: int = 0
) -> dict[str, np.ndarray]:
    """Paper-generator mixtures, Gaussians up to rho = 0.99 and (n_quantised > 0, ties jitter)
    quantised mixtures and bounded-noise items, at T = window_len. ``family`` labels each item:
    0 mixture, 1 Gaussian, 2 quantised, 3 bounded noise."""
    rng = np.random.default_rng(VAL_SEED)
    hists, mxs, mys, mis, fams = [], [], [], [], []

    def add(window: np.ndarray, mi: float, family: int) -> None:
        h, mx, my = window_histograms(window, grid, ties)
        hists.append(h)
        mxs.append(mx)
        mys.append(my)
        mis.append(mi)
        fams.append(family)

    for _ in range(n_mixtures):
        gm = random_mixture(rng)
        add(gm.sample(window_len, rng), mc_mutual_information(gm, rng, n=20_000)[0], 0)
    for rho in np.linspace(-0.99, 0.99, 23):
        add(gaussian_mixture(rho).sample(window_len, rng), gaussian_mi(rho), 1)
    for i in range(n_quantised):
        levels = [int(rng.integers(3, 21)), int(rng.integers(3, 21))]
        if i % 2:
            levels[1] = 0
        d = quantised_draw(random_mixture(rng), Quantiser((levels[0], levels[1]), i % 4 < 2), rng, window_len, 20_000)
        add(d.window, d.mi, 2)
    for i in range(n_quantised // 4):
        d = bounded_noise_draw(["identity", "cube", "sine", "sqrt"][i % 4], 0.03 + 0.1 * (i // 4), rng, window_len, 0)
        add(d.window, d.mi, 3)
    return {
        "hist": np.stack(hists),
        "mx": np.stack(mxs),
        "my": np.stack(mys),
        "mi": np.asarray(mis, np.float32),
        "family": np.asarray(fams, np.int64),
    }
