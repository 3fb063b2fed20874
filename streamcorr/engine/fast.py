"""The fast path: change events within seconds of a change in dependence, beside the window estimate.

The window estimate moves only once enough of its window has changed, a window after a decoupling. Two tests run
each hop beside it, each with its own calibrated false-alarm rate; the matrix value stays the window estimate.

**Decoupling** (every pair the detector holds dependent). Each pair keeps a reference: its table theta from a recent
full window, and the statistics of that window's per-sample evidence e = theta(u, v) - log Z
(:mod:`streamcorr.estimate.evidence`; the mean is the estimate m). Every new sample, ranked in the current window,
is scored, and a CUSUM accumulates S <- max(0, S + m / 4 - e): it drifts down while the pair behaves as in the
reference (out of sample the evidence stays above m / 2 on the pairs measured in bench.reaction) and up once the
evidence falls to zero or below. S > h raises an alarm, with h from the Brownian approximation of the CUSUM's run
length for a drift of m / 4 and the evidence's long-run variance (its variance x T / n_eff: smooth pairs' evidence
moves in runs), set for one false alarm in ``ARL_PAIR_HOURS`` pair-hours. The onset is the last sample at which S
was zero. The network then confirms it: the samples since the onset (the newest 48, 64, 128 or 256) must be within
the null of independent pairs at their effective size (below its 90th percentile) and below half the reference's
level and half the window's estimate now (a smooth pair's null is wide), and a smooth pair's innovations there must
show no dependence (``STILL_ALPHA``). A pair still above any gets a new reference (its relation changed shape, not
vanished), as does one undecided at 256 (a smooth pair whose short-window null is too wide to tell: the window path
judges it). References are renewed once a window while the CUSUM rests at 0, within what is left of the hop's budget
(``screening.hop_budget``) and at most a tenth of the hop (``REFERENCE_SHARE``): a busy hop keeps the older tables,
and a matrix that turns dependent all at once gets its references over several hops, each published on time.

**Coupling** (pairs the detector holds independent): a short-window sentinel, :mod:`streamcorr.engine.sentinel`.

A confirmed change flips the detector at once (``ChangeDetector.fast_change``, an event with ``path="fast"``)
and holds the window's verdicts on the pair until its window holds only samples after the onset.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from ..estimate.copula import rank_transform
from ..estimate.estimator import Estimator
from ..estimate.evidence import cusum_threshold, evidence, pair_tables, window_moments
from ..estimate.significance import WHITE_FROM, NullTable
from .changes import ChangeDetector, ChangeEvent
from .hop import Hop, PairNames
from .innovation_watch import InnovationWatch
from .sentinel import Sentinel
from .settings import SENTINEL_MIN_PAIRS, SENTINEL_SHARE
from .short_windows import Fold, innovation_tests, short_estimates

__all__ = ["ARL_PAIR_HOURS", "CONFIRM_LENGTHS", "FastPath"]

ARL_PAIR_HOURS = 1000.0  # a steady dependent pair's CUSUM alarms once in this many hours (before confirmation)
CONFIRM_LENGTHS = (256, 128, 64, 48)  # samples since the onset a decoupling is confirmed on (longest that fit)
CONFIRM_N_EFF = 48  # effective samples a confirmation needs, where the longest length holds them
SHORTEST_N_EFF = 40  # ... and at the shortest (48 samples): pairs of 0.83 effective samples a sample or more
PROBE_TABLES = 64  # references made in the first batch, which times them
REFERENCE_SHARE = 0.1  # live, renewing references takes at most this share of a hop, beside what the hop left
INNOVATIONS_BEFORE = 256  # rows before a decoupling's onset whose innovations must have shown the dependence
INNOVATIONS_SINCE = 64  # rows since the onset a smooth pair's innovations confirm on, at least (48 gave false ones)
MIN_REFERENCE = 0.05  # nats: weaker pairs' evidence is too flat for the CUSUM; the window watches them
STILL_ALPHA = 0.01  # a smooth pair's decoupling waits while its innovations beat this bar (any of FOLDS, signs anew)


@dataclass
class _Reference:
    theta: np.ndarray  # (G, G) float32
    log_z: float
    allowance: float  # nats per sample: m / 4
    threshold: float  # h, nats
    made_tick: int  # end tick (ns) of the window the table is from
    seen_tick: int  # newest sample tick scored
    share: float = 1.0  # effective samples per sample of the reference window (smooth pairs: far below 1)
    s: float = 0.0  # the CUSUM
    zero_tick: int = 0  # newest tick at which s was 0: the onset of an alarm


class FastPath:
    """Per-pair fast tests; ``step`` once per hop after the window's verdicts, returns the hop's fast events."""

    def __init__(
        self,
        est: Estimator,
        detector: ChangeDetector,
        nulls: Callable[[int], NullTable],
        *,
        window_len: int,
        period_ns: int,
        hop_samples: int,
        sentinel_len: int = 256,
        persist: int = 1,
        arl_pair_hours: float = ARL_PAIR_HOURS,
        budget_s: float = float("inf"),
    ) -> None:
        self.est, self.detector, self.nulls = est, detector, nulls
        self.window_len, self.period_ns, self.hop_samples = window_len, period_ns, hop_samples
        self.arl_samples = arl_pair_hours * 3600e9 / period_ns
        self._refs: dict[tuple[str, str], _Reference] = {}
        self._long_run_var: dict[tuple[str, str], float] = {}  # each pair's latest, kept across references
        self.watch = InnovationWatch(est, lambda d, v: cusum_threshold(d, v, self.arl_samples), MIN_REFERENCE,
                                     period_ns)  # fmt: skip
        self.budget_s = budget_s  # of each hop, all stages: renewing references waits when the hop is over it
        self._s_per_table = 0.0  # measured seconds per reference table (0: not yet)
        kinds = ("alarms", "confirmed", "rejected", "sentinel_pairs", "references", "innovation_alarms",
                 "innovation_confirmed", "innovation_cusum_alarms")  # fmt: skip
        self.counts = dict.fromkeys(kinds, 0)
        self.sentinel = Sentinel(est, detector, nulls, self.counts, self._set_reference, window_len=window_len,
                                 period_ns=period_ns, hop_samples=hop_samples,
                                 sentinel_len=min(sentinel_len, window_len), persist=persist)  # fmt: skip
        # load (or compile) the kernels now, not inside the first hop that scores samples or runs the sentinel
        evidence(np.zeros((1, 2, 2), np.float32), np.zeros(1), np.zeros((1, 1)), np.zeros((1, 1)))
        rank_transform(np.zeros((2, 4)), est.ties)

    @property
    def alpha(self) -> float:
        """The sentinel's false-alarm rate per pair and hop; the engine sets it from its budget."""
        return self.sentinel.alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self.sentinel.alpha = value

    def forget(self, channels: set[str]) -> None:
        """Drop the state of pairs with a retired channel."""
        for state in (self._refs, self.sentinel.streak, self.sentinel.tested, self._long_run_var, self.watch.refs):
            for pair in [p for p in state if p[0] in channels or p[1] in channels]:
                del state[pair]

    def step(self, hop: Hop, names: list[str], pairs: np.ndarray) -> list[ChangeEvent]:
        """One hop, after the window's verdicts: pairs (P, 2) are all the engine's pairs (channel indices); the
        hop's network pairs (with the screen: those it flagged) are the ones the sentinel may test."""
        end_tick, ranks, window, fresh = hop.end_tick, hop.ranks, hop.window, hop.fresh
        n_eff, now = np.full(len(pairs), np.nan), np.full(len(pairs), np.nan)  # (P,) where estimated this hop:
        n_eff[hop.pick], now[hop.pick] = hop.n_eff, hop.mi  # effective sizes, window estimates
        sentinel = np.zeros(len(pairs), dtype=bool)
        sentinel[hop.pick[hop.done]] = True
        if hop.flagged is not None:
            sentinel &= hop.flagged
        ranked = np.array([r is not None for r in ranks], dtype=bool)  # (C,)
        ok = ranked[pairs[:, 0]] & ranked[pairs[:, 1]]  # (P,)
        keys = PairNames(names, pairs)
        index = {name: k for k, name in enumerate(names)}
        where = np.full((len(names), len(names)), -1, dtype=np.int64)  # (C, C) -> pair index
        where[pairs[:, 0], pairs[:, 1]] = np.arange(len(pairs))
        held_keys = [p for p in self.detector.held_pairs() if p[0] in index and p[1] in index]
        held = np.array([where[index[a], index[b]] for a, b in held_keys], dtype=np.int64)
        held = held[held >= 0]
        held = held[ok[held]]
        keep = {keys[k] for k in held}
        for refs in (self._refs, self.watch.refs):  # a pair no longer held dependent keeps no reference
            for key in [p for p in refs if p not in keep]:
                del refs[key]
        candidates = np.flatnonzero(sentinel & ok)
        watched = np.array([k for k in candidates if self.detector.is_dependent(keys[k]) is False], dtype=np.int64)
        events = self._decouple(end_tick, keys, pairs, ranks, window, fresh, held, now)
        left_s = self.budget_s - (time.perf_counter() - hop.began)
        if math.isfinite(self.budget_s):  # live: a matrix whose pairs all turn dependent at once gets its references
            left_s = min(left_s, REFERENCE_SHARE * self.hop_samples * self.period_ns / 1e9)  # over hops, each on time
        self._refresh(end_tick, keys, pairs, ranks, window, fresh, n_eff, held, left_s)
        budget = max(SENTINEL_MIN_PAIRS, math.ceil(SENTINEL_SHARE * int(np.isfinite(n_eff).sum())))
        events += self.sentinel.test(end_tick, keys, pairs, window, fresh, watched, budget)
        return events

    # -- decoupling ---------------------------------------------------------------------------------------
    def _decouple(
        self, end_tick: int, keys: PairNames, pairs: np.ndarray, ranks: list[np.ndarray | None],
        window: np.ndarray, fresh: np.ndarray, rows: np.ndarray, now: np.ndarray,
    ) -> list[ChangeEvent]:  # fmt: skip
        n, period = self.window_len, self.period_ns
        groups: dict[int, list[int]] = {}  # by samples new since the last score (one group unless a hop was skipped)
        for k in rows:
            ref = self._refs.get(keys[k])
            new = 0 if ref is None else int(min(n, (end_tick - ref.seen_tick) // period))
            if new > 0:
                groups.setdefault(new, []).append(k)
        alarms = []
        for new, ks in groups.items():
            refs = [self._refs[keys[k]] for k in ks]
            sel = pairs[ks]
            u = np.stack([ranks[a][n - new :] for a in sel[:, 0]])  # (P, new): only the new samples are copied
            v = np.stack([ranks[b][n - new :] for b in sel[:, 1]])
            e = evidence(np.stack([r.theta for r in refs]), np.array([r.log_z for r in refs]), u, v)  # (P, new)
            inc = np.array([r.allowance for r in refs])[:, None] - e
            inc[~(fresh[sel[:, 0], n - new :] | fresh[sel[:, 1], n - new :])] = 0.0  # a row both repeat: no news
            s = np.array([r.s for r in refs])
            zero = np.array([r.zero_tick for r in refs], dtype=np.int64)
            for c in range(new):  # the CUSUM, sample by sample, all pairs at once
                s = np.maximum(0.0, s + inc[:, c])
                zero = np.where(s == 0.0, end_tick - (new - 1 - c) * period, zero)
            for r, k, sk, zk in zip(refs, ks, s.tolist(), zero.tolist(), strict=True):
                r.s, r.zero_tick, r.seen_tick = sk, zk, end_tick
                if sk > r.threshold:
                    alarms.append(k)
        self.counts["alarms"] += len(alarms)
        by_len: dict[int, list[int]] = {}
        early: list[int] = []  # smooth pairs with too few samples since the onset for their levels
        longest = max((m for m in CONFIRM_LENGTHS if m <= n), default=0)
        for k in alarms:
            ref = self._refs[keys[k]]
            since = (end_tick - ref.zero_tick) // period
            # the shortest length that holds CONFIRM_N_EFF effective samples (smooth pairs: the longest)
            need = min((m for m in CONFIRM_LENGTHS if m <= n and m * ref.share >= (
                SHORTEST_N_EFF if m == CONFIRM_LENGTHS[-1] else CONFIRM_N_EFF)), default=longest)  # fmt: skip
            fit = [m for m in CONFIRM_LENGTHS if need <= m <= min(since, n)]
            if fit:  # otherwise too few samples since the onset: a later hop confirms
                by_len.setdefault(fit[0], []).append(k)
            elif self.est.prewhiten != "ar" and since >= INNOVATIONS_SINCE:  # smooth: its innovations may tell now
                early.append(k)
        began = [self._refs[keys[k]].zero_tick for k in early]
        events = self._confirm_by_innovations(end_tick, keys, pairs, window, fresh, early, began) if early else []
        events += self._watch_innovations(end_tick, keys, pairs, window, fresh, rows)
        for m, alarmed in by_len.items():
            ks = [k for k in alarmed if keys[k] in self._refs]  # not confirmed on its innovations meanwhile
            if not ks:
                continue
            mi, ne, _, _ = short_estimates(self.est, window, fresh, pairs[ks], m)
            # a smooth pair's levels hold few samples: its innovations must no longer show the relation either
            smooth = [q for q, k in enumerate(ks) if self._refs[keys[k]].share < WHITE_FROM]
            still = np.zeros(len(ks), dtype=bool)
            if smooth and self.est.prewhiten != "ar":
                still[smooth] = self._still_shown(window, fresh, pairs[[ks[q] for q in smooth]], m)
            for k, x, lo, held in zip(ks, mi.tolist(), self.nulls(m).independent_below(ne).tolist(), still):  # noqa: B905
                ref = self._refs[keys[k]]
                # half the reference's level, and of the window's estimate now (mostly samples before the onset: a
                # table that read the pair high must not let a smooth pair's wide null pass its usual level)
                half = min(ref.allowance * 2.0, now[k] / 2.0) if np.isfinite(now[k]) else ref.allowance * 2.0
                if x < lo and x < half and not held:  # within the null, and well below what the pair showed
                    ev = self.detector.fast_change(keys[k], "became-independent", x, end_tick, ref.zero_tick,
                                                   self._hold_ns(end_tick, ref.zero_tick))  # fmt: skip
                    del self._refs[keys[k]]
                    if ev is not None:
                        self.counts["confirmed"] += 1
                        events.append(ev)
                elif (x >= lo and x >= half) or held or m == longest:  # still dependent, or undecided at the
                    self.counts["rejected"] += 1  # longest: a new shape, or a smooth pair's null too wide to tell
                    del self._refs[keys[k]]
        return events

    def _confirm_by_innovations(
        self, end_tick: int, keys: PairNames, pairs: np.ndarray, window: np.ndarray, fresh: np.ndarray, ks: list[int],
        zero: list[int],
    ) -> list[ChangeEvent]:  # fmt: skip
        """Decouplings of smooth pairs confirmed on their innovations, before their levels hold enough effective
        samples: the innovations over the samples since the onset (the newest 64, 128 or 256) within the null of
        independent pairs at their effective size and below half their level over the ``INNOVATIONS_BEFORE``
        samples before the onset, which must have been dependent (above that null's 99th percentile). Pairs
        not confirmed wait for their levels. ``zero`` (per pair of ks): the onset tick, from either CUSUM."""
        n, period = self.window_len, self.period_ns
        shortest = INNOVATIONS_SINCE
        room = [x for x in CONFIRM_LENGTHS if shortest <= x <= n - shortest]  # since the onset, leaving some before
        since = (end_tick - np.array(zero, dtype=np.int64)) // period
        fits = [q for q, s in enumerate(since.tolist()) if room and min(room) <= s <= n - shortest]
        ks, zero, since = [ks[q] for q in fits], [zero[q] for q in fits], since[fits]
        m = np.array([max(x for x in room if x <= s) for s in since.tolist()], dtype=np.int64)
        events = []
        for length in np.unique(m).tolist():
            sel = np.flatnonzero(m == length)
            ps = pairs[[ks[q] for q in sel]]
            watched = [self.watch.refs.get(keys[ks[q]]) for q in sel]  # folded as watched (engine.innovation_watch)
            fold = Fold.of_pairs([Fold.none(2) if w is None else w.fold for w in watched])
            after, ne_after, _, _ = short_estimates(self.est, window, fresh, ps, length, True, fold=fold)
            at = np.full(len(sel), n) - since[sel]  # window position of each onset
            span = min(INNOVATIONS_BEFORE, n - length)
            was, ne_was, _, _ = short_estimates(self.est, window, fresh, ps, span, True, at, fold)
            with np.errstate(invalid="ignore"):
                gone = after < self.nulls(length).independent_below(ne_after)
                showed = was > self.nulls(span).dependent_above(ne_was, 0.01)
                done = gone & showed & (after < was / 2.0)
            done[done] &= ~self._still_shown(window, fresh, ps[done], length)  # a fold the watch did not take
            for q in np.flatnonzero(done).tolist():
                key, onset = keys[ks[sel[q]]], zero[sel[q]]
                self._refs.pop(key, None)
                self.watch.refs.pop(key, None)
                ev = self.detector.fast_change(key, "became-independent", float(after[q]), end_tick, onset,
                                               self._hold_ns(end_tick, onset))  # fmt: skip
                if ev is not None:
                    self.counts["confirmed"] += 1
                    self.counts["innovation_confirmed"] += 1
                    events.append(ev)
        return events

    def _watch_innovations(
        self, end_tick: int, keys: PairNames, pairs: np.ndarray, window: np.ndarray, fresh: np.ndarray,
        rows: np.ndarray,
    ) -> list[ChangeEvent]:  # fmt: skip
        """The innovation CUSUMs of held smooth pairs (engine.innovation_watch): an alarm with 64 samples or more
        since its onset is confirmed on the innovations; one still unconfirmed at 128 starts again from 0."""
        ks = [int(k) for k in rows if keys[k] in self.watch.refs]
        if not ks:
            return []
        alarmed = [ks[q] for q in self.watch.score([keys[k] for k in ks], pairs[ks], window, end_tick)]
        zero = [self.watch.refs[keys[k]].zero_tick for k in alarmed]
        shortest = INNOVATIONS_SINCE
        ready = [(k, z) for k, z in zip(alarmed, zero, strict=True) if (end_tick - z) // self.period_ns >= shortest]
        if not ready:
            return []
        self.counts["innovation_cusum_alarms"] += len(ready)
        events = self._confirm_by_innovations(
            end_tick, keys, pairs, window, fresh, *map(list, zip(*ready, strict=True))
        )
        for k, z in ready:
            w = self.watch.refs.get(keys[k])
            if w is not None and (end_tick - z) // self.period_ns >= 2 * shortest:  # not confirmed: a false alarm
                w.s = 0.0
                self.counts["rejected"] += 1
        return events

    def _still_shown(self, window: np.ndarray, fresh: np.ndarray, pairs: np.ndarray, m: int) -> np.ndarray:
        """Which pairs' (P, 2) innovations on their newest m rows still show dependence, on any comparison of
        ``FOLDS`` (the folds' signs read anew: a relation's turns can move), each at ``STILL_ALPHA``."""
        z = float(norm.isf(STILL_ALPHA / 2))
        return innovation_tests(self.est, window, fresh, pairs, (m,), lambda k, ne: self.nulls(k).dependent_above(
            ne, STILL_ALPHA, self.detector.min_effect), lambda k: z)[0] > 0  # fmt: skip

    def _hold_ns(self, end_tick: int, onset_tick: int) -> int:
        """From now until the window holds only samples after the onset."""
        return max(0, onset_tick + self.window_len * self.period_ns - end_tick)

    # -- references -----------------------------------------------------------------------------------
    def _refresh(
        self, end_tick: int, keys: PairNames, pairs: np.ndarray, ranks: list[np.ndarray | None], window: np.ndarray,
        fresh: np.ndarray, n_eff: np.ndarray, rows: np.ndarray, left_s: float,
    ) -> None:  # fmt: skip
        """New references for held pairs without one, and for those whose table is a window old while their CUSUM
        rests at 0; about one window's worth of pairs per window, pairs without one first; all within left_s, what
        is left of the hop's budget (at least one pair a hop)."""
        n, period = self.window_len, self.period_ns
        missing = [k for k in rows if keys[k] not in self._refs and not self.detector.holding(keys[k], end_tick)]
        stale = [k for k in rows if (r := self._refs.get(keys[k])) is not None and r.s == 0.0
                 and end_tick - r.made_tick >= n * period]  # fmt: skip
        stale.sort(key=lambda k: self._refs[keys[k]].made_tick)
        budget = len(missing) + max(8, math.ceil(len(rows) * 2 * self.hop_samples / n))
        # within what is left of the hop (the first batch, untimed, at most PROBE_TABLES): a matrix whose pairs all
        # turn dependent at once gets its references over a few hops, not in one overlong hop
        fit = min(budget, left_s / self._s_per_table) if self._s_per_table > 0 else PROBE_TABLES
        chosen = (missing + stale)[: max(1, int(min(budget, fit)))]
        if not chosen:
            return
        sel = pairs[chosen]
        t0 = time.perf_counter()
        u = np.stack([r if r is not None else np.full(n, 0.5) for r in ranks])
        theta, log_z, hist = pair_tables(self.est, u, sel[:, 0], sel[:, 1])
        per = (time.perf_counter() - t0) / len(chosen)
        self._s_per_table = per if self._s_per_table == 0 else 0.7 * self._s_per_table + 0.3 * per
        mean, var = window_moments(theta, log_z, hist)
        smooth = []
        for q, k in enumerate(chosen):
            ne = n_eff[k] if np.isfinite(n_eff[k]) else float(n)
            share = max(ne, 2.0) / n
            self._set_reference(keys[k], theta[q], float(log_z[q]), float(mean[q]), float(var[q]) / share, share,
                                end_tick)  # fmt: skip
            if share < WHITE_FROM and keys[k] in self._refs and fresh[sel[q]].all():  # both channels on the clock
                smooth.append(q)
        if smooth and self.est.prewhiten != "ar":  # their innovations get a CUSUM of their own
            both = sel[smooth]
            self.watch.make([keys[chosen[q]] for q in smooth], np.concatenate([window[both[:, 0]], window[both[:, 1]]]),
                            end_tick)  # fmt: skip

    def _set_reference(
        self, key: tuple[str, str], theta: np.ndarray, log_z: float, mean: float, long_run_var: float, share: float,
        end_tick: int,
    ) -> None:  # fmt: skip
        """A pair's reference from its window's evidence: mean (nats), long-run variance (per sample; at least 0.7 x
        the previous reference's, since one window's estimate of it can come out low) and effective share."""
        if mean < MIN_REFERENCE:
            self._refs.pop(key, None)
            return
        drift = mean / 4.0
        lrv = max(long_run_var, 0.7 * self._long_run_var.get(key, 0.0), 1e-6)
        self._long_run_var[key] = lrv
        h = cusum_threshold(drift, lrv, self.arl_samples)
        self._refs[key] = _Reference(theta, log_z, drift, h, end_tick, end_tick, share, 0.0, end_tick)
        self.counts["references"] += 1
