"""A fixed held-out validation set (its own seed, never used for training batches)."""

from __future__ import annotations

import numpy as np

from .data import window_histograms
from .mixtures import GaussianMixture, gaussian_mi, mc_mutual_information, random_mixture

VAL_SEED = 424242


def validation_set(grid: int, n_mixtures: int = 256, window_len: int = 2000) -> dict[str, np.ndarray]:
    """Paper-generator mixtures plus Gaussians up to rho = 0.99, at T = window_len."""
    rng = np.random.default_rng(VAL_SEED)
    hists, mxs, mys, mis = [], [], [], []

    def add(gm: GaussianMixture, mi: float) -> None:
        h, mx, my = window_histograms(gm.sample(window_len, rng), grid)
        hists.append(h)
        mxs.append(mx)
        mys.append(my)
        mis.append(mi)

    for _ in range(n_mixtures):
        gm = random_mixture(rng)
        add(gm, mc_mutual_information(gm, rng, n=20_000)[0])
    for rho in np.linspace(-0.99, 0.99, 23):
        add(GaussianMixture(np.ones(1), np.zeros((1, 2)), np.array([[[1.0, rho], [rho, 1.0]]])), gaussian_mi(rho))
    return {
        "hist": np.stack(hists),
        "mx": np.stack(mxs),
        "my": np.stack(mys),
        "mi": np.asarray(mis, np.float32),
    }
