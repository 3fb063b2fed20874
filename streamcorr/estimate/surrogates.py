"""Per-pair nulls of smooth pairs from circularly shifted surrogates (see :class:`SurrogateNulls`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.stats import chi2, gamma, norm

from .copula import marginal_histograms, pair_histograms
from .significance import NullTable

__all__ = ["SurrogateNulls", "normal_weight", "shifted_samples"]

# the null's tail: gamma-shaped (skewed) up to NORMAL_FROM[0] effective samples, normal from NORMAL_FROM[1], blended
# in log n_eff between
NORMAL_FROM = (50.0, 300.0)
WAIT = 1e9  # nats: the bar of a pair whose null is not measured yet this hop (finite: NaN means "the table decides")


def normal_weight(n_eff: float | np.ndarray) -> np.ndarray:
    """Weight of the normal tail (against the gamma tail) in a surrogate null at this effective sample size."""
    lo, hi = NORMAL_FROM
    return np.clip(np.log(np.maximum(n_eff, 1e-9) / lo) / math.log(hi / lo), 0.0, 1.0)


def _quantile(mean: np.ndarray, var: np.ndarray, tail: float, w: np.ndarray) -> np.ndarray:
    """Values (P,) nulls of these means and variances exceed with probability ``tail``: gamma and normal blended."""
    normal = np.where(w > 0, mean + norm.isf(tail) * np.sqrt(var), 0.0)
    skewed = np.where(w < 1, gamma.isf(tail, mean**2 / var, scale=var / mean), 0.0)
    return (1 - w) * skewed + w * normal


def shifted_samples(u: np.ndarray, s: int, mirror: bool = False) -> np.ndarray:
    """(P, S, T): each row of u (P, T) circularly shifted s times, evenly over its length.

    ``mirror``: rows whose end lies further from their start than 99 in 100 of their own steps are shifted along
    the row followed by itself reversed (period 2T), so no surrogate joins the end to the start. A near-random walk
    or a slow oscillation ends far from where it began; a plain shift puts that jump inside every surrogate, which
    then reads well below two independent continuous signals. A noisy row's steps are as large: it is shifted plainly
    (reversed, a narrow-band relation's shifts land in phase with it more often)."""
    t = u.shape[1]
    plain = u[:, (np.arange(t)[None, :] - ((t * np.arange(1, s + 1)) // (s + 1))[:, None]) % t]
    if not mirror:
        return plain
    jump = np.abs(u[:, -1] - u[:, 0]) > np.quantile(np.abs(np.diff(u, axis=1)), 0.99, axis=1)  # (P,)
    ext = np.concatenate([u[jump], u[jump, ::-1]], axis=1)  # (J, 2T)
    shifts = (2 * t * np.arange(1, s + 1)) // (s + 1)
    plain[jump] = ext[:, (np.arange(t)[None, :] + shifts[:, None]) % (2 * t)]
    return plain


class SurrogateNulls:
    """Per-pair nulls from circularly shifted surrogates, for pairs whose effective sample size is small.

    The table's null at a small n_eff mixes every kind of smooth process and is wide; a pair's own null is
    much narrower. Shifting one channel's window against the other circularly keeps both autocorrelations
    and breaks the dependence, so the MI of ``n_surrogates`` shifts (evenly spaced over the window, the same
    every time) is a sample of this pair's null. The bar is its mean plus a quantile of its spread, the variance
    raised to its 95% upper confidence bound with min(n_surrogates, n_eff / 2) degrees of freedom, since
    neighbouring shifts of a smooth pair are not independent draws. The tail is gamma-shaped (skewed) below
    ``NORMAL_FROM[0]`` effective samples and normal from ``NORMAL_FROM[1]``, blended between: a gamma tail
    alone fits AR(1) pairs of a few dozen effective samples but is too strict at a few hundred, where it missed
    dependence of 0.2 nats of a slow device's field (``bench.realistic``). ``bench.surrogate_tail`` measures how
    often independent pairs exceed the bar at rates 1e-2 to 1e-4 (``bench/results/surrogate_tail.md``).

    A pair's surrogate null is measured again once its window has been replaced (``refresh_ns``), for at most
    ``max_pairs`` pairs a hop (the strongest first); pairs without one keep the table's thresholds. A pair newly
    above its bar on a null from an earlier window is measured again first, and judged only once it has been: with
    more pairs due than a hop measures (64 realistic channels: every mixed-rate pair), a null a window old can sit
    far below today's for a near-random walk, and such crossings gave 9 of 20 chance events in 90 s.
    """

    def __init__(self, n_surrogates: int, refresh_ns: int, max_pairs: int = 64) -> None:
        self.n_surrogates = n_surrogates
        self.refresh_ns = refresh_ns
        self.max_pairs = max_pairs
        self._nulls: dict[tuple[str, str], tuple[int, float, float, float, float]] = {}  # t_ns, mean, var, dof, n_eff
        self.measured = 0  # pairs whose surrogate null was measured (a counter)
        self._above: set[tuple[str, str]] = set()  # smooth pairs above their bar at the last hop

    def due(self, pairs: list[tuple[str, str]], t_ns: int, n_eff: np.ndarray | None = None) -> np.ndarray:
        """Which pairs have no surrogate null, one older than refresh_ns, or (given n_eff) one measured at an
        effective size well above today's (a smoother window has a wider null)."""
        out = np.ones(len(pairs), dtype=bool)
        for k, p in enumerate(pairs):
            null = self._nulls.get(p)
            if null is not None:
                fresh = t_ns - null[0] < self.refresh_ns
                out[k] = not fresh or (n_eff is not None and n_eff[k] < 0.7 * null[4])
        return out

    def measure(
        self,
        estimate_histograms: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
        grid: int,
        u: np.ndarray,
        i: np.ndarray,
        j: np.ndarray,
        pairs: list[tuple[str, str]],
        n_eff: np.ndarray,
        t_ns: int,
        mirror: bool = False,
    ) -> None:
        """Measure the surrogate nulls of pairs (i[p], j[p]) of copula rows u (C, T) (``mirror``: see
        :func:`shifted_samples`)."""
        if not len(pairs):
            return
        s, t = self.n_surrogates, u.shape[1]
        shifted = shifted_samples(u[j], s, mirror).reshape(len(pairs) * s, t)  # (P*S, T)
        both = np.concatenate([np.repeat(u[i], s, axis=0), shifted])
        n = len(shifted)
        idx = np.arange(n)
        marg = marginal_histograms(both, grid)
        mi = estimate_histograms(pair_histograms(both, both, grid, idx, idx + n), marg[:n], marg[n:]).reshape(-1, s)
        mean, var = mi.mean(axis=1), mi.var(axis=1, ddof=1)
        dof = np.clip(n_eff / 2, 2.0, s)  # a window of n_eff independent samples holds about n_eff / 2 distinct shifts
        for k, pair in enumerate(pairs):
            self._nulls[pair] = (t_ns, float(mean[k]), float(var[k]), float(dof[k]), float(n_eff[k]))
        self.measured += len(pairs)

    def thresholds(self, pairs: list[tuple[str, str]], alpha: float) -> tuple[np.ndarray, np.ndarray]:
        """(dependent_above, independent_below) per pair from its surrogate null; NaN where it has none."""
        hi, lo = np.full(len(pairs), np.nan), np.full(len(pairs), np.nan)
        known = [(k, null) for k, pair in enumerate(pairs) if (null := self._nulls.get(pair)) is not None]
        if not known:
            return hi, lo
        at = np.array([k for k, _ in known])
        _, mean, var, dof, n_eff = np.array([null for _, null in known], dtype=np.float64).T  # (5, K)
        mean, var = np.maximum(mean, 1e-6), np.maximum(var, 1e-12)
        var_hi = var * (dof - 1) / chi2.ppf(0.05, dof - 1)
        w = normal_weight(n_eff)
        hi[at] = _quantile(mean, var_hi, alpha, w)
        lo[at] = _quantile(mean, var, 0.1, w)
        return hi, lo

    def hop_thresholds(
        self,
        est: Any,
        table: NullTable,
        alpha: float,
        u: np.ndarray,
        groups: list[tuple[np.ndarray, np.ndarray]],
        i: np.ndarray,
        j: np.ndarray,
        pairs: list[tuple[str, str]],
        mi: np.ndarray,
        n_eff: np.ndarray,
        done: np.ndarray,
        t_ns: int,
        repeating: np.ndarray,
        mirror: bool = False,
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """One hop's thresholds (per done pair; NaN where the table decides) from the surrogate nulls of smooth
        pairs (n_eff below half the window) and of pairs with a held channel (``repeating``: one repeats samples on
        the clock's ticks; beside a smooth channel its repeated rows are near-copies, which the table's null of
        independent samples does not know) above the table's median, measuring those that are due. Ranks: the
        shared u (C, T) for pairs (i, j), or, for pairs on their own rows, a group's (ranks (2m, R), indices).
        ``mirror``: the surrogates of :func:`shifted_samples` that join no row's end to its start."""
        if self.n_surrogates == 0 or not done.any():
            return None
        ne = np.where(done, n_eff, np.inf)
        smooth = done & ((ne < 0.5 * table.window_len) | repeating) & (mi > table.median_at(np.minimum(ne, 1e9)))
        if not smooth.any():
            return None
        # a pair newly crossing its bar on a null from an earlier window is judged on a fresh one, first: with more
        # pairs due than a hop measures, a near-random walk's null a window old can sit far below today's
        hi, _ = self.thresholds(pairs, alpha)
        old = np.array([p in self._nulls and p not in self._above for p in pairs])  # (a pair that stayed above
        crossing = smooth & old & (mi > hi)  # keeps its null until the refresh)
        first = np.flatnonzero(crossing)
        first = first[np.argsort(-mi[first], kind="stable")]
        due = np.flatnonzero(smooth & self.due(pairs, t_ns, n_eff) & ~crossing)
        due = due[np.argsort(-mi[due], kind="stable")][: max(0, self.max_pairs - len(first))]  # the strongest first
        self._measure_hop(est, u, groups, i, j, pairs, n_eff, np.concatenate([first[: self.max_pairs], due]), t_ns,
                          mirror)  # fmt: skip
        hi, lo = self.thresholds(pairs, alpha)
        waiting = np.zeros(len(pairs), dtype=bool)  # crossings beyond the hop's budget: judged once measured
        waiting[first[self.max_pairs :]] = True
        self._above = {pairs[k] for k in np.flatnonzero(smooth & ~waiting & (mi > hi))}
        hi, lo = hi[done], lo[done]
        hi[waiting[done]] = WAIT
        off = ~smooth[done]
        hi[off] = lo[off] = np.nan
        return hi, lo

    def _measure_hop(
        self,
        est: Any,
        u: np.ndarray,
        groups: list[tuple[np.ndarray, np.ndarray]],
        i: np.ndarray,
        j: np.ndarray,
        pairs: list[tuple[str, str]],
        n_eff: np.ndarray,
        due: np.ndarray,
        t_ns: int,
        mirror: bool = False,
    ) -> None:
        """Measure the nulls of the hop's pairs at indices ``due``, from the shared ranks or their group's."""
        if not len(due):
            return
        chosen = np.zeros(len(pairs), dtype=bool)
        chosen[due] = True
        own_rows = {int(k) for _, idx in groups for k in idx}
        shared = np.array([k for k in due if int(k) not in own_rows], dtype=np.int64)
        if shared.size:
            self.measure(est.estimate_histograms, est.grid, u, i[shared], j[shared], [pairs[k] for k in shared],
                         n_eff[shared], t_ns, mirror)  # fmt: skip
        for ranks, idx in groups:
            local = np.flatnonzero(chosen[idx])
            if local.size:
                self.measure(est.estimate_histograms, est.grid, ranks, local, local + len(idx),
                             [pairs[idx[k]] for k in local], n_eff[idx[local]], t_ns, mirror)  # fmt: skip

    def forget_channels(self, channels: set[str]) -> None:
        """Drop the nulls of every pair with a channel in ``channels`` (retired)."""
        self.forget({p for p in self._nulls if p[0] not in channels and p[1] not in channels})
        self._above = {p for p in self._above if p[0] not in channels and p[1] not in channels}

    def forget(self, keep: set[tuple[str, str]]) -> None:
        """Drop the nulls of pairs not in keep (channels retired or pairs no longer smooth)."""
        for pair in [p for p in self._nulls if p not in keep]:
            del self._nulls[pair]
