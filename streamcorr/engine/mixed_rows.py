"""Pairs of channels on different rates, judged on two sets of rows.

A pair's window holds the ticks where its slower channel has a new sample (``pair_rows``): beside a held value,
the faster channel's samples in between make near-copies that read as dependence, and where the faster channel
follows the slower one's continuous signal (its value between the slower channel's samples), they blur the
relation. Where the faster channel instead carries fresh noise on each sample, its extra samples average that
noise, and a relation shows more clearly on every row either channel renews. So a pair whose second row set
holds at least ``MIN_EXTRA`` times the rows of the first is also estimated there, with its own surrogate null
on those rows (mirrored shifts where a channel's window ends far from its start,
:func:`streamcorr.estimate.surrogates.shifted_samples`: with plain circular shifts, independent pairs beside a
100 Hz near-random walk or narrow-band oscillation read up to 17 of the null's standard deviations above its mean
on these rows, 25 chance events in two 90-s, 64-channel ``bench.realistic`` recordings; mirrored as here, 2), and
each test runs at half the false-alarm rate: the pair is dependent when either shows it, and independent again
only when both are below their nulls' 90th percentiles. The value shown (and its effective size) is the estimate
on the slower channel's rows.

A pair estimated on fewer rows than the window never gets a lower bar than white noise on as many rows (from
the null tables shipped for other window lengths, interpolated): the estimator's spread grows as rows shrink,
and a smooth pair's own null, extrapolated far into its tail, does not always follow.

The bars of every pair are set here (``MixedRows.hop_thresholds``), a smooth pair's second test on its folded
innovations included (:mod:`streamcorr.engine.smooth_folds`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..estimate.significance import WHITE_FROM, NullTable, estimate_own_rows
from ..estimate.surrogates import SurrogateNulls
from .changes import SHIPPED_NULL_DIR, ChangeDetector, cached_calibration, calibration_file_name
from .hop import Hop
from .smooth_folds import FOLD_HOLD, fold_bar, fold_scores

__all__ = ["MIN_EXTRA", "MixedRows"]

MIN_EXTRA = 1.2  # a few ticks of jitter make two nearly equal row sets: one test is enough there
NEVER = 1e9  # nats: a bar no estimate crosses (finite: the detector reads NaN as "the table decides")
WHITE_LENGTHS = (64, 128, 256, 512, 1024, 2048)  # null tables read for white noise's bar on a pair's own rows


def _rows(groups: list[tuple[np.ndarray, np.ndarray]], n_pairs: int, window_len: int) -> np.ndarray:
    """(P,) rows each pair was estimated on: its group's, or the whole window."""
    rows = np.full(n_pairs, window_len)
    for ranks, idx in groups:
        rows[idx] = ranks.shape[1]
    return rows


class MixedRows:
    """The second estimate of mixed-rate pairs (``estimate``) and the bars of every pair (``hop_thresholds``)."""

    def __init__(self, n_surrogates: int, refresh_ns: int, significance: str = "effective") -> None:
        self.surrogates = SurrogateNulls(n_surrogates, refresh_ns)  # nulls on the every-new rows
        self.on = significance == "effective"  # "iid": every tick counts as independent, one test
        # pair estimates made on the second row set; smooth pairs' folds scored, and those that showed dependence
        self.counts = dict.fromkeys(("second_row_pairs", "fold_pairs", "fold_shown"), 0)
        self._white: dict[int, NullTable] | None = None  # null tables by window length, for white noise's bars

    def estimate(self, est: Any, hop: Hop, own: np.ndarray) -> None:
        """MI and effective size on every new row of the own-row pairs (``own`` (P,)) that are mixed-rate."""
        valid, fresh, i, j = hop.valid, hop.fresh, hop.i, hop.j
        hop.mixed = np.zeros(len(i), dtype=bool)
        for k in np.flatnonzero(own & np.isfinite(hop.mi) & self.on):
            both = valid[i[k]] & valid[j[k]]
            a, b = int((fresh[i[k]] & both).sum()), int((fresh[j[k]] & both).sum())
            hop.mixed[k] = int(((fresh[i[k]] | fresh[j[k]]) & both).sum()) >= MIN_EXTRA * min(a, b)
        hop.mixed_mi, hop.mixed_n_eff = np.full(len(i), np.nan), np.full(len(i), np.nan)
        if hop.mixed.any():
            estimate_own_rows(est, hop.window, fresh, valid, i, j, hop.mixed, hop.mixed_mi, hop.mixed_n_eff,
                              hop.mixed_groups, every_new=True)  # fmt: skip
            self.counts["second_row_pairs"] += int(hop.mixed.sum())

    def hop_thresholds(
        self, est: Any, main: SurrogateNulls, table: NullTable, detector: ChangeDetector, hop: Hop,
        pairs: list[tuple[str, str]],
    ) -> tuple[np.ndarray, np.ndarray] | None:  # fmt: skip
        """The detector's per-pair (dependent_above, independent_below) for the hop's done pairs, NaN where the table
        decides: smooth pairs' and held channels' surrogate nulls (``main``, on the slower channel's rows), never below
        white noise's on as many rows, with each mixed-rate pair's second test and each smooth pair's folded
        innovations (:mod:`streamcorr.engine.smooth_folds`) folded into the bars of the value shown: crossed when any
        test shows dependence, and never while one of the others does. A pair's rate is shared: half to the second
        test where it has one, then half of the rest to the folds where it is smooth."""
        alpha, min_effect, done = detector.alpha, detector.min_effect, hop.done
        repeating = hop.repeats[hop.i] | hop.repeats[hop.j]  # a held channel: near-copy rows beside a smooth one
        own = main.hop_thresholds(est, table, alpha, hop.u, hop.groups, hop.i, hop.j, pairs, hop.mi, hop.n_eff,
                                  done, hop.end_tick, repeating)  # fmt: skip
        nd = int(done.sum())
        hi, lo = own if own is not None else (np.full(nd, np.nan), np.full(nd, np.nan))
        rows = _rows(hop.groups, len(hop.i), table.window_len)
        mixed = hop.mixed & done & np.isfinite(hop.mixed_mi)
        smooth = done & (hop.n_eff < WHITE_FROM * rows) & (self.on and est.prewhiten != "ar")
        rate = alpha / np.where(mixed, 2, 1) / np.where(smooth, 2, 1)  # (P,) each test's of the levels and second
        for r in np.unique(rate[done]).tolist():
            sel = done & (rate == r)
            at = np.flatnonzero(sel[done])
            if r < alpha or (rows[sel] < table.window_len).any():
                first = main.thresholds([pairs[k] for k in np.flatnonzero(sel)], r) if r < alpha else (hi[at], lo[at])
                hi[at], lo[at] = self._bars(est, table, first, np.isfinite(hi[at]), hop.n_eff[sel], rows[sel], r,
                                            min_effect)  # fmt: skip
        up = np.zeros(len(hop.i), dtype=bool)  # (P,) another test shows dependence
        hold = np.zeros(len(hop.i), dtype=bool)  # (P,) another test is not below its independent bar
        if smooth.any():
            at = np.flatnonzero(smooth)
            z = fold_scores(est, hop.window, hop.fresh, hop.valid, np.stack([hop.i[at], hop.j[at]], axis=1))
            with np.errstate(invalid="ignore"):
                # negligible dependence stays independent, however clearly shown
                up[at] = (z > fold_bar(alpha / 2)) & (hop.mi[at] > min_effect)
                hold[at] = z > FOLD_HOLD
            self.counts["fold_pairs"] += len(at)
            self.counts["fold_shown"] += int(up.sum())
        if mixed.any():
            up2, hold2 = self._second(est, table, hop, pairs, mixed, rate, min_effect)
            up |= up2
            hold |= hold2
        if own is None and (rate[done] == alpha).all() and (rows[done] == table.window_len).all():
            return None  # every bar is the table's at the full rate: the detector's own
        hi[up[done]] = -NEVER
        lo[hold[done]] = -NEVER
        return hi, lo

    def _second(
        self, est: Any, table: NullTable, hop: Hop, pairs: list[tuple[str, str]], mixed: np.ndarray, rate: np.ndarray,
        min_effect: float,
    ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """(P,) the mixed-rate pairs whose estimate on every new row is above its null at the pair's rate, and those
        not below its 90th percentile."""
        r2 = rate[mixed]
        sur = self.surrogates
        second = sur.hop_thresholds(est, table, float(r2.max()), hop.u, hop.mixed_groups, hop.i, hop.j, pairs,
                                    hop.mixed_mi, hop.mixed_n_eff, mixed, hop.end_tick, mixed,
                                    mirror=True)  # fmt: skip
        n2 = hop.mixed_n_eff[mixed]
        hi2, lo2 = second if second is not None else (np.full(len(n2), np.nan), np.full(len(n2), np.nan))
        if (r2 < r2.max()).any():  # smooth ones: their null read at their smaller share
            lower, _ = sur.thresholds([pairs[k] for k in np.flatnonzero(mixed)], float(r2.min()))
            hi2 = np.where((r2 < r2.max()) & np.isfinite(hi2), lower, hi2)  # where the null decides at all
        rows2 = _rows(hop.mixed_groups, len(hop.i), table.window_len)[mixed]
        mi2, at = hop.mixed_mi[mixed], np.flatnonzero(mixed)
        up, hold = np.zeros(len(hop.i), dtype=bool), np.zeros(len(hop.i), dtype=bool)
        for r in np.unique(r2).tolist():
            s = r2 == r
            bar, low = self._bars(est, table, (hi2[s], lo2[s]), np.isfinite(hi2[s]), n2[s], rows2[s], r, min_effect)
            up[at[s]] = mi2[s] > np.maximum(bar, min_effect)
            hold[at[s]] = ~(mi2[s] < low)
        return up, hold

    def _bars(
        self, est: Any, table: NullTable, own: tuple[np.ndarray, np.ndarray], has: np.ndarray, n_eff: np.ndarray,
        rows: np.ndarray, alpha: float, min_effect: float,
    ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """(dependent_above, independent_below) of pairs: their own nulls' where ``has``, else the table's, at this
        rate; the first never below white noise's on as many rows as the pair was estimated on."""
        hi = np.where(has & np.isfinite(own[0]), own[0], table.dependent_above(n_eff, alpha, min_effect))
        lo = np.where(has & np.isfinite(own[1]), own[1], table.independent_below(n_eff))
        short = rows < table.window_len
        if short.any():
            hi[short] = np.maximum(hi[short], self.white_above(est, rows[short], alpha))
        return hi, np.minimum(lo, hi)

    def white_above(self, est: Any, rows: np.ndarray, alpha: float) -> np.ndarray:
        """The white-noise null's bar at this rate for windows of ``rows`` samples: interpolated in log-log between
        the null tables shipped for these weights (none is measured for this), held beyond them."""
        if self._white is None:
            self._white = {}
            for n in WHITE_LENGTHS:
                if (SHIPPED_NULL_DIR / calibration_file_name(est.fingerprint, n)).exists():  # the same on every machine
                    self._white[n] = cached_calibration(est.fingerprint, est.estimate_batch, n, est.ties)
        if not self._white:
            return np.zeros(len(rows))
        lengths = sorted(self._white)
        bars = [self._white[n].white_above(alpha) for n in lengths]
        return np.exp(np.interp(np.log(np.maximum(rows, 1)), np.log(lengths), np.log(np.maximum(bars, 1e-12))))

    def forget(self, channels: set[str]) -> None:
        """Drop the nulls of pairs with a retired channel."""
        self.surrogates.forget_channels(channels)
