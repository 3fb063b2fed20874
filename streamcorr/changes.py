"""Change events on MI cells, with hysteresis calibrated on the estimator's null distribution.

"Dependent" means: above the (1 - false_alarm_rate) quantile of the estimates the
model gives on independent data at the configured window length (and above
``min_effect`` nats, so that long windows do not flag negligible dependence), so
a threshold is a false-alarm rate per evaluation rather than a guess. A
dependent pair becomes independent again below the null's 90th percentile (the
hysteresis band). A pair must stay on the new side for ``persist`` consecutive
evaluations before its state flips; while dependent, moves larger than
both ``delta`` nats and ``rel_delta`` of the current level (the estimator's spread
grows with MI) and persist the same way are reported as rise / fall.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from .cache import cache_dir
from .errors import ConfigError

log = logging.getLogger("streamcorr.changes")

# false_alarm_rate must lie in (0, MAX_FALSE_ALARM_RATE): above it the "dependent" quantile is no longer a tail
MAX_FALSE_ALARM_RATE = 0.1

EventKind = Literal["rise", "fall", "became-dependent", "became-independent"]


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


@dataclass(frozen=True)
class NullCalibration:
    """Thresholds from MI estimates on independent windows of one length."""

    window_len: int
    dependent_above: float  # max((1 - false_alarm_rate) quantile, min_effect)
    independent_below: float  # 90th percentile of the null: the hysteresis band's lower edge
    null_std: float
    false_alarm_rate: float

    @classmethod
    def measure(
        cls,
        estimate_batch: Callable[[np.ndarray, np.ndarray], np.ndarray],
        window_len: int,
        false_alarm_rate: float = 1e-3,
        min_effect: float = 0.1,
        n_pairs: int | None = None,
        seed: int = 0,
    ) -> NullCalibration:
        if not 0 < false_alarm_rate < MAX_FALSE_ALARM_RATE:
            raise ConfigError(f"false_alarm_rate must be in (0, {MAX_FALSE_ALARM_RATE:g}); got {false_alarm_rate}")
        n = n_pairs or null_windows(false_alarm_rate)
        rng = np.random.default_rng(seed)
        null = estimate_batch(rng.standard_normal((n, window_len)), rng.standard_normal((n, window_len)))
        upper = max(float(np.quantile(null, 1 - false_alarm_rate)), min_effect)
        return cls(window_len, upper, float(np.quantile(null, 0.9)), float(null.std()), false_alarm_rate)


class ChangeDetector:
    """Per-pair hysteresis state machine; feed it each evaluation, collect the events it returns."""

    def __init__(
        self, calibration: NullCalibration, delta: float | None = None, persist: int = 2, rel_delta: float = 0.25
    ) -> None:
        if persist < 1:
            raise ConfigError(f"persist must be >= 1 evaluation; got {persist}")
        self.cal = calibration
        # default: a move must clear both a practical floor and the null noise by a wide margin
        self.delta = max(0.1, 6 * calibration.null_std) if delta is None else delta
        if self.delta <= 0:
            raise ConfigError(f"delta must be > 0 nats; got {self.delta}")
        if not 0 <= rel_delta < 10:
            raise ConfigError(f"rel_delta must be in [0, 10); got {rel_delta}")
        self.rel_delta = rel_delta
        self.persist = persist
        self._dependent: dict[tuple[str, str], bool] = {}
        self._level: dict[tuple[str, str], float] = {}
        self._streak: dict[tuple[str, str], tuple[str, int]] = {}

    def _confirm(self, pair: tuple[str, str], candidate: str) -> bool:
        kind, n = self._streak.get(pair, ("", 0))
        n = n + 1 if kind == candidate else 1
        self._streak[pair] = (candidate, n)
        if n >= self.persist:
            del self._streak[pair]
            return True
        return False

    def update(self, pair: tuple[str, str], mi: float, t_ns: int) -> ChangeEvent | None:
        if not np.isfinite(mi):
            return None
        dependent = self._dependent.get(pair)
        if dependent is None:  # first evaluation sets the state silently
            self._dependent[pair] = mi > self.cal.dependent_above
            self._level[pair] = mi
            return None
        prev = self._level[pair]
        candidate: EventKind | None = None
        if not dependent and mi > self.cal.dependent_above:
            candidate = "became-dependent"
        elif dependent and mi < self.cal.independent_below:
            candidate = "became-independent"
        elif dependent and abs(mi - prev) > max(self.delta, self.rel_delta * prev):
            candidate = "rise" if mi > prev else "fall"
        if candidate is None:
            self._streak.pop(pair, None)
            return None
        if not self._confirm(pair, candidate):
            return None
        if candidate in ("became-dependent", "became-independent"):
            self._dependent[pair] = candidate == "became-dependent"
        self._level[pair] = mi
        return ChangeEvent(pair, prev, mi, t_ns, candidate)

    def prime(self, pair: tuple[str, str], level: float = 0.0) -> None:
        """Start a pair not yet evaluated as independent at `level` nats (e.g. it failed the dependence screen),
        so that its first evaluation above the threshold counts towards became-dependent instead of setting
        the state silently."""
        if pair not in self._dependent:
            self._dependent[pair] = False
            self._level[pair] = level

    def is_dependent(self, pair: tuple[str, str]) -> bool | None:
        return self._dependent.get(pair)


# Null calibrations shipped for the default false_alarm_rate and min_effect at windows 256, 512, 1024 and 2048
# (shipped weights, CPU), so most first starts measure nothing: each file is a STREAMCORR_CACHE_DIR cache file.
SHIPPED_NULL_DIR = Path(__file__).with_name("data") / "null"
_CALIBRATIONS: dict[tuple[str, int, float, float], NullCalibration] = {}


def calibration_file_name(fingerprint: str, window_len: int, false_alarm_rate: float, min_effect: float) -> str:
    """The cache file of one calibration (in the user's cache and in SHIPPED_NULL_DIR)."""
    return f"null-{fingerprint}-{window_len}-{false_alarm_rate:g}-{min_effect:g}.json"


def cached_calibration(
    fingerprint: str,
    estimate_batch: Callable[[np.ndarray, np.ndarray], np.ndarray],
    window_len: int,
    false_alarm_rate: float,
    min_effect: float,
) -> NullCalibration:
    """Null calibration per weights (and device: ``fingerprint``) and setting: measured once (thousands of
    windows), then cached in the process and on disk (streamcorr.cache), since it is deterministic."""
    key = (fingerprint, window_len, false_alarm_rate, min_effect)
    if key in _CALIBRATIONS:
        return _CALIBRATIONS[key]
    path = cache_dir() / calibration_file_name(fingerprint, window_len, false_alarm_rate, min_effect)
    cal: NullCalibration | None = None
    for known in (path, SHIPPED_NULL_DIR / path.name):  # the user's cache, then those shipped for common windows
        with contextlib.suppress(OSError, ValueError, TypeError):
            cal = NullCalibration(**json.loads(known.read_text()))
            break
    if cal is None:
        cal = NullCalibration.measure(estimate_batch, window_len, false_alarm_rate, min_effect)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(dataclasses.asdict(cal)))
            tmp.replace(path)
        except OSError as exc:  # a read-only home only costs the next start the measurement again
            log.info("could not cache the null calibration in %s: %s", path.parent, exc)
    _CALIBRATIONS[key] = cal
    return cal


def null_windows(false_alarm_rate: float) -> int:
    """NullCalibration.measure's default sample size: about 10 null estimates beyond the quantile."""
    return int(min(20_000, max(2_000, 10 / false_alarm_rate)))


def calibration_eta_s(window_len: int, false_alarm_rate: float) -> float:
    """Expected seconds of a first-start null calibration on a small CPU (the progress line says it)."""
    # measured on a busy 2-core CPU: about 0.6 ms per window plus 4 us per window sample (512: 27 s, 1024: 48 s)
    return (6e-4 + 4e-6 * window_len) * null_windows(false_alarm_rate)
