"""Per-sample evidence from InfoNet's table: what the fast change path scores each new sample with.

The network maps a window's rank histogram to a table theta (G, G) on the copula square, and the MI estimate is
the Donsker-Varadhan bound (paper Eq. 1 and section 3): the mean of theta over the window's samples minus
log Z, where log Z = log E[exp theta] over the product of the window's marginals. So one sample (u, v) carries

    e(u, v) = theta(u, v) - log Z      (theta read bilinearly between the table's nodes, as the histogram bins)

whose mean over the window is the estimate. While a pair behaves as in the window the evidence of new samples
averages near the estimate (a little below it: the table was fitted on its own window); once the dependence
breaks it averages zero or less (Jensen), so a sequential test on it sees a decoupling within tens of samples.

>>> import numpy as np
>>> from streamcorr import Estimator
>>> from streamcorr.estimate.copula import rank_transform
>>> rng = np.random.default_rng(0)
>>> x = rng.standard_normal(1024)
>>> u = rank_transform(np.stack([x, x + 0.5 * rng.standard_normal(1024)]), "mid")
>>> theta, log_z, hist = pair_tables(Estimator(), u, np.array([0]), np.array([1]))
>>> e = evidence(theta, log_z, u[:1], u[1:])  # the window's own samples: their mean is the DV estimate
>>> bool(e.mean() > 0.7)
True
>>> bool(evidence(theta, log_z, u[:1], rng.permutation(u[1])[None]).mean() < 0)  # the same table, decoupled
True
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ..errors import InputError
from .copula import marginal_histograms, pair_histograms
from .estimator import Estimator

__all__ = ["change_point", "cusum_threshold", "evidence", "pair_tables", "window_moments"]


def pair_tables(
    est: Estimator, u: np.ndarray, iu: np.ndarray, iv: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tables theta (P, G, G), their log Z (P,) and the window's rank histograms (P, G, G) for pairs (iu[p], iv[p])
    of copula rows u (C, T): one network pass, as ``Estimator.estimate_ranks`` (without its high-MI refinement,
    which has no single table)."""
    u = np.ascontiguousarray(u, dtype=np.float64)
    if u.ndim != 2:
        raise InputError(f"u must be 2-D (C, T); got shape {u.shape}")
    g = est.grid
    if len(iu) == 0:
        return np.zeros((0, g, g), np.float32), np.zeros(0), np.zeros((0, g, g), np.float32)
    marg = marginal_histograms(u, g)  # (C, G)
    hist = pair_histograms(u, u, g, iu, iv)  # (P, G, G)
    _, theta = est._run(hist, marg[iu], marg[iv], tables=True)
    qx = marg[iu] / u.shape[1]  # (P, G) probability of each node
    qy = marg[iv] / u.shape[1]
    return theta, _log_z(theta.astype(np.float64), qx, qy), hist


def window_moments(theta: np.ndarray, log_z: np.ndarray, hist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance (P,) of the evidence over a window's samples from its rank histogram (P, G, G): exact for
    the mean (the DV estimate: the histogram is linear-binned, as the lookup), close for the variance."""
    n = hist.sum(axis=(1, 2))
    d = theta.astype(np.float64) - np.asarray(log_z)[:, None, None]
    mean = (hist * d).sum(axis=(1, 2)) / n
    return mean, np.maximum((hist * d * d).sum(axis=(1, 2)) / n - mean * mean, 0.0)


def _log_z(theta: np.ndarray, qx: np.ndarray, qy: np.ndarray) -> np.ndarray:
    """log sum_ij qx_i qy_j exp(theta_ij): (P,) for theta (P, G, G), qx, qy (P, G)."""
    top = theta.max(axis=(1, 2))  # (P,) for a stable exponent
    w = qx[:, :, None] * qy[:, None, :] * np.exp(theta - top[:, None, None])
    return np.log(np.maximum(w.sum(axis=(1, 2)), 1e-300)) + top


def evidence(theta: np.ndarray, log_z: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Evidence e (P, M) of samples (u[p, m], v[p, m]) in [0, 1] under pair p's table theta (P, G, G), log Z (P,).
    The tables are read as float32, as the network makes them; samples must be finite."""
    theta = np.asarray(theta)
    u, v = np.asarray(u, dtype=np.float64), np.asarray(v, dtype=np.float64)
    if theta.ndim != 3 or theta.shape[1] != theta.shape[2] or theta.shape[1] < 2:
        raise InputError(f"theta must be (P, G, G) with G >= 2; got shape {theta.shape}")
    if u.shape != v.shape or u.ndim != 2 or u.shape[0] != theta.shape[0]:
        raise InputError(f"u and v must both be (P, M) with P = {theta.shape[0]}; got {u.shape} and {v.shape}")
    if not (np.isfinite(u).all() and np.isfinite(v).all()):
        raise InputError("u and v must be finite copula values in [0, 1]; got NaN or infinity")
    log_z = np.asarray(log_z, dtype=np.float64)
    if log_z.shape not in ((), (theta.shape[0],)):
        raise InputError(f"log_z must be a scalar or ({theta.shape[0]},); got shape {log_z.shape}")
    log_z = np.array(np.broadcast_to(log_z, (theta.shape[0],)))  # a writable copy: one compiled signature
    return _evidence(np.ascontiguousarray(theta, dtype=np.float32), log_z, np.ascontiguousarray(u),
                     np.ascontiguousarray(v))  # fmt: skip


@njit(cache=True, parallel=True, nogil=True)
def _evidence(theta: np.ndarray, log_z: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """theta read bilinearly between its nodes (as the histogram bins) at each sample, minus log Z (paper Eq. 1)."""
    n_pairs, m = u.shape
    g = theta.shape[1] - 1
    out = np.empty((n_pairs, m))
    for p in prange(n_pairs):
        t = theta[p]
        for k in range(m):
            fu = min(max(u[p, k], 0.0), 1.0) * g
            fv = min(max(v[p, k], 0.0), 1.0) * g
            i = min(int(fu), g - 1)
            j = min(int(fv), g - 1)
            a, b = fu - i, fv - j
            out[p, k] = (t[i, j] * (1 - a) * (1 - b) + t[i + 1, j] * a * (1 - b)
                         + t[i, j + 1] * (1 - a) * b + t[i + 1, j + 1] * a * b) - log_z[p]  # fmt: skip
    return out


def change_point(e: np.ndarray, rising: bool) -> np.ndarray:
    """Index (P,) of the first sample after a shift in the mean of e (P, M): up (rising) or down. The classical
    estimate: where the cumulative sum of deviations from the overall mean is lowest (highest for a fall)."""
    c = np.cumsum(e - e.mean(axis=1, keepdims=True), axis=1)  # (P, M)
    at = np.argmin(c, axis=1) if rising else np.argmax(c, axis=1)
    return np.minimum(at + 1, e.shape[1] - 1)


def cusum_threshold(drift: float, long_run_var: float, arl_samples: float) -> float:
    """h for a CUSUM whose increments drift by -drift per sample with this long-run variance, so that it crosses
    h once in arl_samples on average (Brownian approximation: ARL = v / (2 d^2) (e^a - 1 - a), a = 2 d h / v)."""
    target = arl_samples * 2.0 * drift * drift / long_run_var
    a = math.log1p(target)
    for _ in range(20):  # fixed point of e^a = 1 + a + target
        a = math.log1p(a + target)
    return a * long_run_var / (2.0 * drift)
