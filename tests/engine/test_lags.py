"""Lead and lag: the lag search against references, its null on independent pairs, and the engine's lags."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.signal import lfilter

from streamcorr import Estimator
from streamcorr.engine.core import Engine, EngineConfig
from streamcorr.engine.lagscan import lag_scan, lag_windows, scan_statistic
from streamcorr.engine.screen import sketch
from streamcorr.errors import InputError
from streamcorr.estimate.copula import rank_transform
from tests import naive

RATE = 100.0
T0 = 1_765_000_000.0


@pytest.fixture(scope="module")
def est() -> Estimator:
    return Estimator()


def _smooth(rng: np.random.Generator, n: int, a: float) -> np.ndarray:
    """AR(1) with unit variance, started in its stationary state."""
    return lfilter([np.sqrt(1 - a * a)], [1, -a], rng.standard_normal(n + 400))[400:]


def _delayed(x: np.ndarray, d: float) -> np.ndarray:
    """x(t - d) for a delay d in samples (linear interpolation between samples; wraps at the start)."""
    t = np.arange(len(x)) - d
    return np.interp(t % len(x), np.arange(len(x)), x)


def test_scan_statistic_matches_the_naive_sum_at_every_lag() -> None:
    """The FFT scan is the screen's statistic of x(t) against y(t + lag), computed one sample at a time."""
    rng = np.random.default_rng(811)
    v = rng.standard_normal((3, 90))
    v[1] = np.roll(v[0], 4) ** 2 + 0.5 * rng.standard_normal(90)
    feat = sketch(rank_transform(v), 4)
    s = scan_statistic(feat, np.array([0, 2]), np.array([1, 0]), 6)  # (2, 13)
    for p, (a, b) in enumerate(((0, 1), (2, 0))):
        for k, lag in enumerate(range(-6, 7)):
            assert s[p, k] == pytest.approx(naive.lagged_screen_statistic(feat[a], feat[b], lag), rel=1e-4)
    assert int(np.argmax(s[0])) - 6 == 4  # y follows x by 4 samples: the peak


def test_lag_windows_pair_x_with_y_later_by_the_lag() -> None:
    """At lag +d the window pairs x[t] with y[t + d]; at -d, x[t + d] with y[t]; both end at the newest sample."""
    v = np.stack([np.arange(20.0), 100 + np.arange(20.0)])
    x, y = lag_windows(v, np.array([0, 0]), np.array([1, 1]), np.array([3, -3]), 10)
    assert x[0, -1] == 16 and y[0, -1] == 119 and (y[0] - x[0] == 103).all()
    assert x[1, -1] == 19 and y[1, -1] == 116 and (y[1] - x[1] == 97).all()


@pytest.mark.parametrize("driver", ["white", "smooth"])
def test_best_lag_within_a_sample_for_linear_and_non_monotone_relations(est: Estimator, driver: str) -> None:
    """y = f(x delayed by d) + noise, f linear, square, abs or sine, d in +-60 samples (non-integer for smooth
    drivers): the reported lag is within one sample of d, with the sign of who follows whom."""
    rng = np.random.default_rng(8128 if driver == "white" else 8129)
    n, k = 1024, 80
    rows, truth = [], []
    for f in (lambda z: z, np.square, np.abs, lambda z: np.sin(2 * z)):
        for _ in range(3):
            if driver == "white":
                d = float(rng.integers(-60, 61))
                x = rng.standard_normal(n + k + 200)
            else:
                d = float(rng.uniform(-60, 60))
                x = _smooth(rng, n + k + 200, float(rng.uniform(0.9, 0.98)))
            g = f(_delayed(x, d))
            y = g + 0.4 * np.std(g) * rng.standard_normal(len(g))
            rows += [x[-(n + k) :], y[-(n + k) :]]
            truth.append(d)
    v = np.stack(rows)
    iu = np.arange(0, len(rows), 2)
    r = lag_scan(est, v, iu, iu + 1, max_lag=k)
    assert r.significant.all(), r.mi
    err = np.abs(r.lag - np.array(truth))
    assert (err <= 1.0).all(), list(zip(truth, r.lag.round(2), strict=True))
    if driver == "smooth":  # sub-sample refinement: well inside a sample on most
        assert np.median(err) < 0.35, err
    assert r.network_pairs <= len(iu) * (3 + 16)  # candidates, and surrogates for smooth pairs


def test_independent_pairs_report_no_lag(est: Estimator) -> None:
    """Independent white, smooth, quantised and oscillating channels: the best of 161 lags stays within the
    max-over-lags null (at alpha 1e-3 per pair, at most one of 80 pairs may pass by chance)."""
    rng = np.random.default_rng(90210)
    n, k = 1024, 80

    def channel() -> np.ndarray:
        kind = rng.integers(4)
        if kind == 0:
            return rng.standard_normal(n + k)
        if kind == 1:
            return _smooth(rng, n + k, float(rng.uniform(0.85, 0.995)))
        if kind == 2:
            return np.round(3 * _smooth(rng, n + k, float(rng.uniform(0.9, 0.99)))) / 3
        return np.sin(np.cumsum(rng.uniform(0.01, 0.06, n + k))) + 0.3 * _smooth(rng, n + k, 0.9)

    v = np.stack([channel() for _ in range(160)])
    iu = np.arange(0, 160, 2)
    r = lag_scan(est, v, iu, iu + 1, max_lag=k, force=np.ones(80, bool))
    assert int(r.significant.sum()) <= 1, (r.mi[r.significant], r.n_eff[r.significant])
    assert np.isnan(r.lag[~r.significant]).all()


def test_lag_scan_refuses_bad_input_with_the_fix(est: Estimator) -> None:
    """Short rows, a gap and a bad lag range are named errors."""
    v = np.random.default_rng(3).standard_normal((2, 300))
    with pytest.raises(InputError, match="window_len \\+ max_lag"):
        lag_scan(est, v, [0], [1], max_lag=290)
    with pytest.raises(InputError, match="max_lag"):
        lag_scan(est, v, [0], [1], max_lag=0)
    v[1, 5] = np.nan
    with pytest.raises(InputError, match="finite"):
        lag_scan(est, v, [0], [1], max_lag=20)


def _engine_run(data: dict[str, np.ndarray], stamps: dict[str, np.ndarray], **cfg: object) -> tuple[Engine, list]:
    """Push 1 s of every channel at a time and evaluate each due window; returns the engine and its events."""
    eng = Engine(EngineConfig(channels=list(data), rate_hz=RATE, skip_stale_hops=False, **cfg))  # type: ignore[arg-type]
    events, snaps = [], []
    n = len(next(iter(data.values())))
    for s0 in range(0, n, int(RATE)):
        for name, x in data.items():
            eng.push(name, stamps[name][s0 : s0 + int(RATE)], x[s0 : s0 + int(RATE)])
        for end in eng.due_windows():
            snap, ev = eng.evaluate(end)
            events += ev
            snaps.append(snap)
    return eng, [snaps, events]


def test_engine_reports_lags_on_device_clocks_and_a_lag_shift(est: Estimator) -> None:
    """Channels stamped on their own phases: the snapshot's lag_s is antisymmetric, positive where the second
    channel follows, within 10 ms of the true delay; a delay that steps from 0.10 to 0.30 s gives one lag-shift
    event within two windows, and an independent pair has no lag."""
    rng = np.random.default_rng(4242)
    n = int(70 * RATE)
    a = _smooth(rng, n, 0.95)
    b = _delayed(a, 23.0) + 0.3 * rng.standard_normal(n)  # b follows a by 0.23 s
    w = rng.standard_normal(n)
    c = np.abs(_delayed(w, -15.0)) + 0.2 * rng.standard_normal(n)  # c leads w by 0.15 s: lag(w, c) = -0.15 s
    step = np.where(np.arange(n) < n // 2, _delayed(w, 10.0), _delayed(w, 30.0)) + 0.3 * rng.standard_normal(n)
    e = _smooth(rng, n, 0.97)
    data = {"a": a, "b": b, "w": w, "c": c, "s": step, "e": e}
    phase = {"a": 0.0021, "b": 0.0087, "w": 0.0, "c": 0.0043, "s": 0.0066, "e": 0.001}  # s after the tick
    jitter = {k: rng.uniform(-3e-4, 3e-4, n) for k in data}
    stamps = {k: T0 + np.arange(n) / RATE + phase[k] + jitter[k] for k in data}
    eng, (snaps, events) = _engine_run(data, stamps, window_len=512, max_lag_s=0.5, lag_refresh_s=1.0)
    last = snaps[-1]
    idx = {name: k for k, name in enumerate(last.channels)}
    assert last.lag_s is not None and last.mi_lag is not None
    np.testing.assert_array_equal(np.nan_to_num(last.lag_s, nan=9), np.nan_to_num(-last.lag_s.T, nan=9))
    # the true delay is in stamp time: b's sample at t + phase_b shows a at t + phase_b - 0.23
    true_ab = 0.23 + phase["b"] - phase["a"]
    assert last.lag_s[idx["a"], idx["b"]] == pytest.approx(true_ab, abs=0.01)
    assert last.lag_s[idx["w"], idx["c"]] == pytest.approx(-0.15 + phase["c"] - phase["w"], abs=0.01)
    assert last.lag_s[idx["w"], idx["s"]] == pytest.approx(0.30 + phase["s"], abs=0.01)
    assert np.isnan(last.lag_s[idx["a"], idx["e"]]) and np.isnan(last.lag_s[idx["w"], idx["e"]])
    shifts = [ev for ev in events if ev.kind == "lag-shift" and set(ev.pair) == {"w", "s"}]
    assert len(shifts) == 1, shifts
    ev = shifts[0]
    t_step = stamps["w"][n // 2]
    assert 0 < ev.t_ns / 1e9 - t_step <= 2 * 512 / RATE
    assert ev.previous_lag_s == pytest.approx(0.10 + phase["s"], abs=0.01)
    assert ev.lag_s == pytest.approx(0.30 + phase["s"], abs=0.01)
    assert eng.lags is not None and eng.lags.counts["pairs_searched"] > 0
    assert eng.counters.stage_s["lags"] > 0


def test_lags_off_by_default_and_buffers_hold_the_lag_range() -> None:
    """Without lags.max_s snapshots carry no lag matrices; with it each ring buffer holds window + lag range."""
    off = Engine(EngineConfig(channels=["a", "b"], rate_hz=RATE, window_len=256))
    on = Engine(EngineConfig(channels=["a", "b"], rate_hz=RATE, window_len=256, max_lag_s=2.0))
    assert off.lags is None and off.state.snapshot(0, 0).lag_s is None
    assert on.intake.capacity >= 256 + 200 and on.intake.capacity - off.intake.capacity == 2 * 200


def test_daemon_publishes_lags_to_a_plain_zmq_client(tmp_path):
    """`streamcorr run` with lags on, fed msgpack chunks by pyzmq: a plain SUB client that decodes the envelope with
    msgpack and numpy alone reads lag_s > 0 where the second channel follows the first, the antisymmetric cell,
    and mi_lag; an independent pair has none."""
    import time

    import msgpack

    from tests.helpers import daemon_process, zmq_fed_daemon

    rng = np.random.default_rng(6061)
    rate, n = 50.0, 50 * 20
    a = rng.standard_normal(n)
    b = np.square(_delayed(a, 9.0)) + 0.3 * rng.standard_normal(n)  # b follows a by 0.18 s
    c = _smooth(rng, n, 0.9)
    cfg, push, sub = zmq_fed_daemon(["a", "b", "c"], rate, lags={"max_s": 0.4, "refresh_s": 1.0})
    with daemon_process(tmp_path, cfg) as proc:
        t_end = time.time()
        t = t_end - (n - np.arange(n)) / rate  # the past 20 s, sent at once
        for k in range(0, n, 50):
            chunk = {"t": t[k : k + 50].tolist(), "channels": {"a": a[k : k + 50].tolist(),
                     "b": b[k : k + 50].tolist(), "c": c[k : k + 50].tolist()}}  # fmt: skip
            push.send_multipart([b"rig", msgpack.packb(chunk)])
        deadline, m = time.monotonic() + 120, None
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.log_path.read_text()[-2000:]
            if not sub.poll(1000):
                continue
            _topic, payload = sub.recv_multipart()
            msg = msgpack.unpackb(payload, raw=False)
            if "lag_s" in msg and msg["t_ns"] >= int((t_end - 1.5) * 1e9):
                m = msg
                break
    sub.close()
    push.close()
    assert m is not None, "no snapshot with lags from the end of the stream"

    def matrix(key: str) -> np.ndarray:
        return np.frombuffer(m[key]["data"], dtype=m[key]["dtype"]).reshape(m[key]["shape"])

    lag, mi_lag, names = matrix("lag_s"), matrix("mi_lag"), m["channels"]
    ia, ib, ic = names.index("a"), names.index("b"), names.index("c")
    assert lag[ia, ib] == pytest.approx(0.18, abs=0.02) and lag[ib, ia] == -lag[ia, ib]
    assert mi_lag[ia, ib] > 0.3
    assert np.isnan(lag[ia, ic]) and np.isnan(lag[ib, ic])


def test_estimate_command_prints_the_curve_and_the_best_lag(tmp_path, capsys):
    """`streamcorr estimate data.csv x y --max-lag-s 0.3` prints MI against the lag of y and the best lag (rate from
    the time column); without a rate it says which flag to give."""
    from streamcorr.cli.commands import main

    rng = np.random.default_rng(5150)
    x = rng.standard_normal(1400)
    y = np.abs(_delayed(x, -12.0)) + 0.2 * rng.standard_normal(1400)  # y leads x by 0.12 s
    path = tmp_path / "d.csv"
    np.savetxt(path, np.c_[np.arange(1400) / RATE, x, y], delimiter=",", header="time,x,y", comments="")
    assert main(["estimate", str(path), "x", "y", "--max-lag-s", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "best lag -0.1200 s" in out and "newest 1024 rows" in out
    assert len([ln for ln in out.splitlines() if ln.startswith(("+", "-0"))]) == 61
    np.savetxt(path, np.c_[x, y], delimiter=",", header="x,y", comments="")
    assert main(["estimate", str(path), "x", "y", "--max-lag-s", "0.3"]) != 0
    assert "--rate-hz" in capsys.readouterr().err


def test_a_hop_over_its_budget_defers_lag_searches() -> None:
    """Live (skip_stale_hops) the lag search fills only what is left of the hop's budget: with none left no pair
    is searched and the wait is counted; a replay has no time budget and searches every due pair."""
    rng = np.random.default_rng(777)
    n = int(20 * RATE)
    a = rng.standard_normal(n)
    data = {"a": a, "b": _delayed(a, 7.0) + 0.3 * rng.standard_normal(n)}
    stamps = {k: T0 + np.arange(n) / RATE for k in data}
    live = Engine(EngineConfig(channels=list(data), rate_hz=RATE, window_len=256, max_lag_s=0.2))
    replay = Engine(EngineConfig(channels=list(data), rate_hz=RATE, window_len=256, max_lag_s=0.2,
                                 skip_stale_hops=False))  # fmt: skip
    assert live.lags is not None and replay.lags is not None
    assert live.lags.budget_s == pytest.approx(0.8) and replay.lags.budget_s == float("inf")
    live.lags.budget_s = 0.0  # every hop is over its budget
    for eng in (live, replay):
        for name, x in data.items():
            eng.push(name, stamps[name], x)
        end = (int(stamps["a"][-1] * 1e9) // 10**7) * 10**7
        snap, _ = eng.evaluate(end)
        assert snap.lag_s is not None
        if eng is live:
            assert eng.lags.counts["pairs_searched"] == 0 and eng.lags.counts["deferred"] == 1
            assert np.isnan(snap.lag_s).all()
        else:
            assert eng.lags.counts["pairs_searched"] == 1
            assert snap.lag_s[0, 1] == pytest.approx(0.07, abs=0.01)
