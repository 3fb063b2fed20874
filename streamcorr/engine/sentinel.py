"""The fast path's coupling test (:mod:`streamcorr.engine.fast`): a sentinel on short recent windows.

Which pairs: those the detector holds independent among the hop's network pairs (with the screen on, those it
flagged), at most a tenth of the hop's network pairs or 128, stalest first. Each is estimated on its newest
``sentinel_len`` rows, and those not above on the newest half of them (``settings.levels_lengths``: a strong relation
shows there sooner, a weak one needs all the rows), rows both channels repeat left out as in the window's estimate
(a pair where one channel repeats rows the other does not, a slower channel on this clock, is left to the window).
Each length is judged against the null at that length and the pair's effective size, at the false-alarm rate the
engine gives the sentinel (half of ``changes.false_alarms_per_hour``; the window path has the other half), shared by
the lengths and scaled by each one's independent looks an hour (``settings.levels_alpha``).

A smooth pair's short window holds few independent samples (effective size below ``WHITE_FROM`` of its length), so
the null of its levels is wide: its innovations (each row's residuals of an AR fit over its rows, what is new at each
sample) are tested as well, plain (MI) and each channel's folded by its level's quartiles (a relation that turns, as
x^2, flips the sign with which y's innovations follow x's; short_windows.local_slopes), on the newest half, once and
twice ``sentinel_len`` rows (shortest first, within half the window), sharing half the rate (the levels have the
other half; ``settings.innovation_alpha`` splits it).

One hop above is enough: consecutive short windows overlap, so a second look costs half a second and adds little.
The onset is the change point of the whole short window's evidence under its own table (of the levels, at either
length that showed them, or of the innovations at the length that showed them), which also becomes the pair's
first reference where the levels showed the change.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.stats import norm

from ..estimate.estimator import Estimator
from ..estimate.evidence import change_point, evidence, pair_tables
from ..estimate.significance import WHITE_FROM, NullTable
from . import settings
from .changes import ChangeDetector, ChangeEvent
from .hop import PairNames
from .short_windows import innovation_tests, onsets, short_estimates

__all__ = ["Sentinel"]

Key = tuple[str, str]
# a new dependence's first reference for the decoupling test: (pair, theta, log Z, mean, long-run variance, share, tick)
SetReference = Callable[[Key, np.ndarray, float, float, float, float, int], None]


class Sentinel:
    """Short-window coupling tests; ``test`` once per hop over pairs held independent, returns the hop's events."""

    def __init__(
        self, est: Estimator, detector: ChangeDetector, nulls: Callable[[int], NullTable], counts: dict[str, int],
        set_reference: SetReference, *, window_len: int, period_ns: int, hop_samples: int, sentinel_len: int,
        persist: int,
    ) -> None:  # fmt: skip
        self.est, self.detector, self.nulls, self.counts = est, detector, nulls, counts
        self.set_reference = set_reference
        self.window_len, self.period_ns, self.hop_samples = window_len, period_ns, hop_samples
        self.sentinel_len, self.persist = sentinel_len, persist
        self.innovation_lengths = settings.innovation_lengths(sentinel_len, window_len)
        self.levels_lengths = settings.levels_lengths(sentinel_len)
        self.alpha = 1e-3  # false-alarm rate per pair and hop; the engine sets it from its budget
        self.streak: dict[Key, int] = {}  # consecutive hops above, towards ``persist``
        self.tested: dict[Key, int] = {}  # end tick of each pair's latest test

    def levels_above(self, m: int, mi: np.ndarray, ne: np.ndarray, smooth: np.ndarray) -> np.ndarray:
        """Which estimates mi on m rows (effective sizes ne) beat the levels' bar (smooth pairs: at half the rate)."""
        a = settings.levels_alpha(self.alpha, m, self.levels_lengths, self.hop_samples, self.sentinel_len)
        bar = [self.nulls(m).dependent_above(ne, x, self.detector.min_effect) for x in (a, a / 2)]
        with np.errstate(invalid="ignore"):
            return mi > np.where(smooth, bar[1], bar[0])

    def innovation_alpha(self, m: int) -> float:  # each comparison's rate (settings.innovation_alpha)
        return settings.innovation_alpha(self.alpha, m, self.innovation_lengths, self.hop_samples, self.sentinel_len)

    def innovation_threshold(self, m: int, ne: np.ndarray) -> np.ndarray:
        return self.nulls(m).dependent_above(ne, self.innovation_alpha(m), self.detector.min_effect)

    def fold_z(self, m: int) -> float:
        return float(norm.isf(self.innovation_alpha(m) / 2))  # two-sided: a fold may open up or down

    def test(
        self, end_tick: int, keys: PairNames, pairs: np.ndarray, window: np.ndarray, fresh: np.ndarray,
        rows: np.ndarray, budget: int,
    ) -> list[ChangeEvent]:  # fmt: skip
        m, period, n = self.sentinel_len, self.period_ns, self.window_len
        # a channel that holds samples the other does not (a slower channel on this clock) makes near-copy rows
        # beside a smooth one: such pairs are judged on their own nulls, by the window path
        odd = (fresh[pairs[rows, 0], -m:] != fresh[pairs[rows, 1], -m:]).mean(axis=1)
        rows = rows[odd <= 0.02]
        if len(rows) > budget:  # the stalest first, so each pair's turn comes round
            rows = rows[np.argsort([self.tested.get(keys[k], 0) for k in rows], kind="stable")[:budget]]
        for key in set(self.streak) - {keys[k] for k in rows}:
            del self.streak[key]
        if len(rows) == 0:
            return []
        for k in rows:
            self.tested[keys[k]] = end_tick
        self.counts["sentinel_pairs"] += len(rows)
        mi, ne, u, pos = short_estimates(self.est, window, fresh, pairs[rows], m)
        # a smooth pair's short window holds few independent samples, so its levels' null is wide; its innovations
        # (what is new at each sample) hold nearly m. Both are tested, each at half the rate.
        is_smooth = ne < WHITE_FROM * m if self.est.prewhiten != "ar" else np.zeros(len(rows), dtype=bool)
        smooth = np.flatnonzero(is_smooth)
        above = self.levels_above(m, mi, ne, is_smooth)
        for half in self.levels_lengths[:-1]:  # the newest half: a strong relation shows there sooner
            if len(todo := np.flatnonzero(~above)):
                mi_h, ne_h, _, _ = short_estimates(self.est, window, fresh, pairs[rows[todo]], half)
                seen = self.levels_above(half, mi_h, ne_h, is_smooth[todo])
                above[todo], mi[todo[seen]] = seen, mi_h[seen]  # the event reports the estimate that showed it
        seen_on = np.zeros(len(rows), dtype=np.int64)  # the innovations' short window that showed it (0: none)
        shown_by = np.full(len(rows), -1, dtype=np.int64)  # -1: the levels, else the entry of FOLDS
        if len(smooth):
            todo = np.flatnonzero(is_smooth & ~above)
            seen_on[todo], shown_by[todo] = innovation_tests(self.est, window, fresh, pairs[rows[todo]],
                                                             self.innovation_lengths, self.innovation_threshold,
                                                             self.fold_z)  # fmt: skip
        by_innovation = seen_on > 0
        self.counts["innovation_alarms"] += int(by_innovation.sum())
        above |= by_innovation
        fire = []
        for q, k in enumerate(rows.tolist()):
            if above[q]:
                self.streak[keys[k]] = self.streak.get(keys[k], 0) + 1
                if self.streak[keys[k]] >= self.persist:
                    fire.append(q)
            else:
                self.streak.pop(keys[k], None)
        if not fire:
            return []
        uf = np.concatenate([u[0, fire], u[1, fire]])  # (2F, m)
        p = np.arange(len(fire))
        theta, log_z, _ = pair_tables(self.est, uf, p, p + len(fire))
        e = evidence(theta, log_z, uf[p], uf[p + len(fire)])  # (F, m)
        at = change_point(e, rising=True)
        begun = pos[fire, at]  # white pairs: the short window holds the change; smooth ones are often seen later
        far = np.flatnonzero(is_smooth[fire])
        lengths = np.where(by_innovation[fire], seen_on[fire], m)
        for length in np.unique(lengths[far]):  # each pair's onset under the table of the short window that showed it
            at_len = far[lengths[far] == length]
            begun[at_len] = onsets(self.est, window, fresh, pairs[rows[fire][at_len]], shown_by[fire][at_len],
                                   int(length))  # fmt: skip
        events = []
        for f, q in enumerate(fire):
            key = keys[rows[q]]
            self.streak.pop(key, None)
            onset = int(end_tick - (n - 1 - begun[f]) * period)
            ev = self.detector.fast_change(key, "became-dependent", float(mi[q]), end_tick, onset,
                                           max(0, onset + n * period - end_tick))  # fmt: skip
            if ev is None:
                continue
            events.append(ev)
            after = e[f, at[f] :]
            # the short window's table, on the samples after the onset, is the first reference (where levels showed it)
            if len(after) >= 16 and not by_innovation[q]:
                share = max(float(ne[q]), 2.0) / m  # independent samples per sample
                self.set_reference(key, theta[f], float(log_z[f]), float(after.mean()),
                                    float(after.var()) / share, share, end_tick)  # fmt: skip
        return events
