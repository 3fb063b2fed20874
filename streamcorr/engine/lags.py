"""Lead and lag per pair, live: which channel leads, by how much, and when that changes (``lags`` in a config).

Each hop the tracker searches the lags of up to ``lags.max_pairs_per_hop`` pairs whose last search is at least
``lags.refresh_s`` old: pairs the change detector holds dependent first, then the others, stalest first; and only
as many as fit in what is left of the hop's time budget (``screening.hop_budget`` of the hop, at the measured
seconds per search; at least one pair while any time is left, none once the hop is over it), so that lags never
cost a live engine its hops: pairs left over wait for a later hop (``counts["deferred"]``). With
``window.skip_stale_hops`` off (a replay) there is no time budget: every due pair is searched, the same each run.
A search (:func:`streamcorr.engine.lagscan.lag_scan`) reads the pair's channels over the window plus the lag range from
the ring buffers (which hold that much), scans every lag with the cosine features, and runs the network on a few
candidate lags; pairs not held dependent reach the network only when the scan's peak is beyond chance.

The matrix cells ``lag_s`` (positive: the pair's second channel in matrix order follows the first; the matrix is
antisymmetric, ``lag_s[b, a] == -lag_s[a, b]``) and ``mi_lag`` (the MI at that lag) hold each pair's newest
significant result, NaN where its newest search found none. A pair whose reported lag moves by more than
max(2 samples, 10% of the lag), at the same new lag on ``LAG_PERSIST`` searches in a row, gets a ``lag-shift``
event. The newest curve of each searched pair (the scan's MI figure per lag and the network's estimates) is kept
for the web view (``curve``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..estimate.estimator import Estimator
from ..estimate.significance import NullTable
from .buffers import Resampler
from .changes import ChangeDetector, ChangeEvent
from .hop import Hop
from .lagscan import lag_scan
from .matrix import MatrixState
from .settings import EngineConfig, hop_budget_s, lag_samples

__all__ = ["LAG_PERSIST", "LagCurve", "LagTracker"]

LAG_PERSIST = 2  # searches in a row a new lag must hold before a lag-shift event
PROBE_PAIRS = 8  # pairs searched in the first search, which times it


@dataclass(frozen=True)
class LagCurve:
    """One pair's newest lag search, for display: the scan over every lag and the network's candidates."""

    t_ns: int  # end of the window searched
    lags_s: np.ndarray  # (2K + 1,) seconds, -max..max
    scan_mi: np.ndarray  # (2K + 1,) nats: the scan's small-dependence figure (a shape, not an estimate)
    points_s: np.ndarray  # (M,) lags the network evaluated, seconds
    points_mi: np.ndarray  # (M,) nats (NaN: not evaluated)
    lag_s: float | None  # the reported lag (None: not significant)
    mi_lag: float | None
    threshold: float  # nats: the max-over-lags null the MI had to clear

    def as_dict(self) -> dict[str, object]:
        def num(a: np.ndarray) -> list[float | None]:
            return [None if not np.isfinite(v) else round(float(v), 5) for v in a]

        return {"t_ns": self.t_ns, "lags_s": num(self.lags_s), "scan_mi": num(self.scan_mi),
                "points_s": num(self.points_s), "points_mi": num(self.points_mi), "lag_s": self.lag_s,
                "mi_lag": self.mi_lag, "threshold": round(self.threshold, 5)}  # fmt: skip


class LagTracker:
    """Per-pair lag search and lag-shift events; ``step`` once per hop after the change detector's verdicts."""

    def __init__(
        self,
        est: Estimator,
        null: NullTable,
        *,
        window_len: int,
        max_lag: int,
        period_ns: int,
        refresh_ns: int,
        max_pairs: int,
        alpha: float = 1e-3,
        min_effect: float = 0.0,
        budget_s: float = float("inf"),
    ) -> None:
        self.est, self.null = est, null
        self.window_len, self.max_lag, self.period_ns = window_len, max_lag, period_ns
        self.refresh_ns, self.max_pairs, self.alpha, self.min_effect = refresh_ns, max_pairs, alpha, min_effect
        self._searched: dict[tuple[str, str], int] = {}  # end tick of each pair's newest search
        # (lag in samples, newest MI there) as last reported: the baseline a lag-shift is measured from
        self._reported: dict[tuple[str, str], tuple[float, float]] = {}
        self._pending: dict[tuple[str, str], tuple[float, int]] = {}  # a new lag and how many searches it held
        self.curves: dict[tuple[str, str], LagCurve] = {}
        self.budget_s = budget_s  # of each hop, for every stage
        self.s_per_pair = 0.0  # measured seconds per searched pair (0: not yet)
        self.counts = {"pairs_searched": 0, "network_pairs": 0, "gapped": 0, "deferred": 0}

    @classmethod
    def for_engine(cls, cfg: EngineConfig, est: Estimator, null: NullTable, period_ns: int) -> LagTracker | None:
        """The engine's tracker from its settings (``lags`` in a config); None when lags.max_s is 0."""
        max_lag = lag_samples(cfg)
        if max_lag == 0:
            return None
        return cls(est, null, window_len=cfg.window_len, max_lag=max_lag, period_ns=period_ns,
                   refresh_ns=round(cfg.lag_refresh_s * 1e9), max_pairs=cfg.lag_pairs_per_hop,
                   min_effect=cfg.min_effect, budget_s=hop_budget_s(cfg))  # fmt: skip

    def forget(self, channels: set[str]) -> None:
        """Drop the state of pairs with a channel in ``channels`` (retired)."""
        for d in (self._searched, self._reported, self._pending, self.curves):
            for p in [p for p in d if p[0] in channels or p[1] in channels]:
                del d[p]

    def curve(self, a: str, b: str) -> LagCurve | None:
        """The newest curve of the pair (a, b) in the order asked (lags flipped for (b, a)); None if never searched."""
        c = self.curves.get((a, b))
        if c is not None:
            return c
        c = self.curves.get((b, a))
        if c is None:
            return None
        return LagCurve(c.t_ns, -c.lags_s[::-1], c.scan_mi[::-1], -c.points_s, c.points_mi,
                        None if c.lag_s is None else -c.lag_s, c.mi_lag, c.threshold)  # fmt: skip

    def _due(self, hop: Hop, names: list[str], pairs: np.ndarray, detector: ChangeDetector) -> np.ndarray:
        """Indices into pairs to search this hop: due ones, held dependent first, then stalest first."""
        keys = [(names[a], names[b]) for a, b in pairs.tolist()]
        last = np.array([self._searched.get(p, -1) for p in keys], dtype=np.int64)
        due = np.flatnonzero((last < 0) | (hop.end_tick - last >= self.refresh_ns))
        held = np.array([bool(detector.is_dependent(keys[k])) for k in due], dtype=bool)
        order = np.lexsort((last[due], ~held))  # held first, then oldest search first
        left = self.budget_s - (time.perf_counter() - hop.began)  # of the hop's budget
        fit = 0 if left <= 0 else min(self.max_pairs, PROBE_PAIRS)  # PROBE_PAIRS until a search has been timed
        if left > 0 and self.s_per_pair > 0:
            fit = max(1, int(min(self.max_pairs, left / self.s_per_pair)))
        self.counts["deferred"] += max(0, len(due) - fit)
        return due[order][:fit]

    def step(
        self,
        hop: Hop,
        names: list[str],
        pairs: np.ndarray,
        resampler: Resampler,
        detector: ChangeDetector,
        state: MatrixState,
    ) -> list[ChangeEvent]:
        pick = self._due(hop, names, pairs, detector)
        if not len(pick):
            return []
        t0 = time.perf_counter()
        events = self._search(hop, names, pairs[pick], resampler, detector, state)
        per_pair = (time.perf_counter() - t0) / len(pick)
        self.s_per_pair = per_pair if self.s_per_pair == 0 else 0.7 * self.s_per_pair + 0.3 * per_pair
        return events

    def _search(
        self,
        hop: Hop,
        names: list[str],
        pp: np.ndarray,
        resampler: Resampler,
        detector: ChangeDetector,
        state: MatrixState,
    ) -> list[ChangeEvent]:
        """Search the lags of pairs pp (P, 2), record them in the matrix state; the lag-shift events."""
        used = np.unique(pp)
        length = self.window_len + self.max_lag
        values, age = resampler.window_ages([hop.chans[c].buffer for c in used], hop.end_tick, length)
        whole = np.isfinite(values).all(axis=1)  # (U,) a pair with a gap in its range is searched later
        row = np.full(len(names), -1)
        row[used] = np.arange(len(used))
        iu, iv = row[pp[:, 0]], row[pp[:, 1]]
        ok = whole[iu] & whole[iv]
        keys = [(names[a], names[b]) for a, b in pp.tolist()]
        for key in keys:
            self._searched[key] = hop.end_tick
        self.counts["gapped"] += int((~ok).sum())
        if not ok.any():
            return []
        vals = np.where(whole[:, None], values, 0.0)
        force = np.array([bool(detector.is_dependent(keys[k])) for k in np.flatnonzero(ok)], dtype=bool)
        r = lag_scan(self.est, vals, iu[ok], iv[ok], max_lag=self.max_lag, window_len=self.window_len, null=self.null,
                     alpha=self.alpha, min_effect=self.min_effect, age=age, force=force)  # fmt: skip
        self.counts["pairs_searched"] += int(ok.sum())
        self.counts["network_pairs"] += r.network_pairs
        period_s = self.period_ns / 1e9
        lag_s, mi_lag = r.lag * period_s, np.where(r.significant, r.mi, np.nan)
        sel = pp[ok]
        state.set_lags(sel[:, 0], sel[:, 1], lag_s, mi_lag)
        grid_s = np.arange(-self.max_lag, self.max_lag + 1) * period_s
        events = []
        for q, k in enumerate(np.flatnonzero(ok)):
            key = keys[k]
            sig = bool(r.significant[q])
            self.curves[key] = LagCurve(hop.end_tick, grid_s, r.curve[q], r.cand_lag[q] * period_s, r.cand_mi[q],
                                        float(lag_s[q]) if sig else None, float(mi_lag[q]) if sig else None,
                                        float(r.threshold[q]))  # fmt: skip
            if sig and (ev := self._shift(key, float(r.lag[q]), float(r.mi[q]), hop.end_tick)) is not None:
                events.append(ev)
        return events

    def _shift(self, key: tuple[str, str], lag: float, mi: float, t_ns: int) -> ChangeEvent | None:
        """A lag-shift event when the pair's lag (samples) has moved and held there LAG_PERSIST searches."""
        before = self._reported.get(key)
        if before is None:
            self._reported[key] = (lag, mi)
            return None
        old, old_mi = before
        if abs(lag - old) <= max(2.0, 0.1 * abs(old)):  # still there: its newest MI is the event's previous
            self._reported[key] = (old, mi)
            self._pending.pop(key, None)
            return None
        pending = self._pending.get(key)
        count = pending[1] + 1 if pending is not None and abs(lag - pending[0]) <= max(2.0, 0.1 * abs(lag)) else 1
        if count < LAG_PERSIST:
            self._pending[key] = (lag, count)
            return None
        self._pending.pop(key, None)
        self._reported[key] = (lag, mi)
        period_s = self.period_ns / 1e9
        return ChangeEvent(key, old_mi, mi, t_ns, "lag-shift", lag_s=lag * period_s, previous_lag_s=old * period_s)
