"""`streamcorr replay`: a recorded log through the same :class:`~streamcorr.engine.core.Engine` as a live run.

Every hop is evaluated (``skip_stale_hops`` off), as fast as the machine allows: the log is pushed one
hop of stream time at a time, channel by channel, and each window that is then due is evaluated before
the next push, so the result is the one a live daemon gives when it keeps up with the same samples (the
window waits ``max_staleness_s`` for stragglers either way). The receive clock plays no part: no sample
is refused as "future" (``max_future_s`` off) whatever its time stamp.

A gap longer than ``max_gap_s`` (default ``GAP_WINDOWS`` windows) with no sample on any channel is
skipped, not iterated: the hops whose windows end inside it are not evaluated (a live daemon jumps over a
stalled stream the same way), and the gap is listed in ``replay.json``. So a stray stamp days after the
rest costs one jump, and a replay's work is bounded by its samples.

Writes ``timeline.parquet``, ``events.parquet``, ``events.jsonl`` (see :mod:`streamcorr.publish.history`),
``tables.json`` and ``replay.json`` (what was replayed with which settings, how fast, the gaps skipped,
what the reader left out, and whether it was stopped early) into the output directory, never through a
link planted there (:mod:`streamcorr.offline.outfiles`): the history is written in a private directory inside it
and moved to its names when the replay ends. Ctrl-C stops at once: the hop in progress is dropped, every
hop before it is written.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..engine.core import Engine, EngineConfig
from ..engine.intake import GROWTH_BYTES
from ..engine.matrix import Snapshot
from ..errors import InputError
from ..estimate.estimator import Estimator
from ..publish.history import HistoryWriter
from .logs import Recording
from .outfiles import move_into, staging_dir, write_file

__all__ = ["GAP_WINDOWS", "Gap", "ReplayResult", "replay"]

GAP_WINDOWS = 4.0  # default max_gap_s, in windows
BUFFER_BYTES = GROWTH_BYTES  # ring buffers of all channels together at most, beyond the default (as live)
LISTED = 20  # gaps listed one by one in replay.json; the rest are counted
_HISTORY_FILES = ("timeline.parquet", "events.parquet", "events.jsonl")


@dataclass
class Gap:
    """Stream time with no sample on any channel, longer than max_gap_s: skipped, not evaluated."""

    from_ns: int  # the last sample before it
    to_ns: int  # the first sample after it
    hops_skipped: int


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
    gaps: list[Gap] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def speed(self) -> float:
        """x real time: stream seconds per wall second."""
        return self.stream_s / self.wall_s if self.wall_s > 0 else math.inf


class _CtrlC:
    """Ctrl-C (SIGINT) or SIGTERM (``timeout``, a service manager) as a flag the replay loop reads between hops, so
    the signal never lands inside a model call or a file write; a second one raises KeyboardInterrupt. Only in the
    main thread (where Python delivers signals); elsewhere the default KeyboardInterrupt stands."""

    def __init__(self) -> None:
        self.pressed = False
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}


def _slow_channels(rec: Recording, ec: EngineConfig, last: Snapshot | None) -> list[str]:
    """A note naming the channels sampled less often than ``max_staleness_s`` whose pairs were never estimated:
    between samples they count as stale, so those pairs stay under ``min_coverage``."""
    if last is None:
        return []
    never = np.isnan(last.mi) & ~np.eye(len(last.channels), dtype=bool)
    slow = []
    for k, name in enumerate(last.channels):
        dt = rec.series[name].interval_s if name in rec.series else 0.0
        if dt > ec.max_staleness_s and never[k].any():
            slow.append((name, dt, int(never[k].sum())))
    if not slow:
        return []
    shown = ", ".join(f"{c!r} (a sample every {dt:.3g} s; {n} pairs)" for c, dt, n in slow[:5])
    more = f" and {len(slow) - 5} more" if len(slow) > 5 else ""
    return [f"{len(slow)} channel(s) sample less often than channels.max_staleness_s ({ec.max_staleness_s:g} s), so "
            f"between samples they count as stale and their pairs, under window.min_coverage, were never estimated: "
            f"{shown}{more}; in a -c config, set channels.max_staleness_s to {1.5 * max(d for _, d, _ in slow):.2g} "
            "or more" + (f" (or, every channel being this slow, replay on a clock at their rate: --rate-hz "
                         f"{1 / max(d for _, d, _ in slow):.3g}; a time column that counts samples needs it too)"
                         if len(slow) == len(last.channels) else "")]  # fmt: skip


def replay_config(ec: EngineConfig, rec: Recording) -> EngineConfig:
    """The live settings with replay's changes: every hop, no receive clock, buffers deep enough for the
    log's densest channel (a channel sampled faster than the clock would overrun a live buffer too; at most
    BUFFER_BYTES for all channels, see buffer_len), and screening ``auto`` read as ``off``: its budget is a
    share of the hop's wall time, which a replay does not have to keep, and which would make the result
    depend on the machine's speed (``on`` stays on)."""
    screening = "off" if ec.screening == "auto" else ec.screening
    buffer_len, _ = _buffer_len(ec, rec)
    return dataclasses.replace(ec, skip_stale_hops=False, max_future_s=None, buffer_len=buffer_len, screening=screening)


def _buffer_len(ec: EngineConfig, rec: Recording) -> tuple[int | None, str | None]:
    """Ring buffer capacity for the densest channel, within BUFFER_BYTES (beyond the default); and a note
    when the cap applies (a burst of samples nanoseconds apart would otherwise ask for gigabytes)."""
    capacity = ec.buffer_len or 2 * (ec.window_len + 2 * ec.hop_samples)
    density, densest = 1.0, ""
    for name, s in rec.series.items():
        if (dt := s.interval_s) > 0 and 1.0 / (dt * ec.rate_hz) > density:
            density, densest = 1.0 / (dt * ec.rate_hz), name
    if density <= 1.0:
        return ec.buffer_len, None
    cap = max(capacity, BUFFER_BYTES // (16 * max(1, len(rec.series))))
    wanted = math.ceil(capacity * density)
    if wanted <= cap:
        return wanted, None
    note = (f"channel {densest!r} is sampled {density:,.0f}x faster than the clock: buffers are capped at {cap:,} "
            "samples a channel, so samples of a window that do not fit are overwritten (counted)")  # fmt: skip
    return cap, note


def replay(
    rec: Recording,
    ec: EngineConfig,
    outdir: str | Path,
    *,
    estimator: Estimator | None = None,
    progress: bool = True,
    meta: dict[str, Any] | None = None,
    max_gap_s: float | None = None,
) -> ReplayResult:
    """Run ``rec`` through an engine built from ``ec`` (see the module docstring); returns what was done.
    ``max_gap_s``: longer stretches without samples are skipped (default GAP_WINDOWS windows)."""
    _, buffer_note = _buffer_len(ec, rec)
    ec = replay_config(ec, rec)
    if max_gap_s is None:
        max_gap_s = GAP_WINDOWS * ec.window_len / ec.rate_hz
    engine = Engine(ec, estimator)
    hop_s = ec.hop_samples / ec.rate_hz
    names = list(rec.series)
    cursor = dict.fromkeys(names, 0)
    total = rec.n_samples
    t0, t_end = rec.t_start, rec.t_end
    t0_ns = min(int(s.t_ns[0]) for s in rec.series.values())
    hop_ns = ec.hop_samples * round(1e9 / ec.rate_hz)
    max_gap_ns = max(1, round(max_gap_s * 1e9))
    outdir = Path(outdir)
    try:
        staging = staging_dir(outdir)
    except OSError as exc:
        raise InputError(f"cannot write to {outdir}: {exc.strerror or exc} (-o OUTDIR)") from None
    try:
        writer = HistoryWriter(staging)
    except BaseException:
        move_into(staging, outdir, ())
        raise
    pushed = 0
    interrupted = False
    gaps: list[Gap] = []
    wall0 = time.perf_counter()
    last: Snapshot | None = None
    bar = _Progress(total, enabled=progress)
    ctrl_c = _CtrlC()
    try:
        chunk_ns, newest_ns = t0_ns, None  # chunks of one hop on the grid from the first sample
        while not ctrl_c.pressed:
            heads = [int(rec.series[n].t_ns[cursor[n]]) for n in names if cursor[n] < len(rec.series[n].t_ns)]
            if not heads:
                break
            next_ns = min(heads)
            if newest_ns is not None and next_ns - newest_ns > max_gap_ns:
                gaps.append(Gap(newest_ns, next_ns, _skip_to(engine, next_ns, hop_ns)))
            chunk_ns += max(0, (next_ns - chunk_ns) // hop_ns) * hop_ns  # empty chunks push nothing: jumped
            until_ns = chunk_ns + hop_ns  # samples before until
            for name in names:
                s, start = rec.series[name], cursor[name]
                stop = int(np.searchsorted(s.t_ns, until_ns, side="left"))
                if stop > start:
                    engine.push_ns(name, s.t_ns[start:stop], s.values[start:stop])
                    pushed += stop - start
                    cursor[name] = stop
                    last_ns = int(s.t_ns[stop - 1])
                    newest_ns = last_ns if newest_ns is None else max(newest_ns, last_ns)
            for end_tick in engine.due_windows():
                snap, events = engine.evaluate(end_tick)
                writer.add(snap, events)
                last = snap
            bar.update(pushed, len(writer.events))
            chunk_ns = until_ns
        interrupted = ctrl_c.pressed
    except KeyboardInterrupt:  # a second signal, or Ctrl-C outside the main thread's handler
        interrupted = True
    finally:
        ctrl_c.restore()
        bar.close()
        writer.close()
        try:
            move_into(staging, outdir, _HISTORY_FILES)
        except OSError as exc:
            raise InputError(f"cannot write to {outdir}: {exc.strerror or exc} (-o OUTDIR)") from None
    wall_s = time.perf_counter() - wall0
    if last is not None and not interrupted:
        _write_tables(engine, last, writer.events, outdir / "tables.json")
    gap_s = sum(g.to_ns - g.from_ns for g in gaps) / 1e9
    covered_s = max(0.0, t_end - t0 - gap_s)
    stream_s = covered_s if not interrupted else (pushed / max(total, 1)) * covered_s
    notes = [buffer_note] if buffer_note else []
    lone_s = (1.0 - ec.min_coverage) * ec.window_len / ec.rate_hz  # a longer gap takes its pairs under min_coverage
    lone = [g for g in rec.channel_gaps(lone_s) if not any(a.from_ns <= g[1] and g[2] <= a.to_ns for a in gaps)]
    if lone:
        shown = ", ".join(f"{c!r} {a / 1e9:.3f} .. {b / 1e9:.3f} s" for c, a, b in lone[:3])
        notes.append(f"{len(lone)} gap(s) of {lone_s:.3g} s or more in single channels, whose pairs are not estimated "
                     f"while the gap is in their window (their cells keep their value and age): {shown}"
                     + (f" and {len(lone) - 3} more (replay.json)" if len(lone) > 3 else ""))  # fmt: skip
    notes += _slow_channels(rec, ec, last)
    result = ReplayResult(outdir, writer.hops, writer.rows, len(writer.events), pushed, stream_s, wall_s,
                          interrupted, gaps, notes)  # fmt: skip
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
        "buffer_len": ec.buffer_len,
        "t_start": t0,
        "t_end": t_end,
        "hops": result.hops,
        "timeline_rows": result.rows,
        "events": result.events,
        "samples": {"in_log": total, "pushed": pushed, "refused": engine.sample_drops()},
        "gaps": {
            "max_gap_s": max_gap_s,
            "count": len(gaps),
            "skipped_s": gap_s,
            "hops_skipped": sum(g.hops_skipped for g in gaps),
            "first": [{"from": g.from_ns / 1e9, "to": g.to_ns / 1e9, "hops": g.hops_skipped} for g in gaps[:LISTED]],
        },
        "channel_gaps": {
            "min_s": lone_s,
            "count": len(lone),
            "pairs_low_coverage": engine.counters.pairs_low_coverage,
            "first": [{"channel": c, "from": a / 1e9, "to": b / 1e9} for c, a, b in lone[:LISTED]],
        },
        "log_skipped": rec.skipped,
        "log_reordered": {"samples": sum(rec.reordered.values()), "by_channel": dict(list(rec.reordered.items())[:50])},
        "notes": [*rec.notes, *notes],
        "wall_s": round(wall_s, 3),
        "x_real_time": round(result.speed, 2),
        "interrupted": interrupted,
        "calibration": {
            "window_len": engine.calibration.window_len,
            "min_coverage": ec.min_coverage,
            "significance": ec.significance,
            "false_alarm_rate_per_evaluation": engine.detector.alpha,
            "false_alarms_per_hour": ec.false_alarms_per_hour if ec.false_alarm_rate is None else None,
        },
        "machine": {"python": sys.version.split()[0], "platform": platform.platform()},
        **(meta or {}),
    }
    _write(outdir / "replay.json", json.dumps(info, indent=2, default=str) + "\n")
    return result


def _skip_to(engine: Engine, t_ns: int, hop_ns: int) -> int:
    """Move the engine's next window to the first hop ending at or after ``t_ns`` (the first sample after a
    gap); returns the hops passed over (hops_in_gaps), which a live engine passes over the same way."""
    intake = engine.intake
    if intake.next_end_tick is None or intake.next_end_tick >= t_ns:
        return 0
    behind = -(-(t_ns - intake.next_end_tick) // hop_ns)
    intake.next_end_tick += behind * hop_ns
    engine.counters.hops_in_gaps += behind
    return int(behind)


def _write(path: Path, text: str) -> None:
    try:
        write_file(path, text.encode())
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc} (-o OUTDIR)") from None


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
    _write(path, json.dumps({"t_ns": snap.t_ns, "time": snap.t_ns / 1e9, "pairs": out}) + "\n")


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
