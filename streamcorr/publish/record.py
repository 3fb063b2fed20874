"""`outputs.record`: a live run's history as Parquet files, rotated, under a disk cap.

Contract:

* snapshots go to ``timeline-<UTC start>-<n>.parquet`` (the columns of :mod:`streamcorr.publish.history`: one
  row per assessed pair, or the ``top_k`` strongest per snapshot) and events to ``events-<...>.parquet``;
* a file is written as ``<name>.parquet.part`` and renamed when it is closed (every ``rotate_s`` seconds of
  wall clock, and at shutdown), so every ``*.parquet`` file is complete and readable: a crash (SIGKILL, power)
  loses at most the files being written, and leaves their ``.part`` behind (deleted at the next start);
* after each rotation the oldest closed files are deleted until the directory's ``*.parquet`` files take at
  most ``max_bytes``; every deleted file and its rows are counted (``files_deleted``, ``rows_deleted``), so
  ``rows_written - rows_deleted`` is exactly what the directory holds;
* a snapshot whose stream time is not newer than the last one written (the daemon's goodbye repeats the last
  snapshot) is skipped.

>>> import tempfile, asyncio
>>> from streamcorr.matrix import MatrixState
>>> st = MatrixState(["x", "y"]); st.update(np.array([0]), np.array([1]), np.array([0.5]), np.array([1.0]), 10**9)
>>> with tempfile.TemporaryDirectory() as d:
...     rec = ParquetRecorder(directory=d)
...     asyncio.run(rec.publish_snapshot(st.snapshot(10**9, 0)))
...     asyncio.run(rec.stop())
...     sorted(p.name.split("-")[0] for p in Path(d).glob("*.parquet")), rec.counters.rows_written
(['timeline'], 1)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..changes import ChangeEvent
from ..errors import ConfigError
from ..matrix import Snapshot
from .history import EVENT_COLUMNS, TIMELINE_COLUMNS, _pa, event_row, event_schema, snapshot_rows, timeline_schema
from .sinks import SinkCounters

__all__ = ["ParquetRecorder", "RecorderCounters"]


@dataclass
class RecorderCounters(SinkCounters):
    """SinkCounters (``sent``: snapshots and events recorded) and the files' ledger."""

    rows_written: int = 0  # timeline rows in closed files
    events_written: int = 0
    files_closed: int = 0
    files_deleted: int = 0  # by the disk cap, oldest first
    rows_deleted: int = 0  # timeline rows in those files
    events_deleted: int = 0
    bytes_on_disk: int = 0  # closed *.parquet files in the directory
    write_errors: int = 0


class ParquetRecorder:
    """A sink (see :mod:`streamcorr.publish.sinks`) that records snapshots and events as described above."""

    def __init__(
        self, *, directory: str | Path, rotate_s: float = 60.0, max_bytes: int = 1 << 30, top_k: int | None = None
    ) -> None:
        if rotate_s <= 0 or max_bytes <= 0:
            raise ConfigError(f"outputs.record: rotate_s and max_bytes must be > 0; got {rotate_s}, {max_bytes}")
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"outputs.record.directory: cannot create {self.dir}: {exc.strerror or exc}") from None
        for stale in self.dir.glob("*.parquet.part"):  # a crash's unfinished files: never readable
            stale.unlink(missing_ok=True)
        self.rotate_s, self.max_bytes, self.top_k = rotate_s, max_bytes, top_k
        self.counters = RecorderCounters()
        self._rows: dict[Path, int] = {}  # closed file -> rows (timeline) or events, for the ledger
        for p in sorted(self.dir.glob("*.parquet")):
            self._rows[p] = -1  # from an earlier run: not counted in this run's ledger
        self._timeline: list[dict[str, np.ndarray]] = []
        self._events: list[dict[str, Any]] = []
        self._opened = time.time()
        self._seq = 0
        self._last_t_ns: int | None = None
        self._closed = False
        self._running = False  # start() rotates on time in a worker thread
        self._task: asyncio.Task[None] | None = None

    # -- the sink interface ---------------------------------------------------------------------------
    async def publish_snapshot(self, snap: Snapshot) -> None:
        if self._closed or (self._last_t_ns is not None and snap.t_ns <= self._last_t_ns):
            return
        self._last_t_ns = snap.t_ns
        self._timeline.append(snapshot_rows(snap, self.top_k))
        self.counters.sent["snapshot"] += 1
        self._maybe_rotate()

    async def publish_event(self, ev: ChangeEvent) -> None:
        if not self._closed:
            self._events.append(event_row(ev))
            self.counters.sent["event"] += 1
            self._maybe_rotate()

    async def publish_status(self, state: str, counters: Mapping[str, float | int]) -> None:
        self._maybe_rotate()  # a quiet run still rotates on time

    async def start(self) -> None:
        """Rotate on time from now on, writing in a worker thread (without start, publishing rotates inline)."""
        if self._task is None and not self._closed:
            self._running = True
            self._task = asyncio.create_task(self._rotate_on_time(), name="record-rotate")

    async def _rotate_on_time(self) -> None:
        try:
            while not self._closed:
                await asyncio.sleep(min(1.0, self.rotate_s / 4))
                if not self._closed and time.time() - self._opened >= self.rotate_s:
                    taken = self._take()
                    await asyncio.to_thread(self._write_files, *taken)
        finally:
            self._running = False

    async def stop(self) -> None:
        """Write what is buffered and close the files; nothing is recorded after this."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not self._closed:
            self._closed = True
            self.rotate()

    def problem(self) -> str | None:
        if self._task is not None and self._task.done() and not self._closed:
            return "its rotation loop stopped"
        return None

    @property
    def queue_depth(self) -> int:
        return len(self._timeline) + len(self._events)  # snapshots and events buffered for the open files

    def ledger(self) -> dict[str, int]:
        """The files' counters, for /metrics (``streamcorr_record_<name>``) and the status message."""
        names = ("rows_written", "events_written", "files_closed", "files_deleted", "rows_deleted",
                 "events_deleted", "bytes_on_disk", "write_errors")  # fmt: skip
        return {n: getattr(self.counters, n) for n in names}

    # -- files ----------------------------------------------------------------------------------------
    def _maybe_rotate(self) -> None:
        if not self._running and time.time() - self._opened >= self.rotate_s:
            self.rotate()

    def rotate(self) -> None:
        """Write what is buffered to new files, close them, then apply the disk cap."""
        self._write_files(*self._take())

    def _take(self) -> tuple[list[dict[str, np.ndarray]], list[dict[str, Any]], str, int]:
        """The buffered rows, handed over (in the event loop's thread) to be written."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._opened))
        self._seq += 1
        self._opened = time.time()
        timeline, self._timeline = self._timeline, []
        events, self._events = self._events, []
        return timeline, events, stamp, self._seq

    def _write_files(self, timeline: list[dict[str, np.ndarray]], events: list[dict[str, Any]], stamp: str,
                     seq: int) -> None:  # fmt: skip
        pa = _pa()
        if sum(len(t["t_ns"]) for t in timeline):  # snapshots before any pair was assessed have no rows
            cols = {c: np.concatenate([t[c] for t in timeline]) for c in TIMELINE_COLUMNS}
            table = pa.table(cols, schema=timeline_schema())
            self._write(table, f"timeline-{stamp}-{seq:06d}.parquet", table.num_rows, "rows_written")
        if events:
            table = pa.table({c: [e[c] for e in events] for c in EVENT_COLUMNS}, schema=event_schema())
            self._write(table, f"events-{stamp}-{seq:06d}.parquet", table.num_rows, "events_written")
        self._cap()

    def _write(self, table: Any, name: str, rows: int, counter: str) -> None:
        part, final = self.dir / (name + ".part"), self.dir / name
        try:
            _pa().parquet.write_table(table, part)
            part.replace(final)  # atomic: a reader sees the whole file or none
        except OSError:
            self.counters.write_errors += 1
            part.unlink(missing_ok=True)
            raise
        self._rows[final] = rows
        setattr(self.counters, counter, getattr(self.counters, counter) + rows)
        self.counters.files_closed += 1

    def _cap(self) -> None:
        files = [p for p in self._rows if p.exists()]
        files.sort(key=lambda p: (p.name.split("-", 1)[1], p.name))  # by start stamp and sequence: oldest first
        sizes = {p: p.stat().st_size for p in files}
        total = sum(sizes.values())
        for p in files:
            if total <= self.max_bytes:
                break
            rows = self._rows.pop(p)
            p.unlink(missing_ok=True)
            total -= sizes[p]
            self.counters.files_deleted += 1
            if rows >= 0:
                if p.name.startswith("timeline-"):
                    self.counters.rows_deleted += rows
                else:
                    self.counters.events_deleted += rows
        self.counters.bytes_on_disk = total
