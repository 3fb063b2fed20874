"""The fast change path: per-sample evidence, its CUSUM threshold, and events seconds after a change."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.signal import lfilter

from streamcorr import Estimator
from streamcorr.engine.core import Engine, EngineConfig
from streamcorr.engine.fast import REFERENCE_SHARE, FastPath
from streamcorr.estimate.copula import marginal_histograms, pair_histograms, rank_transform
from streamcorr.estimate.evidence import change_point, evidence, pair_tables, window_moments

RATE = 100.0
T0 = 1_765_000_000.0


@pytest.fixture(scope="module")
def est() -> Estimator:
    return Estimator()


def test_window_evidence_averages_to_the_dv_estimate(est: Estimator) -> None:
    """The mean evidence of a window's own samples is its table-only estimate (the DV bound), both ways."""
    rng = np.random.default_rng(501)
    x = rng.standard_normal((3, 700))
    y = np.stack([x[0] ** 2, np.sin(3 * x[1]), rng.standard_normal(700)]) + 0.4 * rng.standard_normal((3, 700))
    u = rank_transform(np.concatenate([x, y]), est.ties)
    p = np.arange(3)
    theta, log_z, hist = pair_tables(est, u, p, p + 3)
    marg = marginal_histograms(u, est.grid)
    direct = est.estimate_histograms(pair_histograms(u, u, est.grid, p, p + 3), marg[p], marg[p + 3])
    per_sample = evidence(theta, log_z, u[p], u[p + 3]).mean(axis=1)
    mean, var = window_moments(theta, log_z, hist)
    np.testing.assert_allclose(per_sample, mean, atol=1e-4)  # the bilinear lookup is the histogram's binning
    np.testing.assert_allclose(np.maximum(mean, 0.0), direct, atol=2e-3)
    assert (var > 0).all()


def test_change_point_finds_a_shift_in_the_mean() -> None:
    """The change point of a noisy step up (and down) is found within a few samples."""
    rng = np.random.default_rng(503)
    e = rng.normal(0.0, 0.5, (2, 300))
    e[0, 180:] += 1.0
    e[1, :90] += 1.0
    assert abs(int(change_point(e[:1], rising=True)[0]) - 180) <= 6
    assert abs(int(change_point(e[1:], rising=False)[0]) - 90) <= 6


def _stream(seed: int, seconds: float, smooth: bool = False) -> tuple[np.ndarray, dict[str, np.ndarray], dict]:
    """Six channels on one clock: a-b a tanh relation that decouples at 25 s, c-d a square relation that couples at
    28 s, e-f dependent throughout but linear until 20 s and sine after (a new shape, never independent)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)

    def proc() -> np.ndarray:
        e = rng.standard_normal(n)
        return lfilter([1.0], [1.0, -0.8], e) / 1.67 if smooth else e

    a, c, e = proc(), proc(), proc()
    b = np.tanh(2 * a) + 0.4 * proc()
    b[int(25 * RATE) :] = proc()[int(25 * RATE) :]
    d = proc()
    d[int(28 * RATE) :] = (c**2 + 0.4 * proc())[int(28 * RATE) :]
    f = e + 0.4 * proc()
    f[int(20 * RATE) :] = (np.sin(2 * e) + 0.3 * proc())[int(20 * RATE) :]
    t = T0 + np.arange(n) / RATE
    truth = {("a", "b"): 25.0, ("c", "d"): 28.0}
    return t, {"a": a, "b": b, "c": c, "d": d, "e": e, "f": f}, truth


def _replay(t: np.ndarray, data: dict[str, np.ndarray], **cfg: object) -> list:
    cfg = {"window_len": 512, **cfg}
    eng = Engine(EngineConfig(channels=list(data), rate_hz=RATE, hop_samples=50, skip_stale_hops=False,
                              max_future_s=None, queue_size=100_000, **cfg))  # type: ignore[arg-type]  # fmt: skip
    events = []
    for s in range(0, len(t), 50):
        eng.push_frame(t[s : s + 50], {k: v[s : s + 50] for k, v in data.items()})
        for end in eng.due_windows():
            events += eng.evaluate(end)[1]
    return events


@pytest.fixture(scope="module")
def white_events() -> list:
    t, data, _ = _stream(504, 42.0)
    return _replay(t, data)


def test_fast_path_reports_a_decoupling_within_seconds(white_events: list) -> None:
    """A tanh pair that decouples is reported by the fast path within 2 s (the window of 512 samples spans 5.1 s),
    its onset within 1 s."""
    fast = white_events
    ev = [e for e in fast if e.pair == ("a", "b") and e.kind == "became-independent"]
    assert ev and ev[0].path == "fast", [(e.pair, e.kind, e.path, e.t_ns) for e in fast]
    delay = ev[0].t_ns / 1e9 - (T0 + 25.0)
    assert 0 <= delay <= 2.0
    assert abs(ev[0].onset_t_ns / 1e9 - (T0 + 25.0)) <= 1.0


def test_fast_path_reports_a_coupling_within_seconds(white_events: list) -> None:
    """A square relation that starts is reported within 3 s, with its onset within 1 s."""
    fast = white_events
    ev = [e for e in fast if e.pair == ("c", "d") and e.kind == "became-dependent"]
    assert ev, [(e.pair, e.kind, e.path, e.t_ns) for e in fast]
    assert 0 <= ev[0].t_ns / 1e9 - (T0 + 28.0) <= 3.0
    assert ev[0].onset_t_ns is not None and abs(ev[0].onset_t_ns / 1e9 - (T0 + 28.0)) <= 1.0
    assert not ev[0].initial


def test_a_new_shape_is_not_a_decoupling(white_events: list) -> None:
    """A pair whose relation changes shape (linear to sine) but stays dependent never becomes independent, and
    the window's verdicts are not repeated by the fast path (one event per change)."""
    fast = white_events
    assert not [e for e in fast if e.pair == ("e", "f") and e.kind == "became-independent"]
    for pair in (("a", "b"), ("c", "d")):
        kinds = [e.kind for e in fast if e.pair == pair and e.kind.startswith("became")]
        assert all(k1 != k2 for k1, k2 in itertools.pairwise(kinds)), kinds  # states alternate


def test_live_references_are_renewed_within_a_tenth_of_each_hop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Live, a matrix whose pairs all turn dependent at once gets its references over several hops, each hop's
    share capped at REFERENCE_SHARE of the hop (so that every hop is published on time); a replay is uncapped
    (deterministic)."""
    rng = np.random.default_rng(505)
    n, names = 1500, [f"c{k}" for k in range(12)]
    common = rng.standard_normal(n)
    data = {name: common + 0.8 * rng.standard_normal(n) for name in names}  # every pair dependent
    t = T0 + np.arange(n) / RATE
    given: list[float] = []
    made: list[int] = []
    refresh = FastPath._refresh

    def spy(self: FastPath, *args: object) -> None:
        given.append(float(args[-1]))  # type: ignore[arg-type]
        refresh(self, *args)  # type: ignore[arg-type]
        made.append(len(self._refs))

    monkeypatch.setattr(FastPath, "_refresh", spy)
    for live in (True, False):
        given.clear()
        made.clear()
        eng = Engine(EngineConfig(channels=names, rate_hz=RATE, window_len=512, hop_samples=50, skip_stale_hops=live,
                                  max_future_s=None, queue_size=100_000))  # fmt: skip
        for s in range(0, n, 50):
            eng.push_frame(t[s : s + 50], {k: v[s : s + 50] for k, v in data.items()})
            for end in eng.due_windows():
                eng.evaluate(end)
        assert eng.fast is not None and len(eng.fast._refs) > 0.9 * 66  # the held pairs got their references
        if live:
            assert given and max(given) <= REFERENCE_SHARE * 50 / RATE + 1e-9
        else:
            assert all(g == float("inf") for g in given)
            assert max(made[:2]) > 0.9 * 66  # all at once


def test_smooth_channels_give_no_fast_events() -> None:
    """Smooth channels, four independent and one pair dependent throughout (a square relation), give no change
    event with the fast path on but the pair's first verdict: the sentinel has its own null, and the decoupling
    test does not take a smooth pair's wandering evidence for a decoupling."""
    rng = np.random.default_rng(505)
    n = int(70 * RATE)

    def smooth() -> np.ndarray:
        return lfilter([1.0], [1.0, -0.95], rng.standard_normal(n)) / 3.2

    data = {f"s{k}": smooth() for k in range(4)}
    data["d0"] = smooth()
    data["d1"] = data["d0"] ** 2 + 0.3 * smooth()
    events = _replay(T0 + np.arange(n) / RATE, data)
    assert [(e.pair, e.kind, e.initial) for e in events] == [(("d0", "d1"), "became-dependent", True)], [
        (e.pair, e.kind, e.path, e.t_ns / 1e9 - T0) for e in events
    ]


def test_a_smooth_pair_that_couples_and_decouples_is_reported_within_seconds() -> None:
    """Smooth channels (AR(1), time constant 20 samples): a tanh relation that holds from 25 s to 45 s is reported
    by the fast path within 3 s of each change (its innovations show what its levels, a few dozen effective samples
    a short window, cannot yet), each onset within 1 s, with no other event."""
    rng = np.random.default_rng(506)
    n = int(60 * RATE)

    def smooth() -> np.ndarray:
        x = lfilter([1.0], [1.0, -np.exp(-1 / 20)], rng.standard_normal(n))
        return x / x.std()

    data = {f"s{k}": smooth() for k in range(4)}
    data["d0"], data["d1"] = smooth(), smooth()
    on, off = int(25 * RATE), int(45 * RATE)
    data["d1"][on:off] = (np.tanh(2 * data["d0"]) + 0.5 * smooth())[on:off]
    events = _replay(T0 + np.arange(n) / RATE, data)
    seen = [(e.pair, e.kind, e.path) for e in events]
    assert seen == [(("d0", "d1"), "became-dependent", "fast"), (("d0", "d1"), "became-independent", "fast")], [
        (e.pair, e.kind, e.path, e.t_ns / 1e9 - T0) for e in events
    ]
    for ev, t_change in zip(events, (25.0, 45.0), strict=True):
        assert 0 <= ev.t_ns / 1e9 - (T0 + t_change) <= 3.0
        assert ev.onset_t_ns is not None and abs(ev.onset_t_ns / 1e9 - (T0 + t_change)) <= 1.0


def test_events_keep_onset_and_path_in_the_parquet_history(tmp_path) -> None:
    """An event's onset and path survive the Parquet history (null onset where none was estimated), and the
    detection time keeps its meaning in ``time`` and ``t_ns``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from streamcorr.engine.changes import ChangeEvent
    from streamcorr.publish.history import EVENT_COLUMNS, event_row, event_schema

    evs = [ChangeEvent(("a", "b"), 0.7, 0.01, 9 * 10**9, "became-independent", onset_t_ns=8 * 10**9, path="fast"),
           ChangeEvent(("a", "c"), 0.0, 0.5, 9 * 10**9, "became-dependent", initial=True)]  # fmt: skip
    rows = [event_row(e) for e in evs]
    pq.write_table(pa.table({c: [r[c] for r in rows] for c in EVENT_COLUMNS}, schema=event_schema()), tmp_path / "e.pq")
    back = pq.read_table(tmp_path / "e.pq").to_pylist()
    assert [(r["time"], r["t_ns"], r["onset_t_ns"], r["path"]) for r in back] == [
        (9.0, 9 * 10**9, 8 * 10**9, "fast"), (9.0, 9 * 10**9, None, "window")]  # fmt: skip


def test_steady_smooth_pairs_that_turn_give_no_decoupling() -> None:
    """Smooth pairs whose relation turns (square, sine, a cubic), each dependent throughout on drivers of time
    constants 3-30 samples, give no became-independent event over 3 minutes: a smooth pair's
    decoupling is confirmed only where its innovations, on every comparison, no longer show the relation."""
    rng = np.random.default_rng(507)
    n = int(180 * RATE)

    def smooth(tau: float) -> np.ndarray:
        x = lfilter([1.0], [1.0, -np.exp(-1 / tau)], rng.standard_normal(n + 500))[500:]
        return x / x.std()

    relations = {"sq": np.square, "si": lambda v: np.sin(2 * v), "cu": lambda v: v**3 - 2 * v}
    data = {}
    for name, f in relations.items():
        x = smooth(rng.uniform(3, 30))
        y = f(x)
        data[f"{name}x"], data[f"{name}y"] = x, y / y.std() + rng.uniform(0.3, 0.6) * smooth(rng.uniform(3, 30))
    events = _replay(T0 + np.arange(n) / RATE, data, window_len=1024)
    false = [(e.pair, e.path, round(e.t_ns / 1e9 - T0, 1)) for e in events if e.kind == "became-independent"]
    assert false == []


def _robot_csv(path, seed: int = 42, seconds: float = 300.0, until_s: float = 165.0) -> None:
    """A robot log as a user wrote it: smooth channels (AR(1) at 100 Hz, phi 0.95-0.98, a slow temperature and
    humidity, quantised), devices at 100, 25 and 10 Hz on their own phases with 0.3 ms jitter, a 6-s gap in one;
    dependent throughout: motor.vib = speed^2, batt.current = 2 + |imu.ay| / 2, flow.rate = valve.cmd 0.3 s before.
    Drawn for ``seconds``, written up to ``until_s``."""
    rng = np.random.default_rng(seed)
    n = int(seconds * 1000) + 2000
    tf = np.arange(n) / 1000 - 1.0

    def ar1(phi: float) -> np.ndarray:
        p = phi**0.1
        e = rng.standard_normal(n) * np.sqrt(1 - p**2)
        rng.standard_normal()
        x = lfilter([1.0], [1.0, -p], e)
        return x / x.std()

    sig = {c: ar1(p) for c, p in [("imu.ax", 0.97), ("imu.ay", 0.95), ("motor.speed", 0.98), ("valve.cmd", 0.95),
                                  ("enc.pos", 0.95)]}  # fmt: skip
    sig["env.temp"] = 22.0 + 1.5 * ar1(0.9995)
    sig["env.hum"] = 45 + 3 * ar1(0.999)
    devices = {"imu": (100, ["imu.ax", "imu.ay"]), "motor": (100, ["motor.speed", "motor.vib"]),
               "valve": (100, ["valve.cmd"]), "flow": (25, ["flow.rate"]), "enc": (25, ["enc.pos"]),
               "batt": (25, ["batt.current"]), "env": (10, ["env.temp", "env.hum"])}  # fmt: skip
    rows = []
    for dev, (rate, chans) in devices.items():
        base = np.arange(0, seconds, 1 / rate)
        t = base + rng.uniform(0, 1 / rate) + rng.normal(0, 3e-4, int(np.ceil(seconds * rate)))[: len(base)]
        cols = {}
        for c in chans:
            if c == "motor.vib":
                v = np.interp(t, tf, sig["motor.speed"]) ** 2 + 0.3 * rng.standard_normal(len(t))
            elif c == "flow.rate":
                v = np.interp(t - 0.3, tf, sig["valve.cmd"]) + 0.3 * rng.standard_normal(len(t))
            elif c == "batt.current":
                v = 2 + 0.5 * np.abs(np.interp(t, tf, sig["imu.ay"])) + 0.05 * rng.standard_normal(len(t))
            else:
                v = np.interp(t, tf, sig[c])
            cols[c] = {"env.temp": np.round(v, 1), "env.hum": np.round(v * 2) / 2, "enc.pos": np.round(v, 2)}.get(c, v)
        keep = ~((t > 150) & (t < 156)) if dev == "enc" else np.ones(len(t), dtype=bool)
        rows += [(t[k], {c: cols[c][k] for c in chans}) for k in np.flatnonzero(keep & (t < until_s))]
    rows.sort(key=lambda r: r[0])
    names = [c for _, chans in devices.values() for c in chans]
    lines = [f"{1712000000.0 + t:.6f}," + ",".join(f"{d[c]:.6g}" if c in d else "" for c in names) for t, d in rows]
    path.write_text("timestamp," + ",".join(names) + "\n" + "\n".join(lines) + "\n")


def test_a_steady_smooth_pair_on_two_clocks_gets_no_fast_decoupling(tmp_path) -> None:
    """A robot log's pairs that stay dependent (smooth, at 100 and 25 Hz) get no became-independent when replayed
    at the defaults: a short window within a smooth pair's wide null is no decoupling while it stays above half of
    what the pair's window shows now."""
    import pyarrow.parquet as pq

    from streamcorr.cli.commands import main

    log = tmp_path / "robot.csv"
    _robot_csv(log)
    assert main(["replay", str(log), "--no-progress", "-o", str(tmp_path / "out")]) == 0
    events = pq.read_table(tmp_path / "out" / "events.parquet").to_pylist()
    steady = {("imu.ay", "batt.current"), ("motor.speed", "motor.vib")}
    assert {(e["a"], e["b"]) for e in events if e["change"] == "became-dependent"} >= steady
    assert not [e for e in events if e["change"] == "became-independent" and (e["a"], e["b"]) in steady]
