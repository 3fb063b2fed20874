"""`outputs.record`: a live run's history as Parquet files, rotated, under a disk cap.

Contract:

* snapshots go to ``timeline-<UTC start>-<n>.parquet`` (the columns of :mod:`streamcorr.publish.history`: one
  row per assessed pair, or the ``top_k`` strongest per snapshot) and events to ``events-<...>.parquet``;
  the recorder owns only files named so (``OWN_NAME``) and its own ``.part`` files: any other file in the
  directory is never counted, rotated or deleted;
* a file is written as ``<name>.<random token>.part`` (created exclusively, never through a symlink) and
  renamed when it is closed (every ``rotate_s`` seconds of wall clock, and at shutdown), so every file it
  names ``*.parquet`` is complete and readable: a crash (SIGKILL, power) loses at most the files being written,
  and leaves their ``.part`` behind (deleted at the next start);
* after each rotation its oldest closed files are deleted until they take at most ``max_bytes``; every deleted
  file and its rows are counted (``files_deleted``, ``rows_deleted``), so ``rows_written - rows_deleted`` is
  exactly what the directory holds of this run;
* a file that cannot be written (permissions, disk full, the directory gone) is dropped: its snapshots and
  events are counted in ``dropped`` (``streamcorr_output_dropped``) and its rows in ``rows_dropped`` /
  ``events_dropped``; ``problem()`` names the cause (so /healthz is 503) and one warning is logged per
  failure streak; every rotation tries again, and the first file written clears it;
* a snapshot whose stream time is not newer than the last one written (the daemon's goodbye repeats the last
  snapshot) is skipped.

>>> import tempfile, asyncio
>>> from streamcorr.engine.matrix import MatrixState
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
import errno
import logging
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..engine.changes import ChangeEvent
from ..engine.matrix import Snapshot
from ..errors import ConfigError
from ..logutil import RateLimitedLog
from .history import EVENT_COLUMNS, TIMELINE_COLUMNS, _pa, event_row, event_schema, snapshot_rows, timeline_schema
from .sinks import SinkCounters

__all__ = ["OWN_NAME", "ParquetRecorder", "RecorderCounters", "probe_writable"]

log = logging.getLogger("streamcorr.publish.record")

OWN_NAME = re.compile(r"^(timeline|events)-(\d{8}T\d{6}Z)-(\d{6,})\.parquet$")  # the files the recorder owns
_OWN_PART = re.compile(r"^(?:timeline|events)-\d{8}T\d{6}Z-\d{6,}\.parquet\.[0-9a-f]{16}\.part$")
# exclusive create: fails on any existing name, a symlink (even dangling) included; O_NOFOLLOW says it twice
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _create_exclusive(directory: Path, stem: str) -> tuple[Path, int]:
    """A new file ``<stem>.<16 hex>.part`` in ``directory`` and its descriptor; a name taken is never reused."""
    for _ in range(3):
        path = directory / f"{stem}.{secrets.token_hex(8)}.part"
        try:
            return path, os.open(path, _CREATE, 0o644)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free .part name in {directory}")


def _why(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) and exc.strerror else None) or f"{type(exc).__name__}: {exc}"


def probe_writable(directory: str | Path) -> str | None:
    """None if the recorder can write in ``directory`` (or create it), else why not; creates nothing that stays.

    >>> probe_writable("/proc/version/rec")
    '/proc/version is not a directory'
    """
    d = Path(directory)
    if not d.exists():
        parent = next(p for p in d.parents if p.exists())
        if not parent.is_dir():
            return f"{parent} is not a directory"
        if not os.access(parent, os.W_OK | os.X_OK):
            return f"cannot create it: {parent} is not writable"
        return None
    if not d.is_dir():
        return f"{d} is not a directory"
    try:
        path, fd = _create_exclusive(d, ".streamcorr-probe")
        os.close(fd)
        path.unlink()
    except OSError as exc:
        return _why(exc)
    return None


@dataclass
class RecorderCounters(SinkCounters):
    """SinkCounters (``sent``: snapshots and events in files written; ``dropped``: in files that failed) and
    the files' ledger."""

    rows_written: int = 0  # timeline rows in closed files
    events_written: int = 0
    files_closed: int = 0
    files_deleted: int = 0  # by the disk cap, oldest first
    rows_deleted: int = 0  # timeline rows in those files
    events_deleted: int = 0
    bytes_on_disk: int = 0  # the recorder's closed files in the directory
    write_errors: int = 0  # files that could not be written
    rows_dropped: int = 0  # timeline rows in those files
    events_dropped: int = 0


class _Batch(NamedTuple):
    """What one rotation writes: the buffered rows, handed over in the event loop's thread."""

    timeline: list[dict[str, np.ndarray]]
    events: list[dict[str, Any]]
    stamp: str
    seq: int


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
            names = sorted(p.name for p in self.dir.iterdir())
        except OSError as exc:
            raise ConfigError(f"outputs.record.directory: cannot create {self.dir}: {exc.strerror or exc}") from None
        self.rotate_s, self.max_bytes, self.top_k = rotate_s, max_bytes, top_k
        self.counters = RecorderCounters()
        self._rows: dict[Path, int] = {}  # own closed file -> rows (timeline) or events, for the ledger
        for name in names:
            path = self.dir / name
            if _OWN_PART.match(name):  # a crash's unfinished file: never readable
                with contextlib.suppress(OSError):
                    path.unlink()
            elif OWN_NAME.match(name) and _regular(path):
                self._rows[path] = -1  # from an earlier run: under the cap, not in this run's ledger
        self._timeline: list[dict[str, np.ndarray]] = []
        self._events: list[dict[str, Any]] = []
        self._opened = time.time()
        self._seq = 0
        self._last_t_ns: int | None = None
        self._closed = False
        self._running = False  # start() rotates on time in a worker thread
        self._task: asyncio.Task[None] | None = None
        self._writing = threading.Lock()  # a rotation still in its thread when stop() writes the last files
        self._failing: str | None = None  # why the last write failed; None once one succeeds
        self._rate_log = RateLimitedLog(log, interval_s=60.0)

    # -- the sink interface ---------------------------------------------------------------------------
    async def publish_snapshot(self, snap: Snapshot) -> None:
        if self._closed or (self._last_t_ns is not None and snap.t_ns <= self._last_t_ns):
            return
        self._last_t_ns = snap.t_ns
        self._timeline.append(snapshot_rows(snap, self.top_k))
        self._maybe_rotate()

    async def publish_event(self, ev: ChangeEvent) -> None:
        if not self._closed:
            self._events.append(event_row(ev))
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
                    batch = self._take()
                    try:
                        await asyncio.to_thread(self._write_files, batch)
                    except Exception:  # write failures are counted inside; this is a bug, and rotating goes on
                        self._rate_log(logging.ERROR, "rotate", "outputs.record: a rotation failed", exc_info=True)
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
            await asyncio.to_thread(self.rotate)

    def problem(self) -> str | None:
        if self._task is not None and self._task.done() and not self._closed:
            return "its rotation loop stopped"
        if (why := self._failing) is not None:
            return f"cannot write to {self.dir}: {why} (retried at every rotation; meanwhile dropped and counted)"
        return None

    @property
    def queue_depth(self) -> int:
        return len(self._timeline) + len(self._events)  # snapshots and events buffered for the open files

    # -- files ----------------------------------------------------------------------------------------
    def _maybe_rotate(self) -> None:
        if not self._running and time.time() - self._opened >= self.rotate_s:
            self.rotate()

    def rotate(self) -> None:
        """Write what is buffered to new files, close them, then apply the disk cap."""
        self._write_files(self._take())

    def _take(self) -> _Batch:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._opened))
        self._seq += 1
        self._opened = time.time()
        timeline, self._timeline = self._timeline, []
        events, self._events = self._events, []
        return _Batch(timeline, events, stamp, self._seq)

    def _write_files(self, batch: _Batch) -> None:
        with self._writing:
            c, pa = self.counters, _pa()
            why: str | None = None
            rows = sum(len(t["t_ns"]) for t in batch.timeline)
            if rows:  # snapshots before any pair was assessed have no rows
                cols = {col: np.concatenate([t[col] for t in batch.timeline]) for col in TIMELINE_COLUMNS}
                table = pa.table(cols, schema=timeline_schema())
                why = self._write(table, f"timeline-{batch.stamp}-{batch.seq:06d}.parquet", rows)
                _count(c, "snapshot", len(batch.timeline), rows, "rows", written=why is None)
            else:
                c.sent["snapshot"] += len(batch.timeline)
            if batch.events:
                table = pa.table({col: [e[col] for e in batch.events] for col in EVENT_COLUMNS},
                                 schema=event_schema())  # fmt: skip
                failed = self._write(table, f"events-{batch.stamp}-{batch.seq:06d}.parquet", len(batch.events))
                _count(c, "event", len(batch.events), len(batch.events), "events", written=failed is None)
                why = why or failed
            elif not rows and self._failing is not None:  # nothing to write: is the directory usable again?
                try:
                    self._make_dir()
                    why = probe_writable(self.dir)
                except OSError as exc:
                    why = _why(exc)
            self._note(why)
            self._cap()

    def _write(self, table: Any, name: str, rows: int) -> str | None:
        """Write one file under its final name; None, or why it could not be written (nothing left behind)."""
        part: Path | None = None
        try:
            self._make_dir()
            part, fd = _create_exclusive(self.dir, name)
            with os.fdopen(fd, "wb") as f:
                _pa().parquet.write_table(table, f)
                f.flush()
                os.fsync(f.fileno())  # the rename below must never expose a file still in the page cache only
            os.replace(part, self.dir / name)  # atomic: a reader sees the whole file or none; replaces a link
        except Exception as exc:  # whatever the cause, this file is lost: counted, never raised into the loop
            self.counters.write_errors += 1
            if part is not None:
                with contextlib.suppress(OSError):
                    part.unlink()
            return _why(exc)
        self._rows[self.dir / name] = rows
        self.counters.files_closed += 1
        return None

    def _make_dir(self) -> None:
        """The directory, made again if deleted under a running recorder."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # a file in its place: say that, not "File exists"
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(self.dir)) from None

    def _note(self, why: str | None) -> None:
        """One warning per failure streak (no traceback: the cause is the filesystem), one line when it ends."""
        if why is None and self._failing is not None:
            c = self.counters
            log.info("outputs.record: writing to %s again (%d snapshots, %d events dropped so far)",
                     self.dir, c.dropped["snapshot"], c.dropped["event"])  # fmt: skip
        elif why is not None and self._failing is None:
            log.warning("outputs.record: cannot write to %s: %s; the files are dropped (counted) and every "
                        "rotation (%g s) tries again", self.dir, why, self.rotate_s)  # fmt: skip
        self._failing = why

    def _cap(self) -> None:
        """Delete the oldest own files beyond max_bytes; a file no longer a regular file of ours is forgotten."""
        sizes: dict[Path, int] = {}
        for p in list(self._rows):
            try:
                st = p.lstat()
            except (FileNotFoundError, NotADirectoryError):
                del self._rows[p]  # removed by someone else: nothing of ours to count or delete
                continue
            except OSError:
                continue  # unreadable now (the directory's permissions): try at the next rotation
            if not stat.S_ISREG(st.st_mode):
                del self._rows[p]  # replaced by a link or a directory: not ours
                continue
            sizes[p] = st.st_size
        total = sum(sizes.values())
        for p in sorted(sizes, key=_age):
            if total <= self.max_bytes:
                break
            try:
                p.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                self._rate_log(logging.WARNING, "cap", "outputs.record: cannot delete %s: %s", p, _why(exc))
                continue
            rows = self._rows.pop(p)
            total -= sizes[p]
            self.counters.files_deleted += 1
            if rows >= 0:
                if p.name.startswith("timeline-"):
                    self.counters.rows_deleted += rows
                else:
                    self.counters.events_deleted += rows
        self.counters.bytes_on_disk = total


def _age(p: Path) -> tuple[str, int, str]:
    """Sort key of an own file: start stamp, sequence, kind (oldest first)."""
    m = OWN_NAME.match(p.name)
    assert m is not None, p  # only own names enter the ledger
    return m[2], int(m[3]), m[1]


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def _count(c: RecorderCounters, stream: str, messages: int, rows: int, unit: str, *, written: bool) -> None:
    """A file's outcome in the ledger: its messages sent or dropped, its rows written or dropped."""
    if written:
        c.sent[stream] += messages
        setattr(c, f"{unit}_written", getattr(c, f"{unit}_written") + rows)
    else:
        c.dropped[stream] += messages
        setattr(c, f"{unit}_dropped", getattr(c, f"{unit}_dropped") + rows)
