import asyncio
import io
from itertools import combinations, pairwise

import numpy as np
import pytest
from rich.console import Console

from streamcorr.demo import DEMO_DELTA, check_script, run_live_demo
from streamcorr.demo.rig import CHANNELS, DEVICES, Rig
from streamcorr.errors import ConfigError
from streamcorr.estimator import default_estimator
from streamcorr.significance import autocorrelation, pair_n_eff, rank_rows

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
    """The same seed gives identical samples and stamps; another seed gives different ones."""
    seed = _seed(1)
    a, b, c = (Rig(s).chunk(200).samples for s in (seed, seed, seed + 1))
    assert all(np.array_equal(a[k][0], b[k][0]) and np.array_equal(a[k][1], b[k][1]) for k in CHANNELS)
    assert not all(np.array_equal(a[k][1], c[k][1]) for k in CHANNELS)


@pytest.mark.parametrize("rate", [25.0, 50.0, 100.0])
def test_devices_keep_their_own_clocks(rate):
    """Each device samples every rate_div ticks at its own phase with jitter, its channels share its stamps, every
    sample is finite and on the device's ADC steps, and no two samples of a device fall on one tick of the clock
    (a device at the clock's rate fills every tick once)."""
    rng = np.random.default_rng(2)
    n = int(rng.integers(400, 600))
    chunk = Rig(2, rate_hz=rate).chunk(n)
    period = 1.0 / rate
    assert np.allclose(chunk.ticks, np.arange(n) * period)
    for device in DEVICES:
        t = chunk.samples[device.channels[0]][0]
        m = np.arange(len(t))
        assert abs(len(t) - n / device.rate_div) <= 1
        nominal = (m + device.phase) * device.rate_div * period
        assert np.abs(t - nominal).max() <= 3 * device.jitter * period + 1e-12
        assert np.abs(t - nominal).max() > 0  # stamps jitter
        ticks = np.round(t / period).astype(int)
        assert np.all(np.diff(ticks) == device.rate_div), device.name  # one sample per rate_div ticks, none wobbles
        for name, step in zip(device.channels, device.quantum, strict=True):
            stamps, values = chunk.samples[name]
            assert stamps is t  # channels of a device share its stamps
            assert np.isfinite(values).all()
            if step:
                assert np.allclose(values / step, np.round(values / step), atol=1e-6), name
    assert tuple(chunk.samples) == CHANNELS and 16 <= len(CHANNELS) <= 24
    assert {d.rate_div for d in DEVICES} > {1}  # some devices are slower than the clock


def test_chunks_do_not_change_the_stream():
    """Cutting the stream into chunks of any sizes gives the same samples, stamps and held values as one chunk;
    arrays(n) is the held view."""
    rng = np.random.default_rng(3)
    seed = _seed(3)
    sizes = rng.integers(1, 90, 20)
    assert Rig(seed).chunk(0).ticks.size == 0
    rig = Rig(seed)
    parts = [rig.chunk(int(k)) for k in sizes]
    whole = Rig(seed).chunk(int(sizes.sum()))
    for c in CHANNELS:
        for k in (0, 1):
            assert np.array_equal(np.concatenate([p.samples[c][k] for p in parts]), whole.samples[c][k]), c
        assert np.array_equal(np.concatenate([p.held[c] for p in parts]), whole.held[c], equal_nan=True)
    t, held = Rig(seed).arrays(int(sizes.sum()))
    assert np.array_equal(t, whole.ticks)
    assert all(np.array_equal(held[c], whole.held[c], equal_nan=True) for c in CHANNELS)
    assert all(np.isfinite(held[c][5:]).all() for c in CHANNELS)  # every channel has a sample after a few ticks


def test_nan_glitches_are_seeded_and_at_the_requested_rate():
    """nan_rate sends that fraction of samples as NaN, reproducibly, without changing the clean values."""
    seed = _seed(4)
    glitchy, again, clean = (Rig(seed, nan_rate=r).chunk(2000).samples for r in (0.05, 0.05, 0.0))
    x = np.concatenate([glitchy[c][1] for c in CHANNELS])
    frac = np.isnan(x).mean()
    assert 0.04 < frac < 0.06
    assert np.array_equal(x, np.concatenate([again[c][1] for c in CHANNELS]), equal_nan=True)
    ok = ~np.isnan(x)
    assert np.array_equal(x[ok], np.concatenate([clean[c][1] for c in CHANNELS])[ok])
    assert all(np.array_equal(glitchy[c][0], clean[c][0]) for c in CHANNELS)  # the stamps stay


def test_bad_settings_raise_config_error():
    """Non-positive rate or script scale, and nan_rate outside [0, 1), are refused with ConfigError."""
    for kw in ({"rate_hz": 0.0}, {"script_scale": -1.0}, {"nan_rate": 1.0}):
        with pytest.raises(ConfigError):
            Rig(0, **kw)
    with pytest.raises(ConfigError):
        Rig(0).chunk(-1)


def test_script_is_consistent():
    """Script times scale with script_scale; every scripted pair names known channels in CHANNELS order; stable,
    changing and transient pairs do not overlap; the starting couplings are stable or changing pairs."""
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
    coupled = set(rig.coupled_at_start())
    assert all(order[a] < order[b] for a, b in coupled)
    assert coupled <= stable | rig.changing_pairs()
    broken = {p for c in rig.script[:1] for p, kind in c.expected if kind in ("became-independent", "fall")}
    assert broken <= coupled  # what the first change breaks is coupled before it


def test_signals_are_smooth_where_physics_says():
    """Commands, load, temperatures and spare inputs are smooth (lag-one autocorrelation above 0.9 on the clock),
    so a 512-sample window of two of them holds far fewer independent samples than ticks."""
    _, data = Rig(_seed(7)).arrays(3000)
    smooth = ("j1.cmd", "j2.cmd", "j3.cmd", "tool.load", "ctrl.temp", "motor.temp", "aux.adc", "spare.adc")
    for c in smooth:
        x = data[c][10:]
        assert np.corrcoef(x[:-1], x[1:])[0, 1] > 0.9, c
    x = np.stack([data[c][-WINDOW:] for c in ("j1.cmd", "spare.adc", "j3.cmd", "aux.adc")])
    acf = autocorrelation(rank_rows(x))
    assert (pair_n_eff(acf[::2], acf[1::2], WINDOW) < WINDOW / 4).all()


def test_regimes_match_the_script():
    """On windows inside each regime, pairs the script changes move by more than the demo's rise/fall step in
    the stated direction (became-dependent and became-independent pairs: up and down), and no stable pair moves
    that much between regimes."""
    rig = Rig(_seed(5), script_scale=0.5)
    levels = _mi_matrix_per_regime(rig, duration_s=80.0)
    index = {p: k for k, p in enumerate(combinations(rig.channels, 2))}
    for r, change in enumerate(rig.script):
        before, after = levels[r], levels[r + 1]
        for p in (*change.became_dependent, *change.rises):
            assert after[index[p]] - before[index[p]] > DEMO_DELTA, (change.name, p)
        for p in (*change.became_independent, *change.falls):
            assert before[index[p]] - after[index[p]] > DEMO_DELTA, (change.name, p)
    for p in rig.stable_pairs():
        per_regime = np.array([lv[index[p]] for lv in levels])
        assert np.ptp(per_regime) < DEMO_DELTA, (p, per_regime.round(3))


def test_pearson_blind_pairs_are_pearson_blind():
    """Every Pearson-blind pair has |Pearson r| < 0.1 over the run and MI > 0.3 nats in every regime."""
    rig = Rig(_seed(6))
    duration = rig.script[-1].t_s + 40.0
    t, data = rig.arrays(round(duration * RATE))
    bounds = [0.0, *(c.t_s for c in rig.script), duration]
    for p in rig.pearson_blind_pairs():
        x, y = data[p[0]], data[p[1]]
        ok = np.isfinite(x) & np.isfinite(y)
        assert abs(np.corrcoef(x[ok], y[ok])[0, 1]) < 0.1, p
        for a, b in pairwise(bounds):
            seg = ok & (t >= a + 0.5) & (t < b)
            assert default_estimator().estimate(x[seg], y[seg]) > 0.3, (p, a)


@pytest.mark.slow
def test_engine_reports_the_scripted_changes_and_nothing_on_stable_pairs():
    """Streamed through the engine (512-sample windows, hop 50, demo rise/fall threshold) with the script
    compressed to changes at 20, 40 and 60 s, the engine reports every starting coupling dependent before the
    first change, every expected event arrives within about two windows of its change, no stable pair raises any
    other event, and transient pairs only start an excursion within two windows of a change."""
    np.random.default_rng(0)  # the rig draws from its own seeded generators; nothing else is random here
    report = check_script(seed=0, script_scale=0.5, duration_s=80.0)
    hop_s = 50 / RATE
    # A change clears the window after one window length; a new state must then persist for 2 hops. Becoming
    # independent needs two estimates below the null's 90th percentile, and overlapping windows make chance
    # exceedances come in runs up to a window long: hence the second window.
    assert not report.missing, str(report)
    assert not report.unreported, str(report)
    assert report.max_delay_s <= 2 * report.window_s + 2 * hop_s, str(report)
    dependent = [d for (_, kind), d in report.delays_s.items() if kind != "became-independent"]
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
