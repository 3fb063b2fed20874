"""High-MI refinement: the chain rule of MI over quantile slabs (models/README.md, "High MI").

A G-node table cannot resolve a copula sharper than its node spacing (the plug-in ceiling), so the estimator
refines estimates above ``REFINE_FROM_NATS`` (fully from ``REFINE_FULL_NATS``, linearly blended between) with

    I(U; V) = I(S; V) + mean_k I(U; V | S = k),    S = the quantile slab of U, P(S = k) = 1 / slabs,

which is exact. Inside a slab the copula is stretched by the slab count, so the same network resolves it; S is
discrete, and the jittered-ties rank transform reads I(S; V) exactly. U is the pair's more informative axis
(``slab_information``): the conditional slabs carry the table's resolution error, so the less MI is left to
them the better. Every row is read rising (v reflected where its rank correlation with u is negative), so a
falling pair gets the rising pair's estimate. Below 1.5 nats the table resolves what the selection set holds;
slabs shorter than ``REFINE_SLAB_LEN`` samples overestimate their small conditional MI. Pure numpy and Numba;
the network runs in the estimator.
"""

from __future__ import annotations

import numpy as np

from .copula import Ties, marginal_histograms, pair_histograms, quantile_slabs, rank_transform

__all__ = ["REFINE_FROM_NATS", "REFINE_FULL_NATS", "chain_histograms", "chain_mi", "refine_slabs",
           "refine_weight", "slab_information"]  # fmt: skip

REFINE_FROM_NATS = 1.5
REFINE_FULL_NATS = 1.8
REFINE_SLAB_LEN = 256
REFINE_MAX_SLABS = 4


def refine_slabs(window_len: int) -> int:
    """Slabs of the refinement for windows of this many samples; 1 means none.

    >>> [refine_slabs(t) for t in (256, 512, 1024, 2000, 8192)]
    [1, 2, 4, 4, 4]
    """
    return max(1, min(REFINE_MAX_SLABS, window_len // REFINE_SLAB_LEN))


def refine_weight(mi: np.ndarray) -> np.ndarray:
    """Share of the refined estimate in the output, per table estimate (nats): 0 below 1.5, 1 from 1.8.

    >>> refine_weight(np.array([1.0, 1.65, 2.0])).round(3).tolist()
    [0.0, 0.5, 1.0]
    """
    return np.clip((mi - REFINE_FROM_NATS) / (REFINE_FULL_NATS - REFINE_FROM_NATS), 0.0, 1.0)


def slab_information(u: np.ndarray, v: np.ndarray, slabs: int, bins: int = 16) -> np.ndarray:
    """Plug-in MI (nats) between u's quantile slab and v in ``bins`` equal bins, per row of u, v (P, T): (P,).

    A cheap proxy for I(S; V), used only to compare the two ways of cutting one pair.

    >>> u = (np.arange(8) + 0.5) / 8
    >>> slab_information(u[None], u[None], 2).round(3)  # v's bin tells u's half: log 2
    array([0.693])
    >>> slab_information(u[None], np.full((1, 8), 0.5), 2).round(3)  # v constant: nothing
    array([0.])
    """
    p, t = u.shape
    s = np.minimum((u * slabs).astype(np.int64), slabs - 1)
    b = np.minimum((v * bins).astype(np.int64), bins - 1)
    cells = np.arange(p)[:, None] * (slabs * bins) + s * bins + b
    joint = np.bincount(cells.ravel(), minlength=p * slabs * bins).reshape(p, slabs, bins) / t
    outer = joint.sum(axis=2, keepdims=True) * joint.sum(axis=1, keepdims=True)
    ratio = np.divide(joint, outer, out=np.ones_like(joint), where=joint > 0)
    return (joint * np.log(ratio)).sum(axis=(1, 2))


def _orient(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """b (P, n), reflected (1 - b) in the rows where its rank correlation with a is negative: MI is unchanged,
    and the network, which is not exactly reflection-invariant, always reads the rising orientation."""
    rising = ((a - 0.5) * (b - 0.5)).sum(axis=1, keepdims=True) >= 0
    return np.where(rising, b, 1.0 - b)


def chain_histograms(
    u: np.ndarray, v: np.ndarray, slabs: int, grid: int, ties: Ties
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The network inputs of the chain rule for copula rows u, v (P, T), each pair cut along its more
    informative axis: hist (P * (1 + slabs), G, G), mx, my (P * (1 + slabs), G); rows [I(S; V) of pair p (P),
    then slab k of pair p at P + p * slabs + k]. The choice of axis is symmetric in u and v."""
    swap = (slab_information(v, u, slabs) > slab_information(u, v, slabs))[:, None]
    u, v = np.where(swap, v, u), np.where(swap, u, v)
    s, su, sv = quantile_slabs(u, v, slabs)
    s = rank_transform(s, "jitter")  # S is discrete: jitter inside each slab keeps I(S; V) exact
    if ties == "jitter":  # u has no ties, and each slab holds its u in order: its ranks are 0..n-1
        n = su.shape[1]
        su = np.broadcast_to((np.arange(n) + 0.5) / n, su.shape)
    else:
        su = rank_transform(su, ties)
    sv = rank_transform(sv, ties)
    v, sv = _orient(s, v), _orient(su, sv)
    hist = np.concatenate([pair_histograms(s, v, grid), pair_histograms(su, sv, grid)])
    mx = np.concatenate([marginal_histograms(s, grid), marginal_histograms(su, grid)])
    my = np.concatenate([marginal_histograms(v, grid), marginal_histograms(sv, grid)])
    return hist, mx, my


def chain_mi(est: np.ndarray, slabs: int) -> np.ndarray:
    """I(S; V) + mean_k I(U; V | S = k) (P,) from the network's estimates of chain_histograms' rows."""
    p = est.shape[0] // (1 + slabs)
    est = est.astype(np.float64)
    return est[:p] + est[p:].reshape(p, slabs).mean(axis=1)
