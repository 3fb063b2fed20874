"""The engine's incremental ranks follow the estimator's tie policy (issue 13)."""

import asyncio
import functools

import numpy as np
import pytest

import streamcorr
from streamcorr import Estimator
from streamcorr.engine.core import Engine, EngineConfig
from streamcorr.estimate.salts import name_salt, rank_transform

RATE = 50.0


@functools.cache
def _run(ties: str, seed: int = 7) -> Engine:
    """Quantised sensors through several hops (so the sliding ranks are updated, not rebuilt), and a constant."""
    est = Estimator(ties=ties)  # type: ignore[arg-type]

    async def run() -> Engine:
        cfg = EngineConfig(channels=["x", "y", "z", "const"], rate_hz=RATE, window_len=256, hop_samples=64,
                           max_staleness_s=0.05, skip_stale_hops=False, queue_size=10_000)  # fmt: skip
        eng = Engine(cfg, estimator=est)
        rng = np.random.default_rng(seed)
        async with eng:
            for k in range(640):
                tk = k / RATE
                x = rng.standard_normal()
                eng.push("x", tk, np.round(2 * x))  # about 9 levels: many ties
                eng.push("y", tk, np.round(x + 0.5 * rng.standard_normal()))
                eng.push("z", tk, float(rng.integers(0, 4)))  # independent, 4 levels
                eng.push("const", tk, 3.0)
                await eng.flush()
        return eng

    return asyncio.run(run())


@pytest.mark.parametrize("ties", ["jitter", "mid"])
def test_engine_matches_estimator_matrix_on_the_same_window(ties):
    """With tied (quantised) samples, the engine's MI after many incremental hops equals the estimator's on the
    same window under the same tie policy (jitter: with each channel's salt, a digest of its name; mid-ranks:
    Estimator.matrix and estimate_batch as they are); a constant channel gives exactly 0."""
    eng = _run(ties)
    est = eng.est
    assert eng.counters.hops >= 5
    assert eng.latest is not None and eng._last_window is not None
    names, window = eng._last_window
    assert list(eng.latest.channels) == list(names) and np.isfinite(window).all()
    got = eng.latest.mi
    i, j = np.triu_indices(len(names), 1)
    off = ~np.eye(len(names), dtype=bool)
    if ties == "jitter":
        u = rank_transform(window, "jitter", salts=np.array([name_salt(n) for n in names], dtype=np.uint64))
        want = est.estimate_ranks(u, i, j, window.min(axis=1) == window.max(axis=1))
        np.testing.assert_allclose(got[i, j], want, rtol=0, atol=1e-5)
    else:
        np.testing.assert_allclose(got[off], est.matrix(window)[off], rtol=0, atol=1e-5)
        np.testing.assert_allclose(got[i, j], est.estimate_batch(window[i], window[j]), rtol=0, atol=1e-5)
    c = list(names).index("const")
    assert np.all(got[c, off[c]] == 0.0)


def test_tie_policy_changes_the_engine_result_on_tied_data():
    """The comparison above is not vacuous: mid-ranks and jitter give different MI on these quantised channels,
    and an engine built without an estimator takes the default estimator's policy."""
    jit, mid = _run("jitter"), _run("mid")
    ix, iy = 0, 1
    assert abs(jit.latest.mi[ix, iy] - mid.latest.mi[ix, iy]) > 1e-3
    eng = Engine(EngineConfig(channels=["a", "b"], rate_hz=RATE, window_len=256, hop_samples=64))
    assert eng.est.ties == Estimator().ties


def test_a_quantised_reading_in_two_units_reads_its_entropy_not_a_copy():
    """Two channels carrying one quantised reading (a temperature in whole degrees C and in whole degrees F) share
    their tie structure; with jitter ties the engine reads about the entropy of the levels (what the pair
    shares), not the ~4.6 nats of an exact copy, as does estimate_mi; an independent channel stays near 0."""
    rng = np.random.default_rng(41)
    n, rate = 1024 + 256, 50.0  # a window and a hop
    walk = np.cumsum(rng.standard_normal(n + 200))[200:]
    celsius = np.round(20 + 2 * (walk - walk.mean()) / walk.std())  # about 10 levels
    fahrenheit = np.round(celsius * 9 / 5 + 32)
    other = np.round(rng.standard_normal(n) * 2)
    cfg = EngineConfig(channels=["temp.c", "temp.f", "other"], rate_hz=rate, window_len=1024, hop_samples=256,
                       skip_stale_hops=False, queue_size=10_000)  # fmt: skip

    async def run() -> Engine:
        eng = Engine(cfg)
        async with eng:
            t = np.arange(n) / rate
            for name, v in (("temp.c", celsius), ("temp.f", fahrenheit), ("other", other)):
                eng.push(name, t, v)
            await eng.flush()
            for _ in range(50):
                if eng.latest is not None:
                    break
                await asyncio.sleep(0.1)
        return eng

    eng = asyncio.run(run())
    assert eng.latest is not None and eng._last_window is not None
    names = list(eng.latest.channels)
    c, f, o = (names.index(k) for k in ("temp.c", "temp.f", "other"))
    window = eng._last_window[1]
    levels = np.unique(window[c], return_counts=True)[1] / window.shape[1]
    entropy = float(-(levels * np.log(levels)).sum())  # what the two channels share: all of either
    # the network reads such discrete pairs near 2 nats 0.03-0.12 low, and a decreasing map (which never shared
    # the order) the same: measured on three other walks at 5 to 17 levels
    assert abs(eng.latest.mi[c, f] - entropy) < 0.15, (eng.latest.mi[c, f], entropy)
    assert abs(streamcorr.estimate_mi(window[c], window[f]) - streamcorr.estimate_mi(window[c], -window[f])) < 0.1
    assert eng.latest.mi[c, o] < 0.1 and eng.latest.mi[f, o] < 0.1


def test_the_matrix_does_not_depend_on_the_channels_order():
    """Quantised channels on the clock (shared ranks, each salted by its channel's name) and one at 20 Hz (its pairs
    on their own rows): the same samples with the channels listed in reverse give the same MI in every cell, to
    float32 rounding (each pair is read in one orientation; a jitter that followed the order moved quantised pairs
    by up to 0.28 nats, the orientation by up to 0.04; the network's batches hold the pairs in another order, and
    torch's CPU kernels may round a row differently in another batch)."""
    rng = np.random.default_rng(43)
    n = 40 * 50  # 40 s at 50 Hz
    x = np.cumsum(rng.standard_normal(n)) * 0.2
    t50 = np.arange(n) / 50.0
    levels = rng.integers(0, 4, n).astype(float)
    t20 = t50[::5] + 0.003
    streams = {"a.q": (t50, np.round(x)), "b.q2": (t50, np.round(2 * x) / 2), "c.w": (t50, rng.standard_normal(n)),
               "d.lvl": (t50, levels), "e.slow": (t20, np.round(3 * x[::5]) / 3)}  # fmt: skip

    def matrix(names: list[str]) -> dict[tuple[str, str], float]:
        cfg = EngineConfig(channels=names, rate_hz=50.0, window_len=512, hop_samples=100, max_staleness_s=0.25,
                           skip_stale_hops=False, queue_size=100_000)  # fmt: skip
        eng = Engine(cfg)
        for name in names:
            eng.push(name, *streams[name])
        snap = None
        for end in eng.due_windows():
            snap, _ = eng.evaluate(end)
        assert snap is not None
        ch = list(snap.channels)
        return {(a, b): float(snap.mi[ch.index(a), ch.index(b)]) for a in names for b in names if a < b}

    order = sorted(streams)
    first, second = matrix(order), matrix(order[::-1])
    assert first.keys() == second.keys()
    np.testing.assert_allclose(list(first.values()), [second[k] for k in first], rtol=1e-5, atol=1e-6)
    assert first[("a.q", "b.q2")] > 0.5 and np.isfinite(list(first.values())).all()
