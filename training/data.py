"""Training batches: random distributions, a window of ranks, fresh samples, true MI.

Each item is summarised exactly as the estimator sees it at run time (the
linear-binned histogram of the window's copula values under the configured tie
policy, via streamcorr.estimate.copula), plus the histogram of fresh samples of the same
distribution at their exact copula coordinates (true marginal CDFs; for a
quantised axis the CDF of the jittered variable, see training/tasks.py), on
which the DV objective is computed, and a ground-truth MI (exact, or Monte
Carlo over the fresh samples). Distributions come from training.tasks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamcorr.estimate.copula import Ties, check_ties, marginal_histograms, pair_histograms, rank_transform

from .tasks import TaskMix, sample_task


@dataclass(frozen=True)
class DataConfig(TaskMix):
    """A run's ``data`` section: the family probabilities (TaskMix, their one definition) and the windows."""

    grid: int = 32
    min_window: int = 32
    max_window: int = 8192
    n_fresh: int = 2048
    ties: Ties = "mid"  # tie policy of the window's rank transform

    def __post_init__(self) -> None:
        check_ties(self.ties)
        if self.p_quantised > 0 and self.ties != "jitter":
            msg = "data.p_quantised > 0 needs data.ties: jitter (fresh samples are drawn as jitter ranks them)"
            raise ValueError(msg)

    def task_mix(self) -> TaskMix:
        return TaskMix(**{k: getattr(self, k) for k in TaskMix.__dataclass_fields__})


def window_histograms(window: np.ndarray, grid: int, ties: Ties = "mid") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Joint (G, G) and marginal (G,), (G,) histograms of a window (T, 2), as at run time."""
    u = rank_transform(window.T, ties)  # (2, T)
    hist = pair_histograms(u[:1], u[1:], grid)[0]
    marg = marginal_histograms(u, grid)
    return hist, marg[0], marg[1]


def make_batch(rng: np.random.Generator, cfg: DataConfig, batch: int) -> dict[str, np.ndarray]:
    g = cfg.grid
    mix = cfg.task_mix()
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
        draw = sample_task(rng, mix, t, cfg.n_fresh)
        out["hist"][b], out["mx"][b], out["my"][b] = window_histograms(draw.window, g, cfg.ties)
        fresh = np.clip(draw.fresh, 0.0, 1.0).T.copy()
        out["fresh"][b] = pair_histograms(fresh[:1], fresh[1:], g)[0] / cfg.n_fresh
        out["mi"][b] = draw.mi
    return out
