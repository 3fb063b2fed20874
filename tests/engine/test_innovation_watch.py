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
    """y = x^2 + noise on smooth x: the watch takes x's innovations folded by x's quartiles with the local slope's
    signs (-, -, +, +; their table scores highest), stays quiet for 3 minutes while the pair holds and alarms within
    1.5 s once y is replaced."""
    rng = np.random.default_rng(613)
    arl = ARL_PAIR_HOURS * 3600e9 / PERIOD_NS
    watch = InnovationWatch(Estimator(), lambda d, v: cusum_threshold(d, v, arl), MIN_REFERENCE, PERIOD_NS)
    n = WINDOW + 180 * 100
    x = _smooth(rng, n)
    y = x**2 + 0.3 * _smooth(rng, n)
    assert _run(watch, x, y) == []
    fold = watch.refs[("x", "y")].fold
    assert fold.signs.tolist() == [[-1, -1, 1, 1], [1, 1, 1, 1]]
    assert np.allclose(fold.edges[0], np.quantile(x[:WINDOW], [0.25, 0.5, 0.75]))
    cut = WINDOW + 2000
    y[cut:] = _smooth(rng, n - cut)
    alarms = _run(watch, x, y)
    assert alarms and cut < alarms[0] <= cut + 150 + HOP, alarms


def test_a_relation_with_two_turns_is_watched_on_its_fold_and_alarms_soon_after_it_decouples() -> None:
    """y = sin(2x) + noise on smooth x turns twice (at x = +-0.79): the fold read from a pair's first window takes
    the signs -, +, +, - over x's quartiles in most pairs (a window that saw little of x's range reads the slopes
    of what it saw, and such a pair can alarm later: the fast path confirms an alarm before any event); once y is
    replaced, an alarm follows within 1.5 s."""
    rng = np.random.default_rng(614)
    arl = ARL_PAIR_HOURS * 3600e9 / PERIOD_NS
    n = WINDOW + 60 * 100
    signs = []
    for _ in range(6):
        watch = InnovationWatch(Estimator(), lambda d, v: cusum_threshold(d, v, arl), MIN_REFERENCE, PERIOD_NS)
        x = _smooth(rng, n)
        y = np.sin(2.0 * x) + 0.3 * _smooth(rng, n)
        cut = WINDOW + 2000
        y[cut:] = _smooth(rng, n - cut)
        alarms = [a for a in _run(watch, x, y) if a > cut]
        assert alarms and alarms[0] <= cut + 150 + HOP, alarms
        signs.append(watch.refs[("x", "y")].fold.signs[0].tolist())
    assert signs.count([-1, 1, 1, -1]) >= 4, signs
