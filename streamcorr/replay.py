"""`streamcorr replay`: a recorded log through the same :class:`~streamcorr.engine.Engine` as a live run.

Every hop is evaluated (``skip_stale_hops`` off), as fast as the machine allows: the log is pushed one
hop of stream time at a time, channel by channel, and each window that is then due is evaluated before
the next push, so the result is the one a live daemon gives when it keeps up with the same samples (the
window waits ``max_staleness_s`` for stragglers either way). The receive clock plays no part: no sample
is refused as "future" (``max_future_s`` off) whatever its time stamp.

Writes ``timeline.parquet``, ``events.parquet``, ``events.jsonl`` (see :mod:`streamcorr.publish.history`)
and ``replay.json`` (what was replayed with which settings, how fast, and whether it was stopped early) into
the output directory. Ctrl-C stops at once: the hop in progress is dropped, every hop before it is written.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .engine import Engine, EngineConfig
from .estimator import Estimator
from .ingest.logs import Recording
from .matrix import Snapshot
from .publish.history import HistoryWriter

__all__ = ["ReplayResult", "replay"]


@dataclass
class ReplayResult:
    outdir: Path
    hops: int
    rows: int
    events: int
    samples: int  # pushed
    stream_s: float  # stream time covered
    wall_s: float
    interrupted: bool

    @property
    def speed(self) -> float:
        """x real time: stream seconds per wall second."""
        return self.stream_s / self.wall_s if self.wall_s > 0 else math.inf


def replay_config(ec: EngineConfig, rec: Recording) -> EngineConfig:
    """The live settings with replay's changes: every hop, no receive clock, buffers deep enough for the
    log's densest channel (a channel sampled faster than the clock would overrun a live buffer too), and
    screening ``auto`` read as ``off``: its budget is a share of the hop's wall time, which a replay does
    not have to keep, and which would make the result depend on the machine's speed (``on`` stays on)."""
    capacity = ec.buffer_len or 2 * (ec.window_len + 2 * ec.hop_samples)
    density = 1.0
    for s in rec.series.values():
        if len(s.t_ns) > 1:
            dt = float(np.median(np.diff(s.t)))
            if dt > 0:
                density = max(density, 1.0 / (dt * ec.rate_hz))
    buffer_len = math.ceil(capacity * density) if density > 1.0 else ec.buffer_len
    screening = "off" if ec.screening == "auto" else ec.screening
    return dataclasses.replace(ec, skip_stale_hops=False, max_future_s=None, buffer_len=buffer_len, screening=screening)


def replay(
    rec: Recording,
    ec: EngineConfig,
    outdir: str | Path,
    *,
    estimator: Estimator | None = None,
    progress: bool = True,
    meta: dict[str, Any] | None = None,
) -> ReplayResult:
    """Run ``rec`` through an engine built from ``ec`` (see the module docstring); returns what was done."""
    ec = replay_config(ec, rec)
    engine = Engine(ec, estimator)
    hop_s = ec.hop_samples / ec.rate_hz
    names = list(rec.series)
    cursor = dict.fromkeys(names, 0)
    total = rec.n_samples
    t0, t_end = rec.t_start, rec.t_end
    n_chunks = max(1, math.floor((t_end - t0) / hop_s) + 1)
    t0_ns = min(int(s.t_ns[0]) for s in rec.series.values())
    hop_ns = ec.hop_samples * round(1e9 / ec.rate_hz)
    writer = HistoryWriter(outdir)
    pushed = 0
    interrupted = False
    wall0 = time.perf_counter()
    last: Snapshot | None = None
    bar = _Progress(total, enabled=progress)
    try:
        for k in range(n_chunks):
            until_ns = t0_ns + (k + 1) * hop_ns  # samples before until; the last chunk takes the rest
            for name in names:
                s, start = rec.series[name], cursor[name]
                stop = len(s.t_ns) if k == n_chunks - 1 else int(np.searchsorted(s.t_ns, until_ns, side="left"))
                if stop > start:
                    engine.push_ns(name, s.t_ns[start:stop], s.values[start:stop])
                    pushed += stop - start
                    cursor[name] = stop
            for end_tick in engine.due_windows():
                snap, events = engine.evaluate(end_tick)
                writer.add(snap, events)
                last = snap
            bar.update(pushed, len(writer.events))
    except KeyboardInterrupt:
        interrupted = True
    finally:
        bar.close()
        writer.close()
    wall_s = time.perf_counter() - wall0
    if last is not None and not interrupted:
        _write_tables(engine, last, writer.events, Path(outdir) / "tables.json")
    stream_s = min(t_end, t0 + n_chunks * hop_s) - t0 if not interrupted else (pushed / max(total, 1)) * (t_end - t0)
    result = ReplayResult(Path(outdir), writer.hops, writer.rows, len(writer.events), pushed, stream_s, wall_s,
                          interrupted)  # fmt: skip
    info = {
        "streamcorr": __version__,
        "log": rec.path,
        "log_kind": rec.kind,
        "channels": engine.channels,
        "rate_hz": ec.rate_hz,
        "window_len": ec.window_len,
        "hop_samples": ec.hop_samples,
        "hop_s": hop_s,
        "screening": ec.screening,
        "t_start": t0,
        "t_end": t_end,
        "hops": result.hops,
        "timeline_rows": result.rows,
        "events": result.events,
        "samples": {"in_log": total, "pushed": pushed, "refused": engine.sample_drops()},
        "wall_s": round(wall_s, 3),
        "x_real_time": round(result.speed, 2),
        "interrupted": interrupted,
        "calibration": {
            "window_len": engine.calibration.window_len,
            "significance": ec.significance,
            "false_alarm_rate_per_evaluation": engine.detector.alpha,
            "false_alarms_per_hour": ec.false_alarms_per_hour if ec.false_alarm_rate is None else None,
        },
        "machine": {"python": sys.version.split()[0], "platform": platform.platform()},
        **(meta or {}),
    }
    (Path(outdir) / "replay.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    return result


TABLE_PAIRS = 8  # lookup tables kept at the end of a replay: pairs with events first, then the strongest


def _write_tables(engine: Engine, snap: Snapshot, events: list[dict[str, Any]], path: Path) -> None:
    """The model's lookup table theta (G, G) on the last window for the pairs a report shows in detail."""
    names = list(snap.channels)
    chosen: list[tuple[str, str]] = []
    for ev in events:
        if (ev["a"], ev["b"]) not in chosen:
            chosen.append((ev["a"], ev["b"]))
    i, j = np.triu_indices(len(names), 1)
    mi = np.nan_to_num(snap.mi[i, j], nan=-1.0)
    for k in np.argsort(-mi, kind="stable"):
        if len(chosen) >= TABLE_PAIRS:
            break
        if (names[i[k]], names[j[k]]) not in chosen:
            chosen.append((names[i[k]], names[j[k]]))
    out = []
    for a, b in chosen[:TABLE_PAIRS]:
        table = engine.pair_table(a, b)
        if table is not None:
            m = snap.mi[names.index(a), names.index(b)]
            out.append({"a": a, "b": b, "mi": float(m), "table": np.round(table, 4).tolist()})
    path.write_text(json.dumps({"t_ns": snap.t_ns, "time": snap.t_ns / 1e9, "pairs": out}) + "\n")


class _Progress:
    """A rich progress bar on stderr: samples, samples/s, x real time, ETA; nothing when disabled."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._p: Any = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._p = Progress(
            TextColumn("replay"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("samples  {task.fields[rate]}  {task.fields[events]} events  ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._p.start()
        self._task = self._p.add_task("replay", total=total, rate="", events=0)
        self._t0 = time.perf_counter()

    def update(self, done: int, events: int) -> None:
        if self._p is None:
            return
        dt = time.perf_counter() - self._t0
        rate = f"{done / dt:,.0f} samples/s" if dt > 0 else ""
        self._p.update(self._task, completed=done, rate=rate, events=events)

    def close(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._p = None
