import asyncio

import numpy as np
import pytest

from streamcorr.engine.core import Engine, EngineConfig

RATE = 50.0


def _config(**kw):
    base = dict(channels=[], rate_hz=RATE, window_len=512, hop_samples=100, max_staleness_s=0.05,
                skip_stale_hops=False, queue_size=10_000)  # fmt: skip
    return EngineConfig(**(base | kw))


def _stream(duration_s: float, seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Six channels; a-b dependent only in [200, 400) s; c-d dependent until 300 s; e, f never."""
    rng = np.random.default_rng(seed)
    n = int(duration_s * RATE)
    t = np.arange(n) / RATE
    ch = {k: rng.standard_normal(n) for k in "abcdef"}
    on_ab = (t >= 200) & (t < 400)
    ch["b"] = np.where(on_ab, np.sin(2 * ch["a"]) + 0.3 * rng.standard_normal(n), ch["b"])  # non-monotone
    on_cd = t < 300
    ch["d"] = np.where(on_cd, ch["c"] ** 2 + 0.3 * rng.standard_normal(n), ch["d"])
    return t, ch


async def _replay(eng: Engine, t: np.ndarray, ch: dict[str, np.ndarray], chunk: int = 100) -> list:
    events = []

    async def collect():
        async for ev in eng.events():
            events.append(ev)

    task = asyncio.create_task(collect())
    await asyncio.sleep(0)
    for s in range(0, len(t), chunk):
        for name, v in ch.items():
            eng.push(name, t[s : s + chunk] + 0.001, v[s : s + chunk])
        await eng.flush()
    await asyncio.sleep(0.05)
    task.cancel()
    return events


def test_events_fire_on_switching_pairs_only_over_ten_minutes():
    """Over 10 simulated minutes, switches raise events on the switched pairs within two windows, and no other
    pair ever raises one (dependences are non-monotone: Pearson r is about 0 for both)."""
    t, ch = _stream(600.0)
    eng = Engine(_config(channels=list("abcdef")))
    events = asyncio.run(_wrap(eng, t, ch))
    by_pair = {}
    for ev in events:
        by_pair.setdefault(ev.pair, []).append(ev)
    assert set(by_pair) <= {("a", "b"), ("c", "d")}, by_pair.keys()
    window_s = 512 / RATE

    def first(pair, kind, after):
        return min(ev.t_ns / 1e9 for ev in by_pair[pair] if ev.kind == kind and ev.t_ns / 1e9 >= after)

    assert first(("a", "b"), "became-dependent", 200) - 200 <= 2 * window_s
    assert first(("a", "b"), "became-independent", 400) - 400 <= 2 * window_s
    assert first(("c", "d"), "became-independent", 300) - 300 <= 2 * window_s
    assert eng.counters.hops >= 250 and eng.counters.hops_skipped == 0


async def _wrap(eng, t, ch):
    async with eng:
        return await _replay(eng, t, ch)


def test_bad_input_is_counted_not_fatal():
    """NaN/inf, duplicate and out-of-order timestamps, a silent and a constant channel, and a channel added at
    run time are each counted or handled, and the engine keeps publishing."""

    async def run():
        eng = Engine(_config(channels=["x", "y", "silent", "const"], window_len=128, hop_samples=50))
        rng = np.random.default_rng(3)
        snaps = []
        async with eng:
            for k in range(600):
                tk = k / RATE
                x = rng.standard_normal()
                eng.push("x", tk, np.nan if k % 97 == 0 else x)
                eng.push("y", tk, x + 0.2 * rng.standard_normal())
                eng.push("const", tk, 1.0)
                if k % 50 == 0:
                    eng.push("y", tk, 0.0)  # duplicate timestamp
                    eng.push("y", tk - 1.0, 0.0)  # out of order
                    eng.push("x", tk, np.inf)
                if k >= 300:
                    eng.push("late_joiner", tk, x**2)
                eng.push("x", tk, "not a number")  # type: ignore[arg-type]
                await eng.flush()
                if eng.latest is not None:
                    snaps.append(eng.latest)
        return eng, snaps

    eng, snaps = asyncio.run(run())
    bufs = {name: c.buffer.counters for name, c in eng.intake.channels.items()}
    assert bufs["x"].nonfinite >= 6 + 12
    assert bufs["y"].duplicate == 12 and bufs["y"].late == 12
    assert eng.counters.bad_sample == 600
    last = snaps[-1]
    names = list(last.channels)
    assert "late_joiner" in names
    ix, iy, isil, icon = (names.index(n) for n in ("x", "y", "silent", "const"))
    assert last.mi[ix, iy] > 0.5
    assert last.mi[ix, icon] == 0.0  # a constant channel has MI exactly 0
    assert np.isnan(last.mi[ix, isil]) and np.isinf(last.age_s[ix, isil])  # never valid: never evaluated
    assert eng.counters.pairs_low_coverage > 0
    assert last.mi[names.index("late_joiner"), ix] > 0.3


def test_the_library_hops_as_a_config_file_does():
    """EngineConfig without a hop evaluates once a second at any rate, as a config file without one does."""
    from streamcorr.config import parse_config

    for rate in (10.0, 50.0, 400.0):
        from_file = EngineConfig.from_config(parse_config({"version": 1, "channels": {"rate_hz": rate}},
                                                          need_sources=False))  # fmt: skip
        assert EngineConfig(rate_hz=rate).hop_samples == from_file.hop_samples == round(rate)
    assert EngineConfig(rate_hz=40.0, hop_s=0.25).hop_samples == 10


def test_config_rejects_impossible_settings():
    """Window shorter than the model minimum, a negative hop, both hop forms or duplicate channels raise
    ConfigError."""
    from streamcorr.errors import ConfigError

    bad = ({"window_len": 16}, {"hop_samples": -1}, {"hop_s": 0.0}, {"hop_samples": 10, "hop_s": 0.1},
           {"channels": ["a", "a"]}, {"min_coverage": 0})  # fmt: skip
    for kw in bad:
        with pytest.raises(ConfigError):
            _config(**kw)


def test_config_checks_keys_of_one_section_together():
    """More than 256 channels work with max_channels raised to match (a rule across two keys of one section),
    and are refused with the fix named when it is not raised."""
    from streamcorr.errors import ConfigError

    names = [f"ch{i:04d}" for i in range(300)]
    assert EngineConfig(channels=names, max_channels=300).max_channels == 300
    with pytest.raises(ConfigError, match="300 names but max_channels is 256: raise max_channels"):
        EngineConfig(channels=names)


def test_a_gap_in_one_channel_shows_in_its_pairs_coverage_while_their_values_age():
    """One of three channels falls silent for 4 s (a window is 3.2 s): its pairs' coverage falls at once with the
    gap, their MI keeps its value and ages, and once the channel is back the pairs are estimated again."""
    rng = np.random.default_rng(44)
    rate, period = 20.0, 50_000_000
    eng = Engine(EngineConfig(channels=["a", "b", "c"], rate_hz=rate, window_len=64, hop_samples=20,
                              max_staleness_s=0.1, skip_stale_hops=False))  # fmt: skip
    snaps = []
    for sec in range(30):
        t = (sec * 20 + np.arange(20, dtype=np.int64)) * period + 10**6
        x = rng.standard_normal(20)
        eng.push_ns("a", t, x)
        if not 12 <= sec < 16:
            eng.push_ns("b", t, x + 0.3 * rng.standard_normal(20))
        eng.push_ns("c", t, rng.standard_normal(20))
        snaps += [eng.evaluate(end)[0] for end in eng.due_windows()]
    by_t = {round(s.t_ns / 1e9): s for s in snaps}
    before, during, after = by_t[11], by_t[15], by_t[29]
    assert before.coverage[0, 1] == 1.0 and before.age_s[0, 1] == 0.0 and before.mi[0, 1] > 0.5
    assert during.coverage[0, 1] < 0.5 and during.coverage[1, 2] < 0.5 and during.coverage[0, 2] == 1.0
    refreshed = by_t[round(15 - during.age_s[0, 1])]
    assert during.age_s[0, 1] >= 2.0 and during.mi[0, 1] == refreshed.mi[0, 1]  # the old value, aged
    assert after.coverage[0, 1] == 1.0 and after.age_s[0, 1] == 0.0 and after.mi[0, 1] > 0.5
