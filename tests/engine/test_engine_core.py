"""The engine's hop loop waits on events, not timers: flush returns once every due window is published, drained
once each subscriber has come back after its last item, and stop once the hop thread is done."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from streamcorr.engine.core import Engine, EngineConfig

RATE = 50.0


def _engine(**kw) -> Engine:
    cfg = dict(channels=["a", "b", "c"], rate_hz=RATE, window_len=128, hop_samples=25, max_staleness_s=0.05,
               skip_stale_hops=False, queue_size=1000)  # fmt: skip
    return Engine(EngineConfig(**(cfg | kw)))


def _push(eng: Engine, start_s: float, seconds: float, rng: np.random.Generator) -> None:
    t = start_s + np.arange(int(seconds * RATE)) / RATE + 0.003  # off the grid: real stamps
    a = np.cumsum(rng.standard_normal(len(t))) * 0.1  # a slow drift
    for name, v in (("a", a), ("b", a + 0.5 * rng.standard_normal(len(t))), ("c", rng.standard_normal(len(t)))):
        eng.push(name, t, v)


def test_flush_returns_when_every_due_window_has_been_published():
    """After flush, the newest snapshot is the last due window's, at every step of an irregular feed."""
    rng = np.random.default_rng(41)

    async def run() -> list[int]:
        eng = _engine()
        seen: list[int] = []

        async def take() -> None:
            async for snap in eng.snapshots():
                seen.append(snap.t_ns)

        await eng.start()
        task = asyncio.create_task(take())
        await asyncio.sleep(0)
        start = 0.0
        for seconds in (3.0, 0.2, 1.7, 0.5, 2.3):
            _push(eng, start, seconds, rng)
            start += seconds
            await eng.flush()
            assert not eng.intake.has_due()
            assert eng.latest is not None and eng.latest.t_ns <= round(start * 1e9)
            await eng.drained()
            assert seen and seen[-1] == eng.latest.t_ns  # the subscriber has had it
        await eng.stop()
        task.cancel()
        return seen

    seen = asyncio.run(run())
    assert seen == sorted(seen) and len(seen) == len(set(seen)) >= 10


def test_flush_with_nothing_due_returns_at_once():
    """An idle engine's flush does not wait for a timer."""

    async def run() -> float:
        eng = _engine()
        await eng.start()
        t0 = time.perf_counter()
        await eng.flush()
        await eng.drained()
        dt = time.perf_counter() - t0
        await eng.stop()
        return dt

    assert asyncio.run(run()) < 0.05


def test_stop_waits_for_the_hop_thread_and_ends_it_early():
    """stop() during a hop returns once the hop's thread has ended (at its next model batch), well within its
    timeout, and the engine can be flushed afterwards without hanging."""
    rng = np.random.default_rng(42)
    entered = threading.Event()

    async def run() -> tuple[float, bool]:
        eng = _engine(channels=[f"c{k}" for k in range(40)], window_len=256)
        real = eng.evaluate

        def slow(end_tick: int):  # a hop that is still running when stop() comes
            entered.set()
            time.sleep(0.3)
            return real(end_tick)

        eng.evaluate = slow  # type: ignore[method-assign]
        await eng.start()
        t = np.arange(int(8 * RATE)) / RATE
        for k in range(40):
            eng.push(f"c{k}", t, rng.standard_normal(len(t)))
        while not entered.is_set():
            await asyncio.sleep(0.01)
        t0 = time.perf_counter()
        await eng.stop(timeout_s=5.0)
        dt = time.perf_counter() - t0
        hop = eng._hop
        await asyncio.wait_for(eng.flush(), 1.0)
        return dt, hop is not None and hop.done()

    dt, done = asyncio.run(run())
    assert done and dt < 2.0
