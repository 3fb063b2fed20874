"""A web client's outbox, bounded in bytes: what :class:`~streamcorr.publish.web.WebView` holds for one client
until its WebSocket takes it.

The newest snapshot and the newest status replace unsent ones (each replaced one counted as dropped); events
queue in order, at most ``EVENT_QUEUE_LEN``, and while the outbox holds more than ``max_bytes`` (the frame
being written included, until it is written) its oldest events are dropped, counted. Messages leave one at a
time, events first (at most ``EVENT_QUEUE_LEN`` in a row while a snapshot waits), then the snapshot, then the
status; so a slow client is always offered the newest state, never a backlog. The newest snapshot and
status are never dropped for bytes, so a client holds at most ``max(max_bytes, the frame being written + the
newest snapshot + the newest status)``. Texts are ASCII JSON, so their length is their size in bytes. Every
drop is counted per stream in ``counters.dropped`` and in the view's ledger (``counters.extra``:
``snapshots_dropped``, ``stats_dropped``, ``events_dropped``), and ``counters.extra["queued_bytes"]`` follows
the bytes held over all outboxes.

>>> from streamcorr.publish.sinks import SinkCounters
>>> counters = SinkCounters(extra=dict.fromkeys(("queued_bytes", "events_dropped", "snapshots_dropped"), 0))
>>> box = Outbox(counters, max_bytes=10)
>>> for text in ("e1..", "e2..", "e3.."):
...     box.put_event(text)
>>> box.put_latest("snapshot", "snap")  # 16 bytes > 10: the two oldest events go
>>> list(box.events), counters.extra["events_dropped"], box.nbytes
(['e3..'], 2, 8)
>>> box.take(), box.nbytes  # taken, and counted until written
(('event', 'e3..'), 8)
"""

from __future__ import annotations

import asyncio
import collections

from .sinks import SinkCounters

__all__ = ["EVENT_QUEUE_LEN", "Outbox"]

EVENT_QUEUE_LEN = 256  # per client: events are rare, so a full queue means the client is stuck
_DROP_LEDGER = {"snapshot": "snapshots_dropped", "status": "stats_dropped", "event": "events_dropped"}


class Outbox:
    """One client's outbox, bounded in bytes: latest-only slots for snapshot and status, a FIFO of events whose
    oldest go first when over ``max_bytes`` (the frame being written counts until it is written)."""

    def __init__(self, counters: SinkCounters, max_bytes: int) -> None:
        self.counters = counters
        self.max_bytes = max_bytes
        self.latest: dict[str, str] = {}  # "snapshot", "status": the newest one not sent yet
        self.events: collections.deque[str] = collections.deque()
        self.nbytes = 0  # waiting, and the frame being written
        self._events_in_a_row = 0  # taken since the last snapshot or status
        self.ready = asyncio.Event()

    def _add(self, n: int) -> None:
        self.nbytes += n
        self.counters.extra["queued_bytes"] += n

    def _drop(self, stream: str, text: str) -> None:
        self._add(-len(text))
        self.counters.dropped[stream] += 1
        self.counters.extra[_DROP_LEDGER[stream]] += 1

    def _fit(self) -> None:
        while self.nbytes > self.max_bytes and self.events:
            self._drop("event", self.events.popleft())

    def put_latest(self, stream: str, text: str) -> None:
        if stream in self.latest:
            self._drop(stream, self.latest[stream])
        self.latest[stream] = text
        self._add(len(text))
        self._fit()
        self.ready.set()

    def put_event(self, text: str) -> None:
        if len(self.events) >= EVENT_QUEUE_LEN:
            self._drop("event", self.events.popleft())
        self.events.append(text)
        self._add(len(text))
        self._fit()
        self.ready.set()

    def take(self) -> tuple[str, str] | None:
        """The next message to write as (stream, text), events first (they explain the snapshot that follows
        them), but no more than ``EVENT_QUEUE_LEN`` in a row while a snapshot or status waits (a flood of events
        does not starve the view); it counts in ``nbytes`` until :meth:`written`. None when nothing waits."""
        stream = next((s for s in ("snapshot", "status") if s in self.latest), None)
        if self.events and (stream is None or self._events_in_a_row < EVENT_QUEUE_LEN):
            self._events_in_a_row += 1
            return "event", self.events.popleft()
        if stream is None:
            self.ready.clear()
            return None
        self._events_in_a_row = 0
        return stream, self.latest.pop(stream)

    def written(self, text: str) -> None:
        self._add(-len(text))

    def clear(self) -> None:
        """Forget everything (the client left)."""
        self._add(-self.nbytes)
        self.events.clear()
        self.latest.clear()

    def __len__(self) -> int:
        return len(self.events) + len(self.latest)
