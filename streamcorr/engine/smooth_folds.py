"""A smooth pair's innovations over its whole window: dependence its levels cannot show at the false-alarm rate.

A smooth pair's window holds few independent samples (its effective size), so the null of its levels is wide: a
relation of two slow signals can read 0.6 nats and stay inside it. Its innovations (each channel's residuals of an
AR fit over the pair's rows, what is new at each sample) hold nearly one independent sample per row, and a relation
moves them together with the local slope's sign: the folds of
:func:`streamcorr.engine.short_windows.local_slopes` (x's level cut at its quartiles, the innovations correlated
within each bin; then the same with y's level) score that without the network.
:class:`streamcorr.engine.mixed_rows.MixedRows` runs this test on pairs whose effective size is below
``WHITE_FROM`` of their rows, at half the pair's false-alarm rate (the levels keep the other half), both folds
sharing it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.stats import chi2, norm

from ..estimate.copula import rank_transform
from ..estimate.significance import autocorrelation, pair_n_eff, pair_rows, prewhiten
from .short_windows import FOLD_BINS, MIN_BIN, fold_bins

__all__ = ["FOLD_HOLD", "MIN_ROWS", "bin_chi2", "fold_bar", "fold_scores"]

MIN_ROWS = 64  # fewer rows leave a quartile bin too few for its correlation to count
# the larger of the two folds' z on an independent pair stays below this 99 evaluations in 100: a dependent pair whose
# folds are above it stays dependent (wider than the levels' 90th percentile: a weak fold lingers after a decoupling)
FOLD_HOLD = float(norm.isf((1 - 0.99**0.5) / 2))


def fold_bar(alpha: float) -> float:
    """The z-score above which either fold shows dependence at rate ``alpha`` for both (two-sided, each half)."""
    return float(norm.isf(alpha / 4))


def fold_scores(est: Any, window: np.ndarray, fresh: np.ndarray, valid: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """The larger z-score (P,) of the two folds of pairs (P, 2) on their rows of the window (C, N): the ticks where
    the slower channel has a new sample and both are valid (``pair_rows``). NaN for pairs with fewer than
    ``MIN_ROWS`` rows. On independent channels each fold reads as |N(0, 1)| (bench.fold_tail measures the tail).

    Pairs on the same rows (channels on one clock, fields of one device) share each channel's innovations, ranks
    and bins; the bins' sums for all of them come from one matrix product per bin."""
    z = np.full(len(pairs), np.nan)
    x, y = pairs[:, 0], pairs[:, 1]
    keep = pair_rows(fresh[x], fresh[y]) & valid[x] & valid[y]  # (P, N)
    groups: dict[bytes, list[int]] = {}
    for k in np.flatnonzero(keep.sum(axis=1) >= MIN_ROWS).tolist():
        groups.setdefault(np.packbits(keep[k]).tobytes(), []).append(k)
    for members in groups.values():
        ks = np.array(members)
        chans = np.unique(pairs[ks])  # (U,)
        levels = window[chans][:, keep[ks[0]]]  # (U, m)
        m = levels.shape[1]
        ranks = rank_transform(np.ascontiguousarray(prewhiten(levels)), est.ties)  # (U, m)
        a, b = np.searchsorted(chans, x[ks]), np.searchsorted(chans, y[ks])
        acf = autocorrelation(ranks)
        share = pair_n_eff(acf[a], acf[b], m) / m  # independent samples per row of the innovations
        q = bin_chi2(levels, ranks)  # (U, U)
        z[ks] = norm.isf(chi2.sf(np.maximum(q[a, b], q[b, a]) * share, FOLD_BINS) / 2)
    return z


def bin_chi2(levels: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """(U, U): for channel c's level bins (:func:`streamcorr.engine.short_windows.fold_bins`, at its quartiles) and
    channel d's innovations, the sum over bins of the squared correlation of c's and d's innovations (ranks (U, m))
    times the bin's rows: ``local_slopes``' chi-square before the share of effective samples."""
    edges = np.quantile(levels, np.arange(1, FOLD_BINS) / FOLD_BINS, axis=1).T  # (U, B - 1)
    bins = fold_bins(levels, edges)  # (U, m)
    sq = ranks * ranks
    q = np.zeros((len(ranks), len(ranks)))
    for k in range(FOLD_BINS):
        w = (bins == k).astype(np.float64)  # (U, m): c's rows in bin k
        n = w.sum(axis=1)[:, None]  # (U, 1)
        nn = np.maximum(n, 1.0)
        sa, saa = (w * ranks).sum(axis=1)[:, None], (w * sq).sum(axis=1)[:, None]  # c's own, (U, 1)
        sb, sbb, sab = w @ ranks.T, w @ sq.T, (w * ranks) @ ranks.T  # d's within c's bin, (U, U)
        den = np.sqrt(np.maximum(saa - sa * sa / nn, 0.0) * np.maximum(sbb - sb * sb / nn, 0.0))
        r = np.where(den > 1e-12, (sab - sa * sb / nn) / np.maximum(den, 1e-12), 0.0)
        q += np.where(n >= MIN_BIN, r * r * n, 0.0)
    return q
