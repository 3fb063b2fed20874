"""A pair's newest rows: the fast path's short windows (:mod:`streamcorr.engine.fast`) and change onsets.

A short window is a pair's newest m rows of the hop's window where at least one of its channels has a new sample
(rows both repeat leave the pair, as in the window's estimate), ranked anew. A smooth channel's rows can be replaced
by their innovations (residuals of an AR fit over those rows, :func:`streamcorr.estimate.significance.prewhiten`):
what is new at each sample, nearly one effective sample per row where the levels hold a few dozen in a few hundred.

A relation that turns (y = x^2, |x|, sin 2x) moves y's innovations with x's, with a sign (the local slope's) that
flips where x crosses a turn: the innovations alone then show little. Within a narrow range of x's level the sign
holds, so x's level (the one before each sample) is cut at its quartiles (``FOLD_BINS`` bins) and the innovations
are correlated within each: the bins' correlations together (a chi-square with one degree per bin) test for a
slope of any sign pattern, and each bin's sign *folds* x's innovations (multiplies them by it), which leaves a
monotone relation. A fold depends on the other channel only through its signs, fixed before it is applied; on
independent channels the bins' correlations are noise, so the test holds its rate (bench.fold_tail measures its
tail).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from scipy.stats import chi2, norm

from ..estimate.copula import rank_transform
from ..estimate.estimator import Estimator
from ..estimate.evidence import change_point, evidence, pair_tables
from ..estimate.significance import autocorrelation, pair_n_eff, pair_rows, prewhiten
from .changes import ChangeEvent
from .settings import FOLDS

__all__ = ["FOLDS", "FOLD_BINS", "MIN_BIN", "ONSET_SPAN", "Fold", "fold_bins", "folded", "innovation_estimates",
           "innovation_tests", "local_slopes", "newest_rows", "onsets", "short_estimates", "window_onsets"]  # fmt: skip

ONSET_SPAN = 1024  # rows the onset of a new dependence is searched over
FOLD_BINS = 4  # ranges of a channel's level a fold sets a sign in: its quartiles hold a turn of x^2 or sin 2x each
MIN_BIN = 8  # rows a bin needs for its correlation to count (a quantised level can leave a bin nearly empty)


class Fold(NamedTuple):
    """How rows (R) of innovations are folded: the levels between bins (R, FOLD_BINS - 1) and each bin's sign
    (R, FOLD_BINS). All signs +1: not folded."""

    edges: np.ndarray
    signs: np.ndarray

    @classmethod
    def none(cls, rows: int) -> Fold:
        return cls(np.zeros((rows, FOLD_BINS - 1)), np.ones((rows, FOLD_BINS)))

    @classmethod
    def of_pairs(cls, folds: list[Fold]) -> Fold:
        """The fold of 2P rows (x rows, then y rows) from P pairs' folds of 2 rows (x, y) each."""
        p = len(folds)
        return cls(*(np.stack([f[i] for f in folds], axis=1).reshape(2 * p, -1) for i in (0, 1)))


def fold_bins(levels: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The bin (R, m) of each row's innovation, by the level before it (levels (R, m); the first row's own): an
    innovation is independent of the past, so on an independent pair it stays noise within every bin (binned by
    its own level, it would follow the level, and through it any slow trend the other channel shares)."""
    return bins_of(np.concatenate([levels[:, :1], levels[:, :-1]], axis=1), edges)


def bins_of(prior: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The bin (..., m) of each level in prior (..., m) between edges (..., FOLD_BINS - 1)."""
    return (prior[..., None] > edges[..., None, :]).sum(axis=-1)


def folded(e: np.ndarray, levels: np.ndarray, fold: Fold) -> np.ndarray:
    """Innovations e (R, m) folded by the bins of their levels (R, m, :func:`fold_bins`): each times its bin's sign."""
    return np.take_along_axis(fold.signs, fold_bins(levels, fold.edges), axis=1) * e


def local_slopes(levels: np.ndarray, a: np.ndarray, b: np.ndarray, share: np.ndarray) -> tuple[Fold, np.ndarray]:
    """The fold of innovations a (R, m) (of channels at levels (R, m)) that follows b (R, m) most closely: bins at
    the level's quartiles, each with the sign of a's correlation with b there; and its z-score (R,), the chi-square
    of the bins' correlations (each squared times its rows times ``share``, effective samples per row) mapped to
    the normal quantile of the same two-sided tail, so that it reads as |N(0, 1)| on independent channels."""
    edges = np.quantile(levels, np.arange(1, FOLD_BINS) / FOLD_BINS, axis=1).T  # (R, B - 1)
    bins = fold_bins(levels, edges)  # (R, m)
    r = np.zeros((len(a), FOLD_BINS))
    count = np.zeros((len(a), FOLD_BINS))
    for k in range(FOLD_BINS):
        w = bins == k
        count[:, k] = w.sum(axis=1)
        n_k = np.maximum(count[:, k], 1.0)[:, None]
        da = np.where(w, a - (a * w).sum(axis=1, keepdims=True) / n_k, 0.0)
        db = np.where(w, b - (b * w).sum(axis=1, keepdims=True) / n_k, 0.0)
        den = np.sqrt((da * da).sum(axis=1) * (db * db).sum(axis=1))
        r[:, k] = np.where(den > 1e-12, (da * db).sum(axis=1) / np.maximum(den, 1e-12), 0.0)
    r[count < MIN_BIN] = 0.0
    q = (r * r * count).sum(axis=1) * share
    z = norm.isf(chi2.sf(q, FOLD_BINS) / 2.0)
    return Fold(edges, np.where(r < 0.0, -1.0, 1.0)), z


def newest_rows(
    window: np.ndarray, fresh: np.ndarray, pairs: np.ndarray, m: int, before: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Values (2P, m) of pairs (P, 2) on their newest m rows of the window where the slower channel has a new
    sample (``pair_rows``, as in the window's estimate; x rows then y rows), their positions in the window (P, m),
    and which pairs have m such rows (P,). With ``before`` (P,): the newest m rows before that position."""
    n = window.shape[1]
    keep = pair_rows(fresh[pairs[:, 0]], fresh[pairs[:, 1]])  # (P, N)
    if before is not None:
        keep &= np.arange(n)[None, :] < before[:, None]
    enough = keep.sum(axis=1) >= m
    pos = np.zeros((len(pairs), m), dtype=np.int64)
    for q in np.flatnonzero(enough):
        pos[q] = np.flatnonzero(keep[q])[-m:]
    pos[~enough] = np.arange(n - m, n)
    x = np.take_along_axis(window[pairs[:, 0]], pos, axis=1)  # (P, m)
    y = np.take_along_axis(window[pairs[:, 1]], pos, axis=1)
    return np.concatenate([x, y]), pos, enough


def short_estimates(
    est: Estimator, window: np.ndarray, fresh: np.ndarray, pairs: np.ndarray, m: int, innovations: bool = False,
    before: np.ndarray | None = None, fold: Fold | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """MI and effective size (P,) of pairs (P, 2) on their newest m rows (:func:`newest_rows`), ranked anew; also the
    ranks (2, P, m) and the rows' positions in the window (P, m). NaN where a pair has fewer such rows. With
    ``innovations``, each row is first replaced by its innovations over those m rows (an AR fit); ``fold`` (2P rows:
    x rows, then y rows): how each row's innovations are folded."""
    xy, pos, enough = newest_rows(window, fresh, pairs, m, before)
    rows, at = np.unique(xy, axis=0, return_inverse=True)  # a channel's rows recur in each of its pairs: once each
    at = at.reshape(-1)
    if innovations:
        rows = prewhiten(rows)
    if fold is not None and (fold.signs < 0).any():  # a channel may be folded in one pair and not another
        rows, at = folded(rows[at], xy, fold), np.arange(len(at))
    ranks = rank_transform(np.ascontiguousarray(rows), est.ties)
    u = ranks[at]  # (2P, m)
    p = np.arange(len(pairs))
    mi = est.estimate_ranks(u, p, p + len(pairs))
    acf = autocorrelation(ranks)[at]
    ne = pair_n_eff(acf[p], acf[p + len(pairs)], m)
    mi[~enough] = np.nan
    return mi, ne, u.reshape(2, len(pairs), m), pos


def innovation_estimates(
    est: Estimator, window: np.ndarray, fresh: np.ndarray, pairs: np.ndarray, m: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """On the innovations of pairs' (P, 2) newest m rows (:func:`newest_rows`): the MI and effective size (P,) of x's
    and y's, and the folds' z-scores (P, 2), of x's bins against y and of y's bins against x
    (:func:`local_slopes`, without the network). NaN where a pair has fewer such rows."""
    xy, _, enough = newest_rows(window, fresh, pairs, m)
    levels, at = np.unique(xy, axis=0, return_inverse=True)  # a channel's rows recur in each of its pairs: once each
    at = at.reshape(-1)
    ranks = rank_transform(np.ascontiguousarray(prewhiten(levels)), est.ties)  # (R, m)
    n = len(pairs)
    x, y = at[:n], at[n:]
    mi = est.estimate_ranks(ranks, x, y)
    acf = autocorrelation(ranks)
    ne = pair_n_eff(acf[x], acf[y], m)
    # (2P,): x's bins against y's innovations, then y's bins against x's
    own, other = np.concatenate([x, y]), np.concatenate([y, x])
    _, fold_z = local_slopes(levels[own], ranks[own], ranks[other], np.tile(ne, 2) / m)
    mi[~enough] = np.nan
    fold_z = fold_z.reshape(2, n).T
    fold_z[~enough] = np.nan
    return mi, ne, fold_z


def innovation_tests(
    est: Estimator, window: np.ndarray, fresh: np.ndarray, pairs: np.ndarray, lengths: tuple[int, ...],
    threshold: Callable[[int, np.ndarray], np.ndarray], fold_z: Callable[[int], float],
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The shortest of ``lengths`` (P,) at which each pair's innovations on its newest rows show dependence, or 0,
    and which entry of ``FOLDS`` showed it (P,; -1: none): the MI of the plain innovations above
    ``threshold(length, n_eff)``, or a fold's z-score above ``fold_z(length)`` (:func:`innovation_estimates`).
    Tried shortest first; a pair seen at one length is not tried at the next. Each bar is for its own comparison
    (a rate shared is the caller's)."""
    seen = np.zeros(len(pairs), dtype=np.int64)
    which = np.full(len(pairs), -1, dtype=np.int64)
    for m in lengths:
        todo = np.flatnonzero(seen == 0)
        if not len(todo):
            break
        mi, ne, fz = innovation_estimates(est, window, fresh, pairs[todo], m)
        with np.errstate(invalid="ignore"):
            above = np.column_stack([mi > threshold(m, ne), fz > fold_z(m)])  # (T, 3), as FOLDS
        hit = above.any(axis=1)
        seen[todo[hit]] = m
        which[todo[hit]] = np.argmax(above[hit], axis=1)
    return seen, which


def onsets(
    est: Estimator, window: np.ndarray, fresh: np.ndarray, pairs: np.ndarray, shown_by: np.ndarray, m: int
) -> np.ndarray:
    """Window positions (P,) where each new dependence of pairs (P, 2) began: the change point of the evidence
    over their newest ``ONSET_SPAN`` rows under the table of the newest m, of what showed it (``shown_by`` (P,):
    -1 the levels, else the entry of ``FOLDS``, innovations folded as the newest m rows show). The span reaches
    back before the short window, which a smooth pair's change has often left by the time it is seen."""
    span = min(window.shape[1], max(m, ONSET_SPAN))
    xy, pos, _ = newest_rows(window, fresh, pairs, span)
    white = np.concatenate([shown_by >= 0, shown_by >= 0])
    if white.any():
        levels = xy.copy()
        xy[white] = prewhiten(xy[white])
        n = len(pairs)
        own = np.concatenate([np.flatnonzero(shown_by == 1), np.flatnonzero(shown_by == 2) + n])  # rows folded
        if len(own):  # by the signs of the newest m rows, as in the test that showed it
            other = np.where(own < n, own + n, own - n)
            r = rank_transform(np.ascontiguousarray(xy[np.concatenate([own, other]), -m:]), est.ties)
            fold, _ = local_slopes(levels[own, -m:], r[: len(own)], r[len(own) :], np.ones(len(own)))
            xy[own] = folded(xy[own], levels[own], fold)
    u = rank_transform(np.ascontiguousarray(xy), est.ties)  # (2P, span)
    p = np.arange(len(pairs))
    # the table from the newest m rows ranked among themselves (the network takes a sample of the copula)
    newest = rank_transform(np.ascontiguousarray(xy[:, -m:]), est.ties)
    theta, log_z, _ = pair_tables(est, newest, p, p + len(pairs))
    e = evidence(theta, log_z, u[p], u[p + len(pairs)])  # (P, span)
    return pos[p, change_point(e, rising=True)]


def window_onsets(
    est: Estimator, events: list[ChangeEvent], u: np.ndarray, names: list[str], period_ns: int
) -> list[ChangeEvent]:
    """The window path's events with their onsets: the change point of the pair's evidence over the window, under
    the window's own table (u (C, N): the hop's ranks). A pair's first verdict (``initial``) has none."""
    index = {name: k for k, name in enumerate(names)}
    todo = [k for k, ev in enumerate(events) if not ev.initial]
    if not todo:
        return events
    iu = np.array([index[events[k].pair[0]] for k in todo])
    iv = np.array([index[events[k].pair[1]] for k in todo])
    theta, log_z, _ = pair_tables(est, u, iu, iv)
    e = evidence(theta, log_z, u[iu], u[iv])  # (E, N)
    rising = np.array([events[k].kind in ("became-dependent", "rise") for k in todo])
    at = np.where(rising, change_point(e, True), change_point(e, False))
    out = list(events)
    for q, k in enumerate(todo):
        onset = int(events[k].t_ns - (u.shape[1] - 1 - at[q]) * period_ns)
        out[k] = dataclasses.replace(events[k], onset_t_ns=onset)
    return out
