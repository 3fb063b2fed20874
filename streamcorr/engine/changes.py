"""Change events on MI cells, with hysteresis calibrated on the estimator's null at each pair's effective size.

"Dependent" means: above the (1 - alpha) quantile of the estimates the model gives on independent pairs
of the same effective sample size (:mod:`streamcorr.estimate.significance`: a window of a smooth signal holds far
fewer independent samples than ticks), and above ``min_effect`` nats, so that long windows do not flag
negligible dependence. ``alpha`` is per pair and evaluation; the engine derives it from
``changes.false_alarms_per_hour`` for the whole matrix (or takes ``changes.false_alarm_rate`` as given). A
dependent pair becomes independent again below the null's 90th percentile at its effective size (a level
an independent pair is below nine evaluations in ten). A pair must stay on the new side for ``persist``
consecutive evaluations before its state flips; while dependent, moves larger than both ``delta`` nats and
``rel_delta`` of the current level (the estimator's spread grows with MI) and persist the same way are
reported as rise / fall.

A pair that has never looked independent (below ``independent_below``, or failed the dependence screen) gets
``became-dependent`` with ``initial=True`` once ``persist`` evaluations confirm it: the dependence was there when
the pair was first seen, not an onset (a smooth pair whose evidence takes several windows to build, or which
waits for its own null, becomes dependent late but was never seen independent).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from ..cache import cache_dir
from ..config import MAX_FALSE_ALARM_RATE
from ..errors import ConfigError

if TYPE_CHECKING:  # the estimator's null (numba, scipy) loads with the detector, not with ChangeEvent
    from ..estimate.copula import Ties
    from ..estimate.significance import NullTable

log = logging.getLogger("streamcorr.engine.changes")


EventKind = Literal["rise", "fall", "became-dependent", "became-independent", "lag-shift"]
EventPath = Literal["window", "fast"]


@dataclass(frozen=True)
class ChangeEvent:
    pair: tuple[str, str]
    previous: float  # nats: the last reported level
    current: float  # nats
    t_ns: int
    kind: EventKind
    # True for the verdict of a pair's first assessment (became-dependent only): dependent from the start,
    # not an onset seen in the stream
    initial: bool = False
    onset_t_ns: int | None = None  # stream time the change is estimated to have begun (None: no estimate)
    path: EventPath = "window"  # which detector saw it: the window estimate, or the fast path (engine.fast)
    # lag-shift (streamcorr.engine.lags): the pair's best lag now and as last reported, seconds (positive: the
    # second channel follows the first); previous and current are the MI at those lags
    lag_s: float | None = None
    previous_lag_s: float | None = None


class ChangeDetector:
    """Per-pair hysteresis state machine; feed it each evaluation, collect the events it returns.

    >>> from streamcorr.estimate.significance import NullTable
    >>> table = NullTable(256, (0.0, 5.55), (0.5, 0.005), (1.0, 0.02), (0.4, 0.02), null_std=0.02)
    >>> det = ChangeDetector(table, alpha=1e-4, persist=1)
    >>> det.update(("a", "b"), 0.9, 1, n_eff=256.0).kind, det.update(("a", "b"), 0.9, 2, n_eff=256.0)
    ('became-dependent', None)
    >>> det.update(("c", "d"), 0.9, 1, n_eff=3.0) is None  # as high, but smooth: within the null
    True
    """

    def __init__(
        self,
        table: NullTable,
        alpha: float = 1e-3,
        min_effect: float = 0.1,
        delta: float | None = None,
        persist: int = 2,
        rel_delta: float = 0.25,
    ) -> None:
        if persist < 1:
            raise ConfigError(f"persist must be >= 1 evaluation; got {persist}")
        self.table = table
        self.alpha = alpha
        self.min_effect = min_effect
        # default: a move must clear both a practical floor and the null noise by a wide margin
        self.delta = max(0.1, 6 * table.null_std) if delta is None else delta
        if self.delta <= 0:
            raise ConfigError(f"delta must be > 0 nats; got {self.delta}")
        if not 0 <= rel_delta < 10:
            raise ConfigError(f"rel_delta must be in [0, 10); got {rel_delta}")
        self.rel_delta = rel_delta
        self.persist = persist
        self._dependent: dict[tuple[str, str], bool] = {}
        self._level: dict[tuple[str, str], float] = {}
        self._streak: dict[tuple[str, str], tuple[str, int]] = {}
        self._seen_low: set[tuple[str, str]] = set()  # pairs seen independent: a later crossing is an onset
        # pairs the fast path flipped: the window's verdicts wait until this stream time (ns), when it has caught up
        self._hold_until: dict[tuple[str, str], int] = {}

    @property
    def alpha(self) -> float:
        """False-alarm rate per pair and evaluation."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        if not 0 < value < MAX_FALSE_ALARM_RATE:
            raise ConfigError(f"false_alarm_rate must be in (0, {MAX_FALSE_ALARM_RATE:g}); got {value}")
        self._alpha = float(value)

    def thresholds(self, n_eff: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(dependent_above, independent_below) in nats for pairs of these effective sample sizes."""
        hi = self.table.dependent_above(n_eff, self._alpha, self.min_effect)
        return hi, np.minimum(self.table.independent_below(n_eff), hi)

    def _confirm(self, pair: tuple[str, str], candidate: str) -> bool:
        kind, n = self._streak.get(pair, ("", 0))
        n = n + 1 if kind == candidate else 1
        self._streak[pair] = (candidate, n)
        if n >= self.persist:
            del self._streak[pair]
            return True
        return False

    def update(self, pair: tuple[str, str], mi: float, t_ns: int, n_eff: float | None = None) -> ChangeEvent | None:
        """One evaluation of a pair (n_eff: its effective sample size; None: every sample independent)."""
        hi, lo = self.thresholds(np.array([self.table.window_len if n_eff is None else n_eff], dtype=float))
        return self._step(pair, mi, t_ns, float(hi[0]), float(lo[0]))

    def update_many(
        self,
        pairs: list[tuple[str, str]],
        mi: np.ndarray,
        n_eff: np.ndarray,
        t_ns: int,
        own: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> list[ChangeEvent]:
        """update() for many pairs of one hop, thresholds computed together; ``own`` gives pairs' own
        (dependent_above, independent_below) where finite (their surrogate nulls), the table's elsewhere."""
        n_eff = np.asarray(n_eff, dtype=float)
        hi, lo = self.thresholds(n_eff)
        # a rise or fall must also clear the null's own spread at the pair's effective size (smooth pairs move more)
        step = 2.0 * (self.table.independent_below(n_eff) - self.table.median_at(n_eff))
        if own is not None:
            has = np.isfinite(own[0])
            hi = np.where(has, np.maximum(own[0], self.min_effect), hi)
            lo = np.where(has, np.minimum(own[1], hi), lo)
        events = []
        for k, pair in enumerate(pairs):
            ev = self._step(pair, float(mi[k]), t_ns, float(hi[k]), float(lo[k]), float(step[k]))
            if ev is not None:
                events.append(ev)
        return events

    def _step(
        self, pair: tuple[str, str], mi: float, t_ns: int, hi: float, lo: float, step: float = 0.0
    ) -> ChangeEvent | None:
        if not np.isfinite(mi):
            return None
        dependent = self._dependent.get(pair)
        if dependent is None:  # first assessment: independent until evidence says otherwise
            self._dependent[pair] = dependent = False
            self._level[pair] = mi
        prev = self._level[pair]
        held = self._hold_until.get(pair)
        if held is not None:
            if t_ns < held:  # the window still holds samples from before the fast path's change
                return None
            del self._hold_until[pair]
            self._level[pair] = prev = mi  # the window caught up: its level, not the short window's, is the base
        if not dependent and mi < lo:
            self._seen_low.add(pair)
        candidate: EventKind | None = None
        if not dependent and mi > hi:
            candidate = "became-dependent"
        elif dependent and mi < lo:
            candidate = "became-independent"
        elif dependent and abs(mi - prev) > max(self.delta, self.rel_delta * prev, step):
            candidate = "rise" if mi > prev else "fall"
        if candidate is None:
            self._streak.pop(pair, None)
            if not dependent:
                self._level[pair] = mi
            return None
        if not self._confirm(pair, candidate):
            return None
        initial = candidate == "became-dependent" and pair not in self._seen_low
        if candidate == "became-independent":
            self._seen_low.add(pair)
        if candidate in ("became-dependent", "became-independent"):
            self._dependent[pair] = candidate == "became-dependent"
        self._level[pair] = mi
        return ChangeEvent(pair, prev, mi, t_ns, candidate, initial=initial)

    def fast_change(
        self, pair: tuple[str, str], kind: EventKind, mi: float, t_ns: int, onset_t_ns: int, hold_ns: int
    ) -> ChangeEvent | None:
        """A state change the fast path (streamcorr.engine.fast) confirmed: flip the pair now and hold the window's
        verdicts on it for hold_ns (until its window holds only samples after the change). None when the pair's
        state is already ``kind`` or it was never assessed."""
        dependent = self._dependent.get(pair)
        if dependent is None or dependent == (kind == "became-dependent"):
            return None
        prev = self._level[pair]
        initial = kind == "became-dependent" and pair not in self._seen_low
        if kind == "became-independent":
            self._seen_low.add(pair)
        self._dependent[pair] = kind == "became-dependent"
        self._level[pair] = mi
        self._streak.pop(pair, None)
        self._hold_until[pair] = t_ns + hold_ns
        onset = None if initial else onset_t_ns  # never seen independent: the dependence predates what was seen
        return ChangeEvent(pair, prev, mi, t_ns, kind, initial=initial, onset_t_ns=onset, path="fast")

    def holding(self, pair: tuple[str, str], t_ns: int) -> bool:
        """True while the window's verdicts on a pair wait for its window to catch up with a fast change."""
        return t_ns < self._hold_until.get(pair, t_ns)

    def prime(self, pair: tuple[str, str], level: float = 0.0) -> None:
        """Start a pair not yet evaluated as independent at `level` nats (e.g. it failed the dependence screen),
        so that its first evaluation above the threshold counts towards became-dependent as an onset."""
        if pair not in self._dependent:
            self._dependent[pair] = False
            self._level[pair] = level
            self._seen_low.add(pair)

    def held_pairs(self) -> list[tuple[str, str]]:
        """Every pair now held dependent."""
        return [p for p, dependent in self._dependent.items() if dependent]

    def is_dependent(self, pair: tuple[str, str]) -> bool | None:
        return self._dependent.get(pair)

    def forget(self, channels: set[str]) -> None:
        """Drop the state of every pair with a channel in ``channels`` (retired): a name that returns starts anew."""
        for state in (self._dependent, self._level, self._streak, self._hold_until):
            for pair in [p for p in state if p[0] in channels or p[1] in channels]:
                del state[pair]
        self._seen_low = {p for p in self._seen_low if p[0] not in channels and p[1] not in channels}


# Null tables shipped for the shipped weights at windows 256, 512, 1024 and 2048 (CPU, the weights' tie policy;
# training.null_calibrations), and for the default weights at the short windows 32, 64 and 128 and with mid-rank
# ties at 256 (first-start measurements, FIRST_START_PAIRS pairs), so most first starts measure nothing: each file
# is a STREAMCORR_CACHE_DIR cache file.
SHIPPED_NULL_DIR = Path(__file__).parents[1] / "data" / "null"
SHIPPED_WINDOWS = (256, 512, 1024, 2048)
FIRST_START_PAIRS = 3000  # independent pairs a first start at another window length measures
_TABLES: dict[tuple[str, int], NullTable] = {}


def calibration_file_name(fingerprint: str, window_len: int) -> str:
    """The cache file of one null table (in the user's cache and in SHIPPED_NULL_DIR)."""
    return f"nulltable-{fingerprint}-{window_len}.json"


def cached_calibration(
    fingerprint: str,
    estimate_batch: Callable[[np.ndarray, np.ndarray], np.ndarray],
    window_len: int,
    ties: Ties = "jitter",
) -> NullTable:
    """Null table per weights (and device: ``fingerprint``) and window length: measured once (thousands of
    independent pairs), then cached in the process and on disk (streamcorr.cache), since it is deterministic."""
    key = (fingerprint, window_len)
    if key in _TABLES:
        return _TABLES[key]
    path = cache_dir() / calibration_file_name(fingerprint, window_len)
    from ..estimate.significance import NullTable

    table: NullTable | None = None
    for origin, known in (("cached", path), ("shipped", SHIPPED_NULL_DIR / path.name)):  # the user's cache first
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            table = NullTable.from_json(known.read_text())
            log.info("null calibration for window.samples=%d: %s (%s)", window_len, origin, known)
            break
    if table is None:
        t0 = time.monotonic()
        table = NullTable.measure(estimate_batch, window_len, n_pairs=FIRST_START_PAIRS, ties=ties)
        log.info("null calibration for window.samples=%d: measured in %.0f s (%s independent pairs)",
                 window_len, time.monotonic() - t0, f"{FIRST_START_PAIRS:,}")  # fmt: skip
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(table.to_json())
            tmp.replace(path)
        except OSError as exc:  # a read-only home only costs the next start the measurement again
            log.info("could not cache the null table in %s: %s", path.parent, exc)
    _TABLES[key] = table
    return table


def calibration_origin(fingerprint: str, window_len: int) -> Literal["loaded", "cached", "shipped", "measure"]:
    """Where `cached_calibration` takes the null table for these weights and window from: already loaded in this
    process, the user's cache, the files shipped in the package, or a measurement (a first start)."""
    name = calibration_file_name(fingerprint, window_len)
    if (fingerprint, window_len) in _TABLES:
        return "loaded"
    if (cache_dir() / name).is_file():
        return "cached"
    return "shipped" if (SHIPPED_NULL_DIR / name).is_file() else "measure"


def null_windows() -> int:
    """Independent pairs a first-start null table measures."""
    return FIRST_START_PAIRS


def calibration_eta_s(window_len: int) -> float:
    """Expected seconds of a first-start null table on a small CPU (the progress line says it)."""
    # measured on a 2-core CPU: about 1 ms per pair plus 10 us per window sample (generation, ACF, network)
    return (1e-3 + 1e-5 * window_len) * FIRST_START_PAIRS


def first_start_note(estimator_settings: dict[str, object], window_len: int) -> str | None:
    """What a first start with these estimator settings and window will measure before its first hop (a null
    table no file holds), or None; loads the weights (as the daemon's start would) to know their fingerprint."""
    from ..estimate.estimator import Estimator

    est = Estimator(**estimator_settings)  # type: ignore[arg-type]
    if calibration_origin(est.fingerprint, window_len) != "measure":
        return None
    eta = calibration_eta_s(window_len)
    return (f"the first start measures the change detector's null calibration for window.samples={window_len} "
            f"(about {eta:.0f} s on 2 cores; then cached in {cache_dir()}); the shipped windows 256, 512, 1024 and "
            "2048 start at once")  # fmt: skip
