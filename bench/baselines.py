"""Baseline MI estimators behind one interface: estimate(x, y) with x, y (P, T) -> (P,) nats.

KSG (scikit-learn), a Gaussian KDE plug-in, a binned plug-in and MINE, written
here in numpy / scikit-learn / torch so that no external estimator package is
needed. Each is what a user would otherwise pick; settings follow the paper.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


@dataclass
class KSG:
    """Kraskov-Stoegbauer-Grassberger via scikit-learn's mutual_info_regression."""

    k: int = 3

    @property
    def name(self) -> str:
        return f"KSG-{self.k}"

    def estimate(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        from sklearn.feature_selection import mutual_info_regression

        return np.array(
            [
                mutual_info_regression(a[:, None], b, n_neighbors=self.k, random_state=0)[0]
                for a, b in zip(x, y, strict=True)
            ]
        )


@dataclass
class KDE:
    """Resubstitution plug-in with Gaussian KDEs (Scott's bandwidth) of the joint and both marginals."""

    name: str = "KDE"

    def estimate(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        from scipy.stats import gaussian_kde

        out = []
        for a, b in zip(x, y, strict=True):
            xy = np.vstack([a, b])
            out.append(
                float(np.mean(np.log(gaussian_kde(xy)(xy)) - np.log(gaussian_kde(a)(a)) - np.log(gaussian_kde(b)(b))))
            )
        return np.array(out)


@dataclass
class Binned:
    """Plug-in MI of an equal-frequency (rank) histogram with about sqrt(T / 5) bins per axis."""

    name: str = "Binned"

    def estimate(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        out = []
        for a, b in zip(x, y, strict=True):
            t = a.shape[0]
            bins = max(2, int(np.sqrt(t / 5)))
            ia = np.argsort(np.argsort(a)) * bins // t
            ib = np.argsort(np.argsort(b)) * bins // t
            joint = np.zeros((bins, bins))
            np.add.at(joint, (ia, ib), 1.0)
            p = joint / t
            q = p.sum(1, keepdims=True) * p.sum(0, keepdims=True)
            m = p > 0
            out.append(float((p[m] * np.log(p[m] / q[m])).sum()))
        return np.array(out)


class _BatchedStatNets(nn.Module):
    """P independent statistics networks (2 -> h -> h -> 1, ReLU) evaluated with batched matmuls."""

    def __init__(self, n_nets: int, hidden: int, gen: torch.Generator) -> None:
        super().__init__()

        def layer(fan_in: int, fan_out: int) -> tuple[nn.Parameter, nn.Parameter]:
            bound = 1.0 / np.sqrt(fan_in)  # nn.Linear's default initialisation, per network
            w = (torch.rand(n_nets, fan_in, fan_out, generator=gen) * 2 - 1) * bound
            b = (torch.rand(n_nets, 1, fan_out, generator=gen) * 2 - 1) * bound
            return nn.Parameter(w), nn.Parameter(b)

        self.w1, self.b1 = layer(2, hidden)
        self.w2, self.b2 = layer(hidden, hidden)
        self.w3, self.b3 = layer(hidden, 1)

    def forward(self, xy: torch.Tensor) -> torch.Tensor:
        """xy (P, N, 2) -> (P, N)."""
        h = torch.relu(torch.baddbmm(self.b1, xy, self.w1))
        h = torch.relu(torch.baddbmm(self.b2, h, self.w2))
        return torch.baddbmm(self.b3, h, self.w3)[..., 0]


def _dv(net: _BatchedStatNets, joint: torch.Tensor, marg: torch.Tensor) -> torch.Tensor:
    """DV bound per network: (P,)."""
    return net(joint).mean(1) - (torch.logsumexp(net(marg), 1) - np.log(marg.shape[1]))


@dataclass
class MINE:
    """MINE (Belghazi et al.): a statistics network trained per pair on the DV bound.

    Paper setting: batch 100, lr 1e-3, `steps` Adam steps on standardised data; the
    estimate is the DV bound on the whole window with shuffled y for the marginals.
    Pairs are independent networks trained side by side with batched matmuls
    (same result as one at a time, far less Python overhead).
    """

    steps: int = 500
    batch: int = 100
    lr: float = 1e-3
    hidden: int = 100
    seed: int = 0

    @property
    def name(self) -> str:
        return f"MINE-{self.steps}"

    def estimate(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        gen = torch.Generator().manual_seed(self.seed)
        std = lambda v: (v - v.mean(1, keepdims=True)) / (v.std(1, keepdims=True) + 1e-12)  # noqa: E731
        xy = torch.tensor(np.stack([std(x), std(y)], -1), dtype=torch.float32)  # (P, T, 2)
        p, t = xy.shape[:2]
        net = _BatchedStatNets(p, self.hidden, gen)
        opt = torch.optim.Adam(net.parameters(), lr=self.lr)
        rows = torch.arange(p)[:, None]
        for _ in range(self.steps):
            i = torch.randint(0, t, (p, self.batch), generator=gen)
            j = torch.randint(0, t, (p, self.batch), generator=gen)
            joint = xy[rows, i]  # (P, B, 2)
            marg = torch.stack([xy[rows, i, 0], xy[rows, j, 1]], -1)
            loss = -_dv(net, joint, marg).sum()  # sum: each network gets its own gradient
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            perm = torch.stack([torch.randperm(t, generator=gen) for _ in range(p)])
            marg = torch.stack([xy[..., 0], xy[rows, perm, 1]], -1)
            return np.maximum(_dv(net, xy, marg).numpy().astype(np.float64), 0.0)


@dataclass
class InfoNetBaseline:
    """Our estimator, batched, behind the same interface."""

    name: str = "InfoNet"

    def __post_init__(self) -> None:
        from streamcorr import Estimator

        self._est = Estimator()

    def estimate(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return self._est.estimate_batch(x, y)
