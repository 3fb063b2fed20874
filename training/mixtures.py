"""Random Gaussian mixtures (the paper's generator) with exact densities.

The generator follows Sec. 4 of the InfoNet paper: K uniform in 1..k_max,
weights summing to one, means uniform in [-5, 5], covariance D D^T + 0.01 I with
D entries uniform in [-3, 3]. Mixtures are d-dimensional so that triplets
(x, y, y') for the order-accuracy protocol come from one joint distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr


@dataclass(frozen=True)
class GaussianMixture:
    weights: np.ndarray  # (K,)
    means: np.ndarray  # (K, d)
    covs: np.ndarray  # (K, d, d)

    @property
    def dim(self) -> int:
        return int(self.means.shape[1])

    def marginal(self, dims: tuple[int, ...]) -> GaussianMixture:
        idx = np.asarray(dims)
        return GaussianMixture(self.weights, self.means[:, idx], self.covs[:, idx][:, :, idx])

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        comp = rng.choice(self.weights.shape[0], size=n, p=self.weights)
        chol = np.linalg.cholesky(self.covs)  # (K, d, d)
        z = rng.standard_normal((n, self.dim))
        return self.means[comp] + np.einsum("nij,nj->ni", chol[comp], z)

    def logpdf(self, x: np.ndarray) -> np.ndarray:
        """Exact log-density at x (n, d)."""
        d = self.dim
        prec = np.linalg.inv(self.covs)  # (K, d, d)
        _, logdet = np.linalg.slogdet(self.covs)  # (K,)
        diff = x[None, :, :] - self.means[:, None, :]  # (K, n, d)
        maha = np.einsum("kni,kij,knj->kn", diff, prec, diff)
        comp = -0.5 * (maha + logdet[:, None] + d * np.log(2 * np.pi))
        comp += np.log(self.weights)[:, None]
        top = comp.max(axis=0)
        return top + np.log(np.exp(comp - top).sum(axis=0))

    def cdf1d(self, x: np.ndarray, dim: int) -> np.ndarray:
        """Exact marginal CDF of coordinate ``dim`` at x (n,)."""
        sd = np.sqrt(self.covs[:, dim, dim])
        return (self.weights[:, None] * ndtr((x[None, :] - self.means[:, dim, None]) / sd[:, None])).sum(0)

    def pointwise_pmi(self, z: np.ndarray, a: tuple[int, ...], b: tuple[int, ...]) -> np.ndarray:
        """log p(x_a, x_b) - log p(x_a) - log p(x_b) at samples z (n, d)."""
        ab = a + b
        joint = self.marginal(ab).logpdf(z[:, ab])
        return joint - self.marginal(a).logpdf(z[:, a]) - self.marginal(b).logpdf(z[:, b])


def random_mixture(rng: np.random.Generator, dim: int = 2, k_max: int = 20, k: int | None = None) -> GaussianMixture:
    k = int(rng.integers(1, k_max + 1)) if k is None else k
    weights = rng.uniform(0.0, 1.0, size=k) + 1e-3
    weights /= weights.sum()
    means = rng.uniform(-5.0, 5.0, size=(k, dim))
    dmat = rng.uniform(-3.0, 3.0, size=(k, dim, dim))
    covs = dmat @ dmat.transpose(0, 2, 1) + 0.01 * np.eye(dim)
    return GaussianMixture(weights, means, covs)


def mc_mutual_information(
    gm: GaussianMixture,
    rng: np.random.Generator,
    n: int = 100_000,
    a: tuple[int, ...] = (0,),
    b: tuple[int, ...] = (1,),
) -> tuple[float, float]:
    """Monte-Carlo MI (nats) between coordinates a and b, and its standard error."""
    z = gm.sample(n, rng)
    pmi = gm.pointwise_pmi(z, a, b)
    return float(pmi.mean()), float(pmi.std(ddof=1) / np.sqrt(n))


def gaussian_mi(rho: float) -> float:
    return float(-0.5 * np.log1p(-rho * rho))
