"""The built-in demo: a simulated sensor rig streamed through the engine, shown live in the terminal.

``run_live_demo`` paces the rig in (scaled) real time and draws the view;
``check_script`` replays the rig's script through the engine as fast as it
computes and reports what the engine detected, for tests and for measuring the
false-event rate. Importing this package does not load torch: the engine is
imported when a function needs it.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from .rig import CHANNELS, SLOW_CHANNELS, Pair, Rig, ScriptedChange
from .terminal import TerminalView, compact_line, render

if TYPE_CHECKING:
    from rich.console import Console

    from ..engine.changes import ChangeEvent, EventKind
    from ..engine.core import Engine, EngineConfig
    from ..engine.matrix import Snapshot
    from ..publish.sinks import Publisher

__all__ = [
    "CHANNELS",
    "DEMO_DELTA",
    "SLOW_CHANNELS",
    "Pair",
    "RecentRate",
    "Rig",
    "ScriptCheck",
    "ScriptedChange",
    "TerminalView",
    "check_script",
    "compact_line",
    "demo_config",
    "render",
    "run_live_demo",
]

# Rise/fall threshold for the demo (nats). The detector's default (0.1) is below the window-to-window spread of
# strongly dependent pairs at 512 samples, so stable pairs would report rise/fall every few seconds.
DEMO_DELTA = 0.5


def demo_config(rig: Rig, **overrides: Any) -> EngineConfig:
    """Engine settings for the rig: 512-sample windows (~10 s at 50 Hz), a hop of 50 samples, every pair."""
    from ..engine.core import EngineConfig

    base: dict[str, Any] = dict(
        channels=list(rig.channels),
        rate_hz=rig.rate_hz,
        window_len=512,
        hop_samples=50,
        max_staleness_s=1.5 / rig.rate_hz,
        delta=DEMO_DELTA,
    )
    return EngineConfig(**(base | overrides))


@dataclass
class ScriptCheck:
    """What the engine reported over a replay of the rig's script, judged against the script."""

    duration_s: float
    window_s: float
    hops: int
    events: list[ChangeEvent]
    delays_s: dict[tuple[Pair, EventKind], float]  # expected (pair, kind) -> seconds after the scripted change
    missing: list[tuple[Pair, EventKind]]  # expected, not seen after the change
    false_events: list[ChangeEvent]  # on pairs the script says are stable
    transient_late: list[
        ChangeEvent
    ]  # starting an excursion on a transient pair, but not within two windows of a change
    other_events: list[ChangeEvent] = field(default_factory=list)  # on every pair that is not stable

    @property
    def max_delay_s(self) -> float:
        return max(self.delays_s.values(), default=0.0)

    def __str__(self) -> str:
        lines = [
            f"{self.duration_s:.0f} s replayed, {self.hops} hops, {len(self.events)} events; "
            f"window {self.window_s:.2f} s",
            f"expected events found: {len(self.delays_s)} of {len(self.delays_s) + len(self.missing)}; "
            f"max delay {self.max_delay_s:.1f} s",
            f"events on stable pairs: {len(self.false_events)}; transient excursions starting later than two windows: "
            f"{len(self.transient_late)}; on changing, transient or borderline pairs: {len(self.other_events)}",
        ]
        lines += [f"  missing: {p[0]}~{p[1]} {kind}" for p, kind in self.missing]
        lines += [f"  false: t={e.t_ns / 1e9:.1f} {e.kind} {e.pair[0]}~{e.pair[1]}" for e in self.false_events]
        return "\n".join(lines)


async def _replay(engine: Engine, rig: Rig, duration_s: float, chunk_s: float = 1.0) -> list[ChangeEvent]:
    events: list[ChangeEvent] = []

    async def collect() -> None:
        async for ev in engine.events():
            events.append(ev)

    task = asyncio.create_task(collect())
    await asyncio.sleep(0)  # let the collector subscribe before the first hop
    chunk = max(1, round(chunk_s * rig.rate_hz))
    left = round(duration_s * rig.rate_hz)
    while left > 0:
        t, values = rig.arrays(min(chunk, left))
        left -= len(t)
        for name, v in values.items():
            engine.push(name, t, v)
        await engine.flush()
    await asyncio.sleep(0.05)
    task.cancel()
    return events


def check_script(
    seed: int = 0,
    *,
    script_scale: float = 1.0,
    duration_s: float | None = None,
    delta: float = DEMO_DELTA,
    estimator: Any = None,
    **overrides: Any,
) -> ScriptCheck:
    """Replay the rig through a real Engine (demo settings, with ``overrides`` of EngineConfig fields) and compare
    the events with the script.

    duration_s defaults to the last scripted change plus 40 s at script_scale=1.
    """
    from ..engine.core import Engine
    from ..estimate.estimator import default_estimator

    rig = Rig(seed, script_scale=script_scale)
    duration = duration_s if duration_s is not None else rig.script[-1].t_s + 40.0 * script_scale
    if duration <= 0:
        raise ConfigError(f"duration_s must be > 0; got {duration}")
    cfg = demo_config(rig, **({"delta": delta, "skip_stale_hops": False, "queue_size": 100_000} | overrides))
    engine = Engine(cfg, estimator or default_estimator())

    async def run() -> list[ChangeEvent]:
        async with engine:
            return await _replay(engine, rig, duration)

    events = asyncio.run(run())
    window_s = cfg.window_len / cfg.rate_hz
    stable, transient = set(rig.stable_pairs()), rig.transient_pairs()
    delays: dict[tuple[Pair, EventKind], float] = {}
    for change in rig.script:
        for pair, kind in change.expected:
            after = [e.t_ns / 1e9 - change.t_s for e in events if e.pair == pair and e.kind == kind]
            after = [d for d in after if d >= 0]
            if after:
                delays[(pair, kind)] = min(after)
    missing = [k for c in rig.script for k in c.expected if k not in delays]

    def near_change(ev: ChangeEvent) -> bool:
        t = ev.t_ns / 1e9
        return any(ev.pair in c.transient and 0 <= t - c.t_s <= 2 * window_s for c in rig.script)

    def starts_excursion(ev: ChangeEvent) -> bool:  # the return to independence may come later
        return ev.kind in ("became-dependent", "rise", "fall")

    return ScriptCheck(
        duration_s=duration,
        window_s=window_s,
        hops=engine.counters.hops,
        events=events,
        delays_s=delays,
        missing=missing,
        # a stable pair's verdict at its first assessment (initial) is its starting state, not a change
        false_events=[e for e in events if e.pair in stable and not e.initial],
        transient_late=[e for e in events if e.pair in transient and starts_excursion(e) and not near_change(e)],
        other_events=[e for e in events if e.pair not in stable],
    )


class RecentRate:
    """Rate of a growing count over about the last ``window_s`` seconds, not since the start: the engine's first
    window and the model's warm-up must not read as the engine falling behind (a since-start average climbs for
    minutes after a slow start).

    >>> r = RecentRate(window_s=10.0)
    >>> [round(r.update(n, now=t)) for t, n in ((0.0, 0), (10.0, 100), (20.0, 2100), (30.0, 4100))]
    [0, 10, 200, 200]
    """

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._points: collections.deque[tuple[float, float]] = collections.deque()

    def update(self, total: float, now: float | None = None) -> float:
        """Record the count ``total`` at ``now`` (monotonic seconds) and return the recent rate per second."""
        now = time.monotonic() if now is None else now
        self._points.append((now, total))
        while len(self._points) > 2 and self._points[1][0] <= now - self.window_s:
            self._points.popleft()  # keep one point at or before the window's start, so the span is a full window
        t0, n0 = self._points[0]
        return (total - n0) / (now - t0) if now > t0 else 0.0


def _drops(engine: Engine) -> dict[str, int]:
    c = engine.counters
    return {**engine.sample_drops(), "snapshots": c.snapshots_dropped, "events": c.events_dropped}


class _PearsonWindow:
    """The last window_len frames of every channel, for the Pearson matrix the view compares MI against."""

    def __init__(self, channels: tuple[str, ...], window_len: int) -> None:
        self.channels = channels
        self.data = np.full((len(channels), window_len), np.nan)
        self.at = 0

    def add(self, values: Mapping[str, np.ndarray]) -> None:
        for k, name in enumerate(self.channels):
            v = np.asarray(values[name])[-self.data.shape[1] :]
            idx = (self.at + np.arange(len(v))) % self.data.shape[1]
            self.data[k, idx] = v
        self.at = (self.at + len(v)) % self.data.shape[1]

    def matrix(self, order: tuple[str, ...]) -> np.ndarray:
        rows = [self.channels.index(c) if c in self.channels else -1 for c in order]
        x = np.ma.masked_invalid(self.data)
        r = np.ma.corrcoef(x).filled(np.nan)
        out = np.full((len(order), len(order)), np.nan)
        for i, a in enumerate(rows):
            for j, b in enumerate(rows):
                if a >= 0 and b >= 0:
                    out[i, j] = r[a, b]
        return out


class _TerminalOutput:
    """The terminal view, and the caller's event record, as a Publisher that :func:`forward` feeds."""

    def __init__(
        self, view: TerminalView, stats: Callable[[], Mapping[str, Any]], record: list[ChangeEvent] | None
    ) -> None:
        self.view, self.stats, self.record = view, stats, record

    async def publish_snapshot(self, snap: Snapshot) -> None:
        self.view.update(snapshot=snap, stats=self.stats())  # rates and the Pearson matrix as of this snapshot

    async def publish_event(self, ev: ChangeEvent) -> None:
        self.view.update(event=ev)
        if self.record is not None:
            self.record.append(ev)

    async def publish_status(self, state: str, counters: Mapping[str, float | int]) -> None:
        pass  # the terminal's stats line comes with each snapshot (stats())


class _Feed:
    """Streams the rig into the engine at ``speed`` x real time (a batch every 0.1 s of wall time), printing
    the script's changes as they happen; keeps the rates and the Pearson window the views show."""

    def __init__(self, rig: Rig, engine: Engine, speed: float, duration_s: float, view: TerminalView,
                 title: str) -> None:  # fmt: skip
        self.rig, self.engine, self.speed, self.view, self.title = rig, engine, speed, view, title
        self.pearson = _PearsonWindow(rig.channels, engine.cfg.window_len)
        self.frames_per_batch = max(1, round(speed * rig.rate_hz * 0.1))
        self.total = round(duration_s * rig.rate_hz)
        self.sent = 0
        self.sample_rate, self.pair_rate = RecentRate(), RecentRate()  # over the last 10 s: what happens now

    async def run(self) -> None:
        rig, started = self.rig, time.monotonic()
        script = list(rig.script)
        while self.sent < self.total:
            t, values = rig.arrays(min(self.frames_per_batch, self.total - self.sent))
            self.sent += len(t)
            for name, v in values.items():
                self.engine.push(name, t, v)
            self.pearson.add(values)
            while script and t[-1] >= script[0].t_s:
                self.view.console.print(f"script: {script.pop(0)}", style="bold magenta", highlight=False)
            target = started + self.sent / (rig.rate_hz * self.speed)
            await asyncio.sleep(max(0.0, target - time.monotonic()))

    def stats(self) -> dict[str, Any]:
        """The terminal's header: rates over the last 10 s, drops, and Pearson on the newest window."""
        snap = self.engine.latest
        return {
            "title": self.title,
            "samples_per_s": self.sample_rate.update(self.sent * len(self.rig.channels)),
            "pairs_per_s": self.pair_rate.update(self.engine.counters.pairs_evaluated),
            "drops": _drops(self.engine),
            "pearson": self.pearson.matrix(snap.channels) if snap is not None else None,
        }

    def web_status(self) -> dict[str, int]:
        """The web page's status line: the terminal's rates and drops."""
        return {
            "pairs_per_s": round(self.pair_rate.update(self.engine.counters.pairs_evaluated)),
            "samples_per_s": round(self.sample_rate.update(self.sent * len(self.rig.channels))),
            "dropped": sum(_drops(self.engine).values()),
        }


async def run_live_demo(
    *,
    seed: int = 0,
    speed: float = 1.0,
    duration_s: float | None = None,
    script_scale: float = 1.0,
    console: Console | None = None,
    refresh_hz: float = 4.0,
    nan_rate: float = 0.0,
    engine_overrides: Mapping[str, Any] | None = None,
    estimator: Any = None,
    web_port: int | None = None,
    web_host: str = "127.0.0.1",
    record: list[ChangeEvent] | None = None,
) -> int:
    """Stream the rig through the engine at `speed` x real time and show the live view; returns an exit code.

    duration_s defaults to the script plus 40 s (scaled). With web_port (0 picks a free one) the live web view
    is served too. Events are appended to `record` if given. Ctrl-C (task cancellation) stops it cleanly.
    """
    from ..engine.core import Engine
    from ..estimate.estimator import default_estimator
    from ..publish.sinks import forward

    if not speed > 0:
        raise ConfigError(f"speed must be > 0 (1 = real time); got {speed}")
    rig = Rig(seed, script_scale=script_scale, nan_rate=nan_rate)
    duration = duration_s if duration_s is not None else rig.script[-1].t_s + 40.0 * script_scale
    cfg = demo_config(rig, **dict(engine_overrides or {}))
    engine = Engine(cfg, estimator or default_estimator())  # shared estimator: its null calibration is cached
    view = TerminalView(console, refresh_hz=refresh_hz)
    title = f"streamcorr demo: simulated robot arm (seed {seed}, {speed:g}x real time)"
    feed = _Feed(rig, engine, speed, duration, view, title)

    outputs: list[Publisher] = []
    web = None
    if web_port is not None:
        from ..publish.web import WebView

        def lag_fn(a: str, b: str) -> dict[str, object] | None:  # the pair's lag curve; None: lags off, not searched
            curve = None if engine.lags is None else engine.lags.curve(a, b)
            return None if curve is None else curve.as_dict()

        web = WebView(host=web_host, port=web_port, table_fn=engine.pair_table, lag_fn=lag_fn, status_line=dict)
        await web.start()
        view.console.print(f"live web view: {web.url}", style="bold", highlight=False)
        outputs.append(web)
    outputs.append(_TerminalOutput(view, feed.stats, record))
    hop_s = cfg.hop_samples / (rig.rate_hz * speed)  # wall seconds between snapshots: one status line each

    async with engine:
        with view:
            forwarder = asyncio.create_task(
                forward(engine, *outputs, status_interval_s=hop_s if web is not None else None, status=feed.web_status)
            )
            await asyncio.sleep(0)
            try:
                await feed.run()
                await engine.flush()
                await asyncio.sleep(0.2)
            finally:
                forwarder.cancel()
                await asyncio.gather(forwarder, return_exceptions=True)
                if web is not None:
                    await web.stop()
    return 0
