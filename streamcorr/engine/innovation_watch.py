"""The fast path's decoupling test on a smooth pair's innovations (:mod:`streamcorr.engine.fast`).

A smooth pair's scores on its levels move in runs, so the CUSUM on them needs a high threshold and alarms
seconds after a decoupling. Its innovations (each channel's residuals of an AR fit over the reference window,
applied to every new sample with the same coefficients) are nearly independent from one sample to the next.
Where they showed the dependence (their table's mean score at least ``min_reference`` nats), a second CUSUM on
their scores, with the same drift rule and run length between false alarms, alarms within a second or two. New
innovations are ranked among the reference window's (its sorted innovations are kept). Of the comparisons in
``settings.FOLDS`` (plain, or one channel's innovations folded by the local slope's sign in its level's quartiles
over the reference window, :func:`streamcorr.engine.short_windows.local_slopes`: a relation that turns, such as
x^2 or sin 2x, shows only so), each pair is watched on the one whose table scores highest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..estimate.copula import rank_transform
from ..estimate.estimator import Estimator
from ..estimate.evidence import evidence, pair_tables, window_moments
from ..estimate.significance import ar_fit, ar_residuals, autocorrelation, pair_n_eff
from .short_windows import Fold, bins_of, folded, local_slopes

__all__ = ["InnovationWatch"]

Key = tuple[str, str]


@dataclass
class _Watched:
    coef: np.ndarray  # (2, order) AR coefficients of x and y over the reference window
    mean: np.ndarray  # (2,) their means there
    fold: Fold  # (2 rows: x, y) how each channel's innovations are folded (as over the reference window)
    ordered: np.ndarray  # (2, N) the reference window's innovations (folded as watched), sorted
    theta: np.ndarray  # (G, G) float32: the innovations' table
    log_z: float
    allowance: float  # nats per sample: a quarter of the mean score
    threshold: float  # h, nats
    seen_tick: int  # newest sample tick scored
    s: float = 0.0  # the CUSUM
    zero_tick: int = 0  # newest tick at which s was 0


class InnovationWatch:
    """Innovation CUSUMs of smooth held pairs: ``make`` from a window, ``score`` each hop's new samples."""

    def __init__(
        self, est: Estimator, threshold: Callable[[float, float], float], min_reference: float, period_ns: int
    ) -> None:
        self.est, self.threshold, self.min_reference, self.period_ns = est, threshold, min_reference, period_ns
        self.refs: dict[Key, _Watched] = {}

    def make(self, keys: list[Key], xy: np.ndarray, end_tick: int) -> None:
        """References of pairs keys (P) from their window's values xy (2P, N): x rows, then y rows, every row a
        new sample of both channels. Pairs whose innovations show too little dependence get none."""
        n, k = xy.shape[1], len(keys)
        coef, fitted = ar_fit(xy)
        mean = xy.mean(axis=1)
        e = ar_residuals(xy - mean[:, None], coef)  # (2P, N)
        p = np.arange(k)
        other = np.concatenate([p + k, p])
        fold, _ = local_slopes(xy, e, e[other], np.ones(2 * k))  # (2P rows): each channel's bins against the other
        rows = np.concatenate([e, folded(e, xy, fold)])  # (4P, N): innovations, then folded
        u = rank_transform(np.ascontiguousarray(rows), self.est.ties)
        left = np.concatenate([p, p + 2 * k, p])  # as settings.FOLDS: plain, x folded, y folded
        right = np.concatenate([p + k, p + k, p + 3 * k])
        theta, log_z, hist = pair_tables(self.est, u, left, right)
        m, var = window_moments(theta, log_z, hist)
        best = np.argmax(m.reshape(3, k), axis=0)  # (P,)
        pick = best * k + p
        lx, ry = left[pick], right[pick]
        acf = autocorrelation(u)
        share = np.maximum(pair_n_eff(acf[lx], acf[ry], n), 2.0) / n
        ordered = np.sort(rows, axis=1)
        for q, key in enumerate(keys):
            c = pick[q]
            if m[c] < self.min_reference or not (fitted[q] and fitted[q + k]):
                self.refs.pop(key, None)
                continue
            drift = float(m[c]) / 4.0
            h = self.threshold(drift, max(float(var[c]) / float(share[q]), 1e-6))
            own = [q, q + k]
            watched = Fold.none(2)  # (x, y): the channel whose folded innovations scored highest keeps its fold
            if best[q] > 0:
                side = best[q] - 1
                watched.edges[side], watched.signs[side] = fold.edges[own[side]], fold.signs[own[side]]
            self.refs[key] = _Watched(coef[own], mean[own], watched, ordered[[lx[q], ry[q]]], theta[c],
                                      float(log_z[c]), drift, h, end_tick, 0.0, end_tick)  # fmt: skip

    def score(self, keys: list[Key], pairs: np.ndarray, window: np.ndarray, end_tick: int) -> list[int]:
        """Run the CUSUMs of pairs keys (P) (channel indices pairs (P, 2) into window (C, N)) over their samples
        since the last hop; the indices (into keys) of those above their threshold."""
        n = window.shape[1]
        # by samples new since the last score (one group unless a hop was skipped) and filter order
        groups: dict[tuple[int, int], list[int]] = {}
        for q, key in enumerate(keys):
            w = self.refs.get(key)
            if w is not None:
                order = w.coef.shape[1]
                new = int(min(n - order, (end_tick - w.seen_tick) // self.period_ns))
                if new > 0:
                    groups.setdefault((new, order), []).append(q)
        alarms = []
        for (new, order), qs in groups.items():
            ws = [self.refs[keys[q]] for q in qs]
            rows = np.concatenate([pairs[qs, 0], pairs[qs, 1]])  # x rows, then y rows
            coef = np.concatenate([[w.coef[0] for w in ws], [w.coef[1] for w in ws]])  # (2G, order)
            mean = np.concatenate([[w.mean[0] for w in ws], [w.mean[1] for w in ws]])
            e = ar_residuals(window[rows, n - new - order :] - mean[:, None], coef)[:, order:].reshape(2, len(qs), new)
            prior = window[rows, n - new - 1 : n - 1].reshape(2, len(qs), new)  # the level before each sample
            edges = np.stack([w.fold.edges for w in ws], axis=1)  # (2, G, B - 1)
            signs = np.stack([w.fold.signs for w in ws], axis=1)  # (2, G, B)
            e *= np.take_along_axis(signs, bins_of(prior, edges), axis=2)  # folded
            u = np.empty((2, len(qs), new))  # new innovations ranked among the reference window's
            for g, w in enumerate(ws):
                for side in (0, 1):
                    u[side, g] = np.searchsorted(w.ordered[side], e[side, g]) / w.ordered.shape[1]
            scores = evidence(np.stack([w.theta for w in ws]), np.array([w.log_z for w in ws]), u[0], u[1])
            inc = np.array([w.allowance for w in ws])[:, None] - scores  # (G, new)
            s = np.array([w.s for w in ws])
            zero = np.array([w.zero_tick for w in ws], dtype=np.int64)
            for c in range(new):  # the CUSUM, sample by sample, all pairs of the group at once
                s = np.maximum(0.0, s + inc[:, c])
                zero = np.where(s == 0.0, end_tick - (new - 1 - c) * self.period_ns, zero)
            for q, w, sk, zk in zip(qs, ws, s.tolist(), zero.tolist(), strict=True):
                w.s, w.zero_tick, w.seen_tick = sk, zk, end_tick
                if sk > w.threshold:
                    alarms.append(q)
        return sorted(alarms)
