"""Pairs of channels on different rates, judged on two sets of rows.

A pair's window holds the ticks where its slower channel has a new sample (``pair_rows``): beside a held value,
the faster channel's samples in between make near-copies that read as dependence, and where the faster channel
follows the slower one's continuous signal (its value between the slower channel's samples), they blur the
relation. Where the faster channel instead carries fresh noise on each sample, its extra samples average that
noise, and a relation shows more clearly on every row either channel renews. So a pair whose second row set
holds at least ``MIN_EXTRA`` times the rows of the first is also estimated there, with its own surrogate null
on those rows, and each test runs at half the false-alarm rate: the pair is dependent when either shows it,
and independent again only when both are below their nulls' 90th percentiles. The value shown (and its
effective size) is the estimate on the slower channel's rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..estimate.significance import NullTable, estimate_own_rows
from ..estimate.surrogates import SurrogateNulls
from .changes import ChangeDetector
from .hop import Hop

__all__ = ["MIN_EXTRA", "MixedRows"]

MIN_EXTRA = 1.2  # a few ticks of jitter make two nearly equal row sets: one test is enough there
NEVER = 1e9  # nats: a bar no estimate crosses (finite: the detector reads NaN as "the table decides")


class MixedRows:
    """The second estimate of mixed-rate pairs (``estimate``) and the verdict of both (``thresholds``)."""

    def __init__(self, n_surrogates: int, refresh_ns: int, significance: str = "effective") -> None:
        self.surrogates = SurrogateNulls(n_surrogates, refresh_ns)  # nulls on the every-new rows
        self.on = significance == "effective"  # "iid": every tick counts as independent, one test
        self.pairs = 0  # pair estimates made on the second row set (a counter)

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
            self.pairs += int(hop.mixed.sum())

    def hop_thresholds(
        self, est: Any, main: SurrogateNulls, table: NullTable, detector: ChangeDetector, hop: Hop,
        pairs: list[tuple[str, str]],
    ) -> tuple[np.ndarray, np.ndarray] | None:  # fmt: skip
        """The detector's per-pair (dependent_above, independent_below) for the hop's done pairs, NaN where the table
        decides: smooth pairs' and held channels' surrogate nulls (``main``, on the slower channel's rows), with each
        mixed-rate pair's two tests folded into the bars of the value shown: crossed when either test shows
        dependence, and never while the second does."""
        alpha, min_effect = detector.alpha, detector.min_effect
        repeating = hop.repeats[hop.i] | hop.repeats[hop.j]  # a held channel: near-copy rows beside a smooth one
        own = main.hop_thresholds(est, table, alpha, hop.u, hop.groups, hop.i, hop.j, pairs, hop.mi, hop.n_eff,
                                  hop.done, hop.end_tick, repeating)  # fmt: skip
        done = hop.done
        mixed = hop.mixed & done & np.isfinite(hop.mixed_mi)
        if not mixed.any():
            return own
        half = alpha / 2
        second = self.surrogates.hop_thresholds(est, table, half, hop.u, hop.mixed_groups, hop.i, hop.j, pairs,
                                                hop.mixed_mi, hop.mixed_n_eff, mixed, hop.end_tick, mixed)  # fmt: skip
        n2 = hop.mixed_n_eff[mixed]
        hi2, lo2 = second if second is not None else (np.full(len(n2), np.nan), np.full(len(n2), np.nan))
        hi2 = np.where(np.isfinite(hi2), hi2, table.dependent_above(n2, half, min_effect))
        lo2 = np.where(np.isfinite(lo2), lo2, table.independent_below(n2))
        at = np.flatnonzero(mixed[done])  # positions among the done pairs
        n1 = hop.n_eff[mixed]
        hi1, lo1 = table.dependent_above(n1, half, min_effect), table.independent_below(n1)
        if own is None:
            own = (np.full(int(done.sum()), np.nan), np.full(int(done.sum()), np.nan))
        had = np.isfinite(own[0][at])  # the first test's own null, at half the rate
        mine_hi, mine_lo = main.thresholds([pairs[k] for k in np.flatnonzero(mixed)], half)
        hi1 = np.where(had & np.isfinite(mine_hi), mine_hi, hi1)
        lo1 = np.where(had & np.isfinite(mine_lo), mine_lo, lo1)
        mi2 = hop.mixed_mi[mixed]
        hi, lo = own[0].copy(), own[1].copy()
        hi[at] = np.where(mi2 > np.maximum(hi2, min_effect), -NEVER, hi1)
        lo[at] = np.where(mi2 < lo2, lo1, -NEVER)
        return hi, lo

    def forget(self, channels: set[str]) -> None:
        """Drop the nulls of pairs with a retired channel."""
        self.surrogates.forget_channels(channels)
