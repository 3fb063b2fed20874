import asyncio
import io
import math
from itertools import combinations, pairwise

import numpy as np
import pytest
from rich.console import Console

from streamcorr.demo import check_script, run_live_demo
from streamcorr.demo.rig import CHANNELS, SLOW_CHANNELS, Rig
from streamcorr.errors import ConfigError
from streamcorr.estimate.estimator import default_estimator

WINDOW = 512
RATE = 50.0


def _seed(k: int) -> int:
    """A rig seed drawn from a test's own seeded generator."""
    return int(np.random.default_rng(k).integers(0, 1000))


def _mi_matrix_per_regime(rig: Rig, duration_s: float, n_windows: int = 3) -> list[np.ndarray]:
    """Mean InfoNet MI per pair over n windows lying wholly inside each regime of the script: (R, P)."""
    _, data = rig.arrays(round(duration_s * RATE))
    x = np.stack([data[c] for c in rig.channels])
    bounds = [0.0, *(c.t_s for c in rig.script), duration_s]
    i, j = np.array(list(combinations(range(len(rig.channels)), 2))).T
    out = []
    for a, b in pairwise(bounds):
        s0, s1 = round(a * RATE) + 10, round(b * RATE) - 1
        starts = np.linspace(s0, s1 - WINDOW, n_windows).astype(int)
        mi = [default_estimator().estimate_batch(x[i, s : s + WINDOW], x[j, s : s + WINDOW]) for s in starts]
        out.append(np.mean(mi, axis=0))
    return out


def test_rig_is_deterministic_per_seed():
    """The same seed gives identical frames; another seed gives different ones."""
    seed = _seed(1)
    a = list(Rig(seed).frames(200))
    b = list(Rig(seed).frames(200))
    c = list(Rig(seed + 1).frames(200))
    assert a == b
    assert a != c


def test_frames_carry_every_channel_on_the_clock():
    """Frame k is at t = k / rate_hz and holds a finite float for every channel."""
    rng = np.random.default_rng(1)
    rate = float(rng.choice([25.0, 50.0, 100.0]))
    rig = Rig(2, rate_hz=rate)
    for k, (t, frame) in enumerate(rig.frames(300)):
        assert t == pytest.approx(k / rate)
        assert tuple(frame) == CHANNELS
        assert all(isinstance(v, float) and math.isfinite(v) for v in frame.values())
    assert 16 <= len(CHANNELS) <= 24


def test_arrays_match_frames():
    """arrays(n) returns the same values as n calls of step()."""
    seed = _seed(3)
    t, arr = Rig(seed).arrays(50)
    frames = list(Rig(seed).frames(50))
    assert np.array_equal(t, [f[0] for f in frames])
    assert all(np.array_equal(arr[c], [f[1][c] for f in frames]) for c in CHANNELS)


def test_nan_glitches_are_seeded_and_at_the_requested_rate():
    """nan_rate sends that fraction of samples as NaN, reproducibly, without changing the clean values."""
    seed = _seed(4)
    _, glitchy = Rig(seed, nan_rate=0.05).arrays(2000)
    _, again = Rig(seed, nan_rate=0.05).arrays(2000)
    _, clean = Rig(seed).arrays(2000)
    x = np.stack([glitchy[c] for c in CHANNELS])
    frac = np.isnan(x).mean()
    assert 0.04 < frac < 0.06
    assert np.array_equal(x, np.stack([again[c] for c in CHANNELS]), equal_nan=True)
    ok = ~np.isnan(x)
    assert np.array_equal(x[ok], np.stack([clean[c] for c in CHANNELS])[ok])


def test_bad_settings_raise_config_error():
    """Non-positive rate or script scale, and nan_rate outside [0, 1), are refused with ConfigError."""
    for kw in ({"rate_hz": 0.0}, {"script_scale": -1.0}, {"nan_rate": 1.0}):
        with pytest.raises(ConfigError):
            Rig(0, **kw)
    with pytest.raises(ConfigError):
        list(Rig(0).frames(-1))


def test_script_is_consistent():
    """Script times scale with script_scale; every scripted pair names known channels in CHANNELS order; stable,
    changing and transient pairs do not overlap."""
    rig = Rig(0, script_scale=0.25)
    assert [c.t_s for c in rig.script] == [10.0, 20.0, 30.0]
    order = {c: k for k, c in enumerate(CHANNELS)}
    for change in rig.script:
        for a, b in change.pairs | set(change.transient):
            assert order[a] < order[b]
        kinds = [k for _, k in change.expected]
        assert set(kinds) <= {"became-dependent", "became-independent", "rise", "fall"}
        assert change.expected, change.name
    stable = set(rig.stable_pairs())
    assert not stable & rig.changing_pairs()
    assert not stable & rig.transient_pairs()
    assert len(stable) > 100


def test_regimes_match_the_script():
    """On windows inside each regime, pairs the script changes sit on the stated side of the detector's
    thresholds before and after, and stable pairs stay clearly dependent (> 0.15 nats) or clearly independent
    (< 0.05 nats) in every regime."""
    rig = Rig(_seed(5), script_scale=0.5)
    levels = _mi_matrix_per_regime(rig, duration_s=80.0)
    index = {p: k for k, p in enumerate(combinations(rig.channels, 2))}
    # margins around the detector's thresholds (0.1 nats to become dependent; the null's 90th percentile, about
    # 0.01 nats, to become independent) so that the means of 3 windows classify the regime unambiguously
    for r, change in enumerate(rig.script):
        before, after = levels[r], levels[r + 1]
        for p in change.became_dependent:
            assert before[index[p]] < 0.06 and after[index[p]] > 0.12, (change.name, p)
        for p in change.became_independent:
            assert before[index[p]] > 0.15 and after[index[p]] < 0.03, (change.name, p)
        for p in change.rises:
            assert after[index[p]] - before[index[p]] > 1.0, (change.name, p)
        for p in change.falls:
            assert before[index[p]] - after[index[p]] > 1.0, (change.name, p)
    for p in rig.stable_pairs():
        per_regime = np.array([lv[index[p]] for lv in levels])
        assert (per_regime < 0.05).all() or (per_regime > 0.15).all(), (p, per_regime.round(3))


def test_pearson_blind_pairs_are_pearson_blind():
    """Every Pearson-blind pair has |Pearson r| < 0.1 and MI > 0.3 nats in every regime."""
    rig = Rig(_seed(6), script_scale=0.5)
    t, data = rig.arrays(round(80 * RATE))
    bounds = [0.0, *(c.t_s for c in rig.script), 80.0]
    for a, b in pairwise(bounds):
        seg = (t >= a + 0.5) & (t < b)
        for p in rig.pearson_blind_pairs():
            x, y = data[p[0]][seg], data[p[1]][seg]
            assert abs(np.corrcoef(x, y)[0, 1]) < 0.1, p
            assert default_estimator().estimate(x, y) > 0.3, p


@pytest.mark.slow
def test_engine_reports_the_scripted_changes_and_nothing_on_stable_pairs():
    """Streamed through the engine (512-sample windows, hop 50, demo rise/fall threshold) with the script
    compressed to changes at 20, 40 and 60 s, every expected event arrives within about two windows of its change,
    no stable pair raises any event, and transient pairs only start an excursion within two windows of a change."""
    np.random.default_rng(0)  # the rig draws from its own seeded generator; nothing else is random here
    report = check_script(seed=0, script_scale=0.5, duration_s=80.0)
    hop_s = 50 / RATE
    # A change clears the window after one window length; a new state must then persist for 2 hops. Becoming
    # independent needs two estimates below the null's 90th percentile (~0.01 nats), and overlapping windows make
    # chance exceedances come in runs up to a window long: hence the second window.
    assert not report.missing, str(report)
    assert report.max_delay_s <= 2 * report.window_s + 2 * hop_s, str(report)
    # a new dependence shows within a window, except on the slow load family: its samples are correlated over
    # about a second, so a 10 s window holds a few dozen effective samples and significance takes up to two windows
    dependent = [d for (pair, kind), d in report.delays_s.items()
                 if kind != "became-independent" and not set(pair) & set(SLOW_CHANNELS)]  # fmt: skip
    assert max(dependent) <= report.window_s + 2 * hop_s, str(report)
    assert report.false_events == [], str(report)
    assert report.transient_late == [], str(report)
    assert report.hops >= 60


def test_live_demo_runs_end_to_end_off_a_terminal():
    """The paced demo (rig -> engine -> view) runs to its end off a terminal, printing snapshot lines, the scripted
    changes as they happen, and the events, and returns 0."""
    np.random.default_rng(0)  # the rig is seeded by run_live_demo's seed argument
    buf = io.StringIO()
    rc = asyncio.run(
        run_live_demo(seed=1, speed=50.0, duration_s=16.0, script_scale=0.1, console=Console(file=buf, width=200))
    )
    out = buf.getvalue()
    assert rc == 0
    assert "seq=1 t=1" in out  # the first window closes after 10.24 s of stream
    assert out.count("script: t=") == 3
    with pytest.raises(ConfigError):
        asyncio.run(run_live_demo(speed=0.0))


def test_live_demo_feeds_the_web_view_and_the_record_through_one_fan_out(monkeypatch):
    """With a web port the demo's one forward() feeds the web view every snapshot the terminal prints, the
    events the record gets, and a status line of the terminal's rates and drops; the view is stopped at the end."""
    np.random.default_rng(0)  # the rig is seeded by run_live_demo's seed argument
    from streamcorr.publish import web as web_module

    views: list[web_module.WebView] = []

    class RecordingView(web_module.WebView):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.snapshots, self.events, self.statuses = [], [], []
            views.append(self)

        async def publish_snapshot(self, snap):
            self.snapshots.append(snap.seq)
            await super().publish_snapshot(snap)

        async def publish_event(self, ev):
            self.events.append(ev)
            await super().publish_event(ev)

        async def publish_status(self, state, counters):
            self.statuses.append((state, dict(counters)))
            await super().publish_status(state, counters)

    monkeypatch.setattr(web_module, "WebView", RecordingView)
    buf, record = io.StringIO(), []
    demo = run_live_demo(
        seed=1, speed=50.0, duration_s=16.0, script_scale=0.1, console=Console(file=buf, width=200),
        web_port=0, record=record,
    )  # fmt: skip
    assert asyncio.run(demo) == 0
    out = buf.getvalue()
    (view,) = views
    assert "live web view: http://127.0.0.1:" in out
    assert view.snapshots and out.count("seq=") == len(view.snapshots)  # the terminal prints each snapshot once
    assert view.events == record
    assert view.statuses and {k for _, c in view.statuses for k in c} == {"pairs_per_s", "samples_per_s", "dropped"}
    assert view.problem() == "web view stopped"
