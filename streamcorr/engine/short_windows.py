"""A pair's newest rows: the fast path's short windows (:mod:`streamcorr.engine.fast`) and change onsets.

A short window is a pair's newest m rows of the hop's window where at least one of its channels has a new sample
(rows both repeat leave the pair, as in the window's estimate), ranked anew. A smooth channel's rows can be replaced
by their innovations (residuals of an AR fit over those rows, :func:`streamcorr.estimate.significance.prewhiten`):
what is new at each sample, nearly one effective sample per row where the levels hold a few dozen in a few hundred.

A relation that folds (y = x^2, |x|) moves y's innovations with x's, with a sign that flips where x crosses the fold:
the innovations alone then show little. Each channel's innovations *folded* at its median, sign(x - median) times
its innovations, undo that for a fold near the median, and leave a monotone relation a rank correlation tests.
A channel's folded innovations are still a function of that channel alone, so an independent pair stays
independent under them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from ..estimate.copula import rank_transform
from ..estimate.estimator import Estimator
from ..estimate.evidence import change_point, evidence, pair_tables
from ..estimate.significance import autocorrelation, pair_n_eff, prewhiten
from .changes import ChangeEvent
from .settings import FOLDS

__all__ = ["FOLDS", "ONSET_SPAN", "folded", "innovation_estimates", "innovation_tests", "newest_rows", "onsets",
           "short_estimates", "window_onsets"]  # fmt: skip

ONSET_SPAN = 1024  # rows the onset of a new dependence is searched over


def newest_rows(
    window: np.ndarray, fresh: np.ndarray, pairs: np.ndarray, m: int, before: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Values (2P, m) of pairs (P, 2) on their newest m rows of the window where at least one channel has a new
    sample (rows both repeat leave the pair, as in the window's estimate; x rows then y rows), their positions
    in the window (P, m), and which pairs have m such rows (P,). With ``before`` (P,): the newest m rows before
    that position of the window."""
    n = window.shape[1]
    keep = fresh[pairs[:, 0]] | fresh[pairs[:, 1]]  # (P, N)
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
    before: np.ndarray | None = None, fold_at: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """MI and effective size (P,) of pairs (P, 2) on their newest m rows (:func:`newest_rows`), ranked anew; also the
    ranks (2, P, m) and the rows' positions in the window (P, m). NaN where a pair has fewer such rows. With
    ``innovations``, each row is first replaced by its innovations over those m rows (an AR fit); ``fold_at`` (2P,):
    the level at which each row's innovations (x rows, then y rows) are folded (NaN: not folded)."""
    xy, pos, enough = newest_rows(window, fresh, pairs, m, before)
    rows, at = np.unique(xy, axis=0, return_inverse=True)  # a channel's rows recur in each of its pairs: once each
    at = at.reshape(-1)
    if innovations:
        rows = prewhiten(rows)
    if fold_at is not None and np.isfinite(fold_at).any():  # a channel may be folded in one pair and not another
        rows, at = rows[at], np.arange(len(at))
        fold = np.isfinite(fold_at)
        rows[fold] = folded(rows[fold], xy[fold], fold_at[fold])
    ranks = rank_transform(np.ascontiguousarray(rows), est.ties)
    u = ranks[at]  # (2P, m)
    p = np.arange(len(pairs))
    mi = est.estimate_ranks(u, p, p + len(pairs))
    acf = autocorrelation(ranks)[at]
    ne = pair_n_eff(acf[p], acf[p + len(pairs)], m)
    mi[~enough] = np.nan
    return mi, ne, u.reshape(2, len(pairs), m), pos


def folded(e: np.ndarray, levels: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Innovations e (R, m) folded at the levels at (R,): sign(level - at) x e."""
    return np.sign(levels - at[:, None]) * e


def innovation_estimates(
    est: Estimator, window: np.ndarray, fresh: np.ndarray, pairs: np.ndarray, m: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """On the innovations of pairs' (P, 2) newest m rows (:func:`newest_rows`): the MI and effective size (P,) of x's
    and y's, and the folds' z-scores (P, 2), for (x folded, y) and (x, y folded): the rank correlation times the
    square root of the pair's effective size, near standard normal for independent channels. A fold leaves a
    monotone relation (y's innovations rise with x's folded ones), which a correlation tests without the network.
    NaN where a pair has fewer such rows."""
    xy, _, enough = newest_rows(window, fresh, pairs, m)
    levels, at = np.unique(xy, axis=0, return_inverse=True)  # a channel's rows recur in each of its pairs: once each
    at = at.reshape(-1)
    e = prewhiten(levels)
    rows = np.concatenate([e, folded(e, levels, np.median(levels, axis=1))])
    ranks = rank_transform(np.ascontiguousarray(rows), est.ties)  # (2R, m): innovations, then folded
    r, n = len(levels), len(pairs)
    x, y = at[:n], at[n:]
    mi = est.estimate_ranks(ranks, x, y)
    acf = autocorrelation(ranks)
    ne = pair_n_eff(acf[x], acf[y], m)
    z = ranks - ranks.mean(axis=1, keepdims=True)
    z /= np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    left, right = np.concatenate([x + r, x]), np.concatenate([y, y + r])  # (2P,): x folded with y, x with y folded
    corr = np.einsum("pt,pt->p", z[left], z[right])
    fold_z = np.abs(corr) * np.sqrt(pair_n_eff(acf[left], acf[right], m))
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
    -1 the levels, else the entry of ``FOLDS``, innovations folded at the newest m rows' medians). The span reaches
    back before the short window, which a smooth pair's change has often left by the time it is seen."""
    span = min(window.shape[1], max(m, ONSET_SPAN))
    xy, pos, _ = newest_rows(window, fresh, pairs, span)
    white = np.concatenate([shown_by >= 0, shown_by >= 0])
    if white.any():
        levels = xy.copy()
        xy[white] = prewhiten(xy[white])
        fold = np.concatenate([shown_by == 1, shown_by == 2])  # x rows, then y rows
        if fold.any():  # folded at the medians of the newest m rows, as the test that showed it
            lv = levels[fold]
            xy[fold] = folded(xy[fold], lv, np.median(lv[:, -m:], axis=1))
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
