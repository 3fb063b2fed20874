"""The innovation CUSUM of smooth held pairs: quiet while the pair holds, an alarm soon after it decouples."""

from __future__ import annotations

import numpy as np
from scipy.signal import lfilter

from streamcorr import Estimator
from streamcorr.engine.fast import ARL_PAIR_HOURS, MIN_REFERENCE
from streamcorr.engine.innovation_watch import InnovationWatch
from streamcorr.estimate.evidence import cusum_threshold

PERIOD_NS = 10_000_000  # 100 Hz
WINDOW = 1024
HOP = 50


def _smooth(rng: np.random.Generator, n: int) -> np.ndarray:
    x = lfilter([1.0], [1.0, -np.exp(-1 / 20)], rng.standard_normal(n))  # AR(1), time constant 20 samples
    return x / x.std()


def _run(watch: InnovationWatch, x: np.ndarray, y: np.ndarray) -> list[int]:
    """The watch made on the first window of (x, y), then scored hop by hop; the sample index of each alarm."""
    watch.make([("x", "y")], np.stack([x[:WINDOW], y[:WINDOW]]), WINDOW * PERIOD_NS)
    alarms = []
    for end in range(WINDOW + HOP, len(x) + 1, HOP):
        window = np.stack([x[end - WINDOW : end], y[end - WINDOW : end]])
        if watch.score([("x", "y")], np.array([[0, 1]]), window, end * PERIOD_NS):
            alarms.append(end)
            watch.refs[("x", "y")].s = 0.0
    return alarms


def test_a_steady_smooth_pair_gives_no_alarm_and_a_decoupled_one_alarms_within_a_second() -> None:
    """A smooth pair (y = x + noise, both AR(1)) scored for 3 minutes gives no alarm (the run length is a thousand
    pair-hours); the same pair decoupled after its reference window alarms within 1 s (100 samples)."""
    rng = np.random.default_rng(611)
    arl = ARL_PAIR_HOURS * 3600e9 / PERIOD_NS
    watch = InnovationWatch(Estimator(), lambda d, v: cusum_threshold(d, v, arl), MIN_REFERENCE, PERIOD_NS)
    n = WINDOW + 180 * 100
    x = _smooth(rng, n)
    y = x + 0.5 * _smooth(rng, n)
    assert _run(watch, x, y) == []
    assert ("x", "y") in watch.refs  # its innovations showed the dependence
    cut = WINDOW + 2000
    y[cut:] = _smooth(rng, n - cut)
    alarms = _run(watch, x, y)
    assert alarms and cut < alarms[0] <= cut + 100 + HOP, alarms


def test_a_pair_whose_innovations_show_no_dependence_is_not_watched() -> None:
    """Two independent smooth channels give no reference: their innovations' table is flat."""
    rng = np.random.default_rng(612)
    arl = ARL_PAIR_HOURS * 3600e9 / PERIOD_NS
    watch = InnovationWatch(Estimator(), lambda d, v: cusum_threshold(d, v, arl), MIN_REFERENCE, PERIOD_NS)
    watch.make([("x", "y")], np.stack([_smooth(rng, WINDOW), _smooth(rng, WINDOW)]), WINDOW * PERIOD_NS)
    assert watch.refs == {}


def test_a_fold_is_watched_on_the_folded_innovations_and_alarms_soon_after_it_decouples() -> None:
    """y = x^2 + noise on smooth x: the watch takes x's innovations folded at x's median (their table scores
    highest), stays quiet for 3 minutes while the pair holds and alarms within 1.5 s once y is replaced."""
    rng = np.random.default_rng(613)
    arl = ARL_PAIR_HOURS * 3600e9 / PERIOD_NS
    watch = InnovationWatch(Estimator(), lambda d, v: cusum_threshold(d, v, arl), MIN_REFERENCE, PERIOD_NS)
    n = WINDOW + 180 * 100
    x = _smooth(rng, n)
    y = x**2 + 0.3 * _smooth(rng, n)
    assert _run(watch, x, y) == []
    fold_at = watch.refs[("x", "y")].fold_at
    assert np.isfinite(fold_at[0]) and np.isnan(fold_at[1])
    assert abs(fold_at[0] - np.median(x[:WINDOW])) < 1e-12
    cut = WINDOW + 2000
    y[cut:] = _smooth(rng, n - cut)
    alarms = _run(watch, x, y)
    assert alarms and cut < alarms[0] <= cut + 150 + HOP, alarms
