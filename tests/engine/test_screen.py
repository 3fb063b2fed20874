"""Dependence screening: the statistic against the naive reference, its calibration, the scheduler's guarantees,
the engine with screening on, and the snapshot's source field on the wire."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamcorr.engine.core import Engine, EngineConfig
from streamcorr.engine.matrix import SOURCE_NETWORK, SOURCE_NONE, SOURCE_SCREEN, MatrixState
from streamcorr.engine.scheduler import PairSelection, Scheduler
from streamcorr.engine.screen import ScreenCalibration, Screener, pair_statistic, screen_mi, screen_statistic
from streamcorr.errors import ConfigError
from streamcorr.estimate.copula import rank_transform
from streamcorr.publish.envelope import decode_message, encode_snapshot
from tests import naive

SEC = 1_000_000_000


@settings(max_examples=25, deadline=None)
@given(
    n_ch=st.integers(1, 4),
    t=st.integers(8, 40),
    levels=st.sampled_from([3, 1000]),  # 3 levels: heavy ties, some features constant
    n_basis=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_statistic_matches_naive(n_ch: int, t: int, levels: int, n_basis: int, seed: int) -> None:
    """The all-pairs matrix product equals the pair-by-pair sum of squared cross-moments (float32 tolerance)."""
    rng = np.random.default_rng(seed)
    u = rank_transform(rng.integers(0, levels, size=(n_ch, t)).astype(float))
    got = screen_statistic(u, n_basis)
    want = naive.screen_statistic(u, n_basis)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3 * n_basis**2)


def test_statistic_blocks_and_pairs_agree() -> None:
    """The blocked all-pairs product, the per-pair form and a monotone map of the data give the same numbers."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((700, 64))  # 700 channels x 4 features: more than one block of rows
    s = screen_statistic(rank_transform(x), 4)
    np.testing.assert_allclose(np.diag(s[:350, 350:]), pair_statistic(x[:350], x[350:]), rtol=1e-4)
    np.testing.assert_allclose(screen_statistic(rank_transform(np.exp(x)), 4), s, rtol=1e-6)  # ranks only


def test_statistic_detects_linear_and_non_monotone() -> None:
    """Linear, square, abs and sine dependence score far above independent pairs at window 512."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal(512)
    ys = [0.8 * x, x**2, np.abs(x), np.sin(2 * x)]
    chans = np.stack([x, *(y + 0.5 * rng.standard_normal(512) for y in ys), rng.standard_normal(512)])
    s = screen_statistic(rank_transform(chans), 4)
    assert (s[0, 1:5] > 100).all(), s[0]
    assert s[0, 5] < 50  # chi-square with 16 d.o.f.: 50 is beyond its 99.99% quantile
    assert screen_mi(s[0, 5], 512) < 0.05


def test_calibration_passes_min_effect_pairs() -> None:
    """At window 512, pairs at MI = min_effect of every family pass >= 97% (300 fresh pairs each), null pairs
    rarely; the 99% target is measured with 2,000 pairs per family in bench.screen_calibration."""
    cal = ScreenCalibration.measure(512, min_effect=0.1, n_pairs=300, quantile=0.005, seed=3)
    assert min(cal.dependent_pass.values()) >= 0.97, cal
    assert cal.null_pass <= 0.02, cal


def _sched(n: int, budget: int) -> Scheduler:
    pairs = np.array([(k, k + 1) for k in range(n)])
    return Scheduler(pairs, max_pairs_per_hop=budget, min_effect=0.1)


def test_scheduler_max_age_respected() -> None:
    """With a budget that fits hot + passing + the rotation share, every pair has a network estimate at most
    max_age old at every hop once max_age has passed since start-up, whatever the screen says."""
    rng = np.random.default_rng(4)
    n, max_age = 500, 10 * SEC
    sched = _sched(n, budget=200)
    for hop in range(1, 80):
        now = hop * SEC
        passed = rng.random(n) < 0.05
        pick = sched.plan(passed, rng.random(n), now, SEC, max_age)
        assert len(set(pick.tolist())) == len(pick)
        sched.mark_refreshed(pick, now, np.where(rng.random(len(pick)) < 0.02, 0.5, 0.0))
        if now >= max_age:
            assert sched.ages_s(now).max() <= max_age / SEC, hop
    assert sched.overdue == 0


def test_scheduler_dependent_pairs_always_evaluated() -> None:
    """Pairs whose last estimate is >= min_effect or that the detector holds dependent are picked every hop,
    first, even when the budget is tight and the screen fails them."""
    n = 300
    sched = _sched(n, budget=20)
    hot = np.array([3, 50, 299])
    sched.mark_refreshed(hot[:2], 0, np.array([0.4, 0.1]))
    sched.mark_refreshed(hot[2:], 0, np.array([0.02]), np.array([True]))  # low, but held dependent
    for hop in range(1, 30):
        pick = sched.plan(np.zeros(n, dtype=bool), np.zeros(n), hop * SEC, SEC, 5 * SEC)
        assert pick[:3].tolist() == hot.tolist()
        assert len(pick) == 20
        sched.mark_refreshed(pick[3:], hop * SEC, np.zeros(17))
    assert sched.overdue > 0  # 300 pairs cannot all be refreshed every 5 s with 17 rotation slots: counted


def _three_passing(budget: int) -> tuple[Scheduler, np.ndarray, np.ndarray]:
    """A scheduler of 10 refreshed pairs of which 2, 5 and 7 pass the screen with statistics 10, 30 and 20."""
    sched = _sched(10, budget=budget)
    sched.mark_refreshed(np.arange(10), 0, np.zeros(10))
    passed = np.zeros(10, dtype=bool)
    passed[[2, 5, 7]] = True
    stat = np.zeros(10)
    stat[[2, 5, 7]] = [10.0, 30.0, 20.0]
    return sched, passed, stat


def test_scheduler_passing_pairs_strongest_first() -> None:
    """Pairs that pass the screen come after hot pairs, strongest statistic first, before rotation."""
    sched, passed, stat = _three_passing(budget=3)
    assert sched.plan(passed, stat, SEC, SEC, 100 * SEC).tolist() == [5, 7, 2]


def test_screener_rejects_bad_settings() -> None:
    """Bad screening settings raise ConfigError naming the value."""
    kw = dict(window_len=256, hop_s=1.0, min_effect=0.1, max_age_s=60.0, hop_budget=0.8)
    with pytest.raises(ConfigError, match="screening"):
        Screener(mode="sometimes", **kw)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="hop_budget"):
        Screener(mode="auto", **{**kw, "hop_budget": 1.5})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_age_s"):
        Screener(mode="auto", **{**kw, "max_age_s": 0.0})  # type: ignore[arg-type]


def _signals(n_ch: int, n: int, rng: np.random.Generator) -> tuple[np.ndarray, list[tuple[int, int]]]:
    x = rng.standard_normal((n_ch, n))
    dep = []
    for g, f in zip(range(0, 16, 2), [lambda v: v, np.square, np.abs, lambda v: np.sin(2 * v)] * 2, strict=True):
        x[g + 1] = f(x[g]) + 0.3 * x[g + 1]
        dep.append((g, g + 1))
    return x, dep


def test_engine_screening_gives_network_estimates_for_dependent_pairs(tmp_path, monkeypatch) -> None:
    """40 channels (780 pairs), screening on: dependent pairs get network estimates >= min_effect every hop,
    most other cells are screen results marked as such with age 0, and change events name only pairs the
    network evaluated."""
    monkeypatch.setenv("STREAMCORR_CACHE_DIR", str(tmp_path))
    n_ch, window, hop = 40, 256, 50
    names = [f"c{k:02d}" for k in range(n_ch)]
    cfg = EngineConfig(channels=names, rate_hz=50.0, window_len=window, hop_samples=hop, screening="on",
                       max_age_s=8.0, min_effect=0.1)  # fmt: skip
    eng = Engine(cfg)
    eng.screener.pairs_per_s = 1e6  # a known model speed: the plan must not depend on this machine's load
    rng = np.random.default_rng(5)
    data, dep = _signals(n_ch, window + 10 * hop, rng)
    t = np.arange(data.shape[1]) / 50.0
    period = eng.resampler.period_ns
    end0 = round(t[window - 1] * 1e9) // period * period
    net_pairs: set[tuple[str, str]] = set()
    for h in range(10):
        sl = slice(0, window) if h == 0 else slice(window + (h - 1) * hop, window + h * hop)  # the hop's samples
        eng.push_frame(t[sl], {name: data[k, sl] for k, name in enumerate(names)})
        snap, events = eng.evaluate(end0 + h * hop * period)
        assert snap.source is not None and snap.network_age_s is not None
        for a, b in dep:
            assert snap.source[a, b] == SOURCE_NETWORK, (h, a, b)
            assert snap.age_s[a, b] == 0 and snap.mi[a, b] >= 0.1, (h, a, b, snap.mi[a, b])
        iu = np.triu_indices(n_ch, 1)
        src = snap.source[iu]
        assert (src != SOURCE_NONE).all()  # every pair assessed every hop
        assert (src == SOURCE_SCREEN).mean() > 0.6  # rotation 1/8 per hop, passing ~8% at window 256
        screened = snap.source == SOURCE_SCREEN
        assert (snap.age_s[screened] == 0).all() and (snap.mi[screened] < 0.1).all()
        net_pairs |= {(names[a], names[b]) for a, b in zip(*np.nonzero(snap.source == SOURCE_NETWORK), strict=True)
                      if snap.network_age_s[a, b] == 0}  # fmt: skip
        for ev in events:
            assert ev.pair in net_pairs
    assert (snap.network_age_s[np.triu_indices(n_ch, 1)] <= 8.0).all()  # max_age: every pair had a network turn
    assert eng.counters.pairs_screened > 0 and eng.counters.screen_passed >= len(dep)


def test_engine_auto_without_screening_for_few_pairs(tmp_path, monkeypatch) -> None:
    """screening 'auto' with a handful of pairs evaluates every pair with the network, no screen cells."""
    monkeypatch.setenv("STREAMCORR_CACHE_DIR", str(tmp_path))
    names = ["a", "b", "c", "d"]
    eng = Engine(EngineConfig(channels=names, rate_hz=10.0, window_len=64, hop_samples=10))
    rng = np.random.default_rng(6)
    t = np.arange(80) / 10.0
    eng.push_frame(t, {n: rng.standard_normal(80) for n in names})
    period = eng.resampler.period_ns
    snap, _ = eng.evaluate(round(t[63] * 1e9) // period * period)
    assert snap.source is not None
    iu = np.triu_indices(4, 1)
    assert (snap.source[iu] == SOURCE_NETWORK).all()
    assert eng.counters.pairs_screened == 0


def test_envelope_round_trip_with_source() -> None:
    """The per-cell source survives encode/decode; snapshots without it decode with source None."""
    st_ = MatrixState(["a", "b", "c"])
    st_.update(np.array([0]), np.array([1]), np.array([0.5]), np.array([1.0]), SEC)
    st_.update(np.array([0, 1]), np.array([2, 2]), np.array([0.01, 0.0]), np.ones(2), 2 * SEC, source=SOURCE_SCREEN)
    snap = st_.snapshot(3 * SEC, 0)
    body = decode_message(encode_snapshot(snap)).body
    assert body.source is not None
    np.testing.assert_array_equal(body.source, snap.source)
    assert body.source[0, 1] == SOURCE_NETWORK and body.source[0, 2] == SOURCE_SCREEN and body.source[0, 0] == 0
    np.testing.assert_allclose(body.age_s[0, 1], 2.0)
    assert snap.network_age_s is not None and snap.network_age_s[0, 1] == 2.0 and np.isinf(snap.network_age_s[0, 2])
    plain = type(snap)(1, 0, 0, snap.channels, snap.mi, snap.age_s, snap.coverage)
    assert decode_message(encode_snapshot(plain)).body.source is None


def test_pairs_selection_with_screening(tmp_path, monkeypatch) -> None:
    """A pair list is screened and scheduled like all pairs: only the listed pairs are assessed."""
    monkeypatch.setenv("STREAMCORR_CACHE_DIR", str(tmp_path))
    names = [f"c{k}" for k in range(6)]
    sel = PairSelection(pairs=(("c0", "c1"), ("c2", "c5")))
    eng = Engine(EngineConfig(channels=names, rate_hz=10.0, window_len=64, hop_samples=10, pairs=sel,
                              screening="on", max_age_s=100.0))  # fmt: skip
    rng = np.random.default_rng(7)
    t = np.arange(80) / 10.0
    eng.push_frame(t, {n: rng.standard_normal(80) for n in names})
    period = eng.resampler.period_ns
    snap, _ = eng.evaluate(round(t[63] * 1e9) // period * period)
    assert snap.source is not None
    assessed = {(int(a), int(b)) for a, b in zip(*np.nonzero(snap.source), strict=True) if a < b}
    assert assessed == {(0, 1), (2, 5)}


def test_engine_new_dependence_is_reported_after_screening(tmp_path, monkeypatch) -> None:
    """A pair that only ever failed the screen and then becomes dependent yields a became-dependent event
    (the screen's verdict is its prior state), not a silent first evaluation."""
    monkeypatch.setenv("STREAMCORR_CACHE_DIR", str(tmp_path))
    n_ch, window, hop = 30, 512, 50  # at window 512 an independent pair passes the screen with p < 0.001
    names = [f"c{k:02d}" for k in range(n_ch)]
    cfg = EngineConfig(channels=names, rate_hz=50.0, window_len=window, hop_samples=hop, screening="on",
                       max_age_s=1000.0)  # fmt: skip
    eng = Engine(cfg)
    rng = np.random.default_rng(8)
    n = window + 16 * hop
    data = rng.standard_normal((n_ch, n))
    onset = window + 4 * hop
    data[29, onset:] = data[28, onset:] ** 2 + 0.3 * data[29, onset:]
    t = np.arange(n) / 50.0
    period = eng.resampler.period_ns
    end0 = round(t[window - 1] * 1e9) // period * period
    kinds = []
    for h in range(17):
        sl = slice(0, window) if h == 0 else slice(window + (h - 1) * hop, window + h * hop)
        eng.push_frame(t[sl], {name: data[k, sl] for k, name in enumerate(names)})
        snap, events = eng.evaluate(end0 + h * hop * period)
        if h == 3:
            assert snap.source is not None and snap.source[28, 29] == SOURCE_SCREEN
        kinds += [ev.kind for ev in events if ev.pair == ("c28", "c29")]
    assert kinds[:1] == ["became-dependent"], kinds


def test_scheduler_budget_bounds_passing_pairs_not_hot_ones() -> None:
    """Hot pairs beyond the budget are all evaluated (where most pairs are dependent screening cannot save work);
    passing pairs fill what they leave, never less than PASSING_SHARE of the budget, and the rest wait, counted
    in ``deferred``; the rotation gets what is left; a hard cap cuts the whole plan."""
    sched, passed, stat = _three_passing(budget=2)
    assert sched.plan(passed, stat, SEC, SEC, 100 * SEC).tolist() == [5, 7]
    assert sched.deferred == 1
    assert sched.plan(passed, stat, SEC, SEC, 5 * SEC, budget=5).tolist() == [5, 7, 2, 0, 1]  # share: 10 / 5
    assert sched.plan(passed, stat, SEC, SEC, 100 * SEC, budget=3, cap=2).tolist() == [5, 7]
    sched.mark_refreshed(np.array([0, 1, 3]), SEC, np.full(3, 0.5))  # three hot pairs, budget 2
    assert sched.plan(passed, stat, 2 * SEC, SEC, 100 * SEC).tolist() == [0, 1, 3, 5]  # share: 0.5 x 2


def test_scheduler_passing_pairs_seen_last_hop_wait() -> None:
    """Among passing pairs that do not all fit, those the network saw at the previous hop go last, so the
    strongest chance passers cannot take every hop."""
    sched, passed, stat = _three_passing(budget=2)
    sched.mark_refreshed(np.array([5]), 4 * SEC, np.array([0.02]))  # pair 5: seen last hop, not hot
    assert sched.plan(passed, stat, 5 * SEC, SEC, 100 * SEC).tolist() == [7, 2]


def test_screener_bounds_the_hop_at_short_windows() -> None:
    """At window 256 the screen passes many independent pairs; the plan for 160 independent channels (12,720
    pairs) stays within the budget instead of sending every passing pair to the network."""
    rng = np.random.default_rng(7)
    n_ch, window = 160, 256
    u = rank_transform(rng.standard_normal((n_ch, window)))
    pairs = PairSelection().resolve([f"c{k}" for k in range(n_ch)])
    sched = Scheduler(pairs, max_pairs_per_hop=len(pairs), min_effect=0.1)
    scr = Screener(mode="on", window_len=window, hop_s=1.0, min_effect=0.1, max_age_s=120.0, hop_budget=0.8)
    scr.pairs_per_s = 500.0  # a known model speed: budget 400 pairs per hop
    plan = scr.plan(list(u), pairs, sched, SEC, SEC)
    assert plan.passed > 2 * plan.budget, plan.passed  # the premise: many chance passers at this window
    assert len(plan.pick) <= plan.budget and sched.deferred == plan.passed - len(plan.pick)
