"""Publishing sinks: what they share, and :func:`forward`, which feeds an engine's output to them.

Two sinks send the envelopes of :mod:`streamcorr.publish.envelope` out of the process:

- :class:`~streamcorr.publish.zmq_sink.ZmqPublisher`: a ZeroMQ PUB socket plus a last-value cache
  (REP socket) that late joiners ask for the newest snapshot and status;
- :class:`~streamcorr.publish.mqtt_sink.MqttPublisher`: an MQTT client that keeps its connection up,
  with a retained snapshot and a retained online/offline status backed by the client's last will.

Topics are ``{prefix}/snapshot``, ``{prefix}/event``, ``{prefix}/status`` and, when ``top_k`` or
``threshold`` is set, ``{prefix}/pairs`` (a pairs-only snapshot with the same ``seq`` as the full one).
``seq`` counts the messages a sink actually sent on a topic, so a subscriber that sees a jump has lost
messages in transit; snapshots a sink skipped on purpose (superseded while waiting) are counted in
``counters.dropped`` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..counters import flat_counters
from ..engine.changes import ChangeEvent
from ..engine.matrix import Snapshot
from ..errors import StreamcorrError
from ..logutil import RateLimitedLog

if TYPE_CHECKING:
    from ..engine.core import Engine

__all__ = [
    "Publisher",
    "Sink",
    "SinkCounters",
    "SinkGuard",
    "engine_counters",
    "forward",
    "return_free_memory",
]

log = logging.getLogger("streamcorr.publish")


class Publisher(Protocol):
    """What :func:`forward` hands messages to: a Sink, or anything else that consumes them."""

    async def publish_snapshot(self, snap: Snapshot) -> None: ...

    async def publish_event(self, ev: ChangeEvent) -> None: ...

    async def publish_status(self, state: str, counters: Mapping[str, float | int]) -> None: ...


@runtime_checkable
class Sink(Publisher, Protocol):
    """One output of the engine's results; the daemon and :func:`forward` drive every output through this.

    - ``start()`` once, before the first message: binds or starts connecting in the background; raises a
      :class:`~streamcorr.errors.StreamcorrError` for a setting that cannot work (a port in use, say);
    - ``publish_snapshot`` / ``publish_event`` / ``publish_status``: one message each; a message the output
      refuses (unencodable, say) raises a StreamcorrError after counting it, and forwarding goes on;
    - ``stop()``: publishes nothing more, says goodbye where the transport has a status ("offline") and
      releases sockets and tasks, within a few seconds whatever the network does;
    - ``counters``: what it sent and dropped per stream, connection events, and ``extra`` ledger entries;
    - ``problem()``: why it cannot publish now (not connected, its loop ended), None when it can;
    - ``queue_depth``: messages waiting in its bounded queues now.
    """

    @property
    def counters(self) -> SinkCounters: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def problem(self) -> str | None: ...

    @property
    def queue_depth(self) -> int: ...


def _per_stream() -> dict[str, int]:
    return dict.fromkeys(("snapshot", "pairs", "event", "status"), 0)


@dataclass
class SinkCounters:
    """What a sink sent and dropped, per stream (``snapshot``, ``pairs``, ``event``, ``status``)."""

    sent: dict[str, int] = field(default_factory=_per_stream)
    dropped: dict[str, int] = field(default_factory=_per_stream)  # superseded, queue full, closed, unencodable
    connects: int = 0  # MQTT: connections made
    disconnects: int = 0  # MQTT: connections ended (connects - disconnects is 1 while connected)
    connect_failures: int = 0  # MQTT: attempts that did not connect
    latest_requests: int = 0  # ZeroMQ: late-joiner requests answered
    publish_lag_s: float = math.nan  # wall clock at send minus the last sent snapshot's wall_ns
    extra: dict[str, float] = field(default_factory=dict)  # an output's own ledger (record: files, bytes deleted)

    def as_dict(self) -> dict[str, int | float]:
        """Flat ``name: number`` form, for status messages (``sent.snapshot``, ``dropped.event``, ...): the
        daemon's key style (streamcorr.counters)."""
        return flat_counters(self)


TRIM_INTERVAL_S = 5.0  # return_free_memory() does its work at most this often
_last_trim = -math.inf


@functools.cache
def _glibc(name: str) -> Callable[..., int] | None:
    """glibc's function ``name`` in this process, None where there is none (musl, macOS)."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (AttributeError, OSError):
        return None


M_ARENA_MAX = -8  # glibc's mallopt() parameter number
HEAP_ARENAS = 2


def cap_heap_arenas(arenas: int = HEAP_ARENAS) -> bool:
    """Let at most ``arenas`` glibc malloc arenas serve all threads (glibc's default: up to 8 per core).

    glibc gives a thread that allocates under contention an arena of its own, and each arena keeps its own
    fragmented free space, which ``malloc_trim`` cannot return: a daemon whose helper threads come and go
    (reconnects, file writes, the hop's executor) grows its RSS with every new arena. Called once by
    ``streamcorr run`` for its own process, never by the library. Returns False where there is no glibc."""
    mallopt = _glibc("mallopt")
    return mallopt is not None and bool(mallopt(M_ARENA_MAX, arenas))


def return_free_memory() -> bool:
    """Give the C heap's free pages back to the OS (glibc's ``malloc_trim``); at most every ``TRIM_INTERVAL_S``.

    An output calls it when a slow client leaves: the client's queue is freed at once, but glibc keeps freed
    pages of its heap (counted in RSS) until asked, so without it the process would stay at its peak. Returns
    True when it trimmed (False: too soon, or no glibc)."""
    global _last_trim
    trim = _glibc("malloc_trim")
    now = time.monotonic()
    if trim is None or now - _last_trim < TRIM_INTERVAL_S:
        return False
    _last_trim = now
    trim(0)
    return True


def engine_counters(engine: Engine) -> dict[str, int | float]:
    """The engine's numeric counters, flat (``stage_s`` entries as ``stage_s.<stage>``), for status messages."""
    return flat_counters(engine.counters)


async def forward(
    engine: Engine,
    *sinks: Publisher,
    status_interval_s: float | None = 5.0,
    status: Callable[[], Mapping[str, float | int]] | None = None,
) -> None:
    """Publish every snapshot and event of ``engine`` to each sink, and an "online" status every
    ``status_interval_s`` (``status()``, by default the engine's counters), until cancelled. A sink that raises
    on one message (say, a snapshot it cannot encode) is logged and skipped for that message; forwarding goes on."""
    warn = RateLimitedLog(log)
    status = status or (lambda: engine_counters(engine))

    async def publish(kind: str, item: Any) -> None:
        for sink in sinks:
            try:
                if kind == "snapshot":
                    await sink.publish_snapshot(item)
                elif kind == "event":
                    await sink.publish_event(item)
                else:
                    await sink.publish_status("online", item)
            except StreamcorrError as exc:
                warn.warning(f"{kind}:{id(sink)}", "%s refused a %s: %s", type(sink).__name__, kind, exc)
            except Exception:  # a bug in one sink must not stop the others
                warn(logging.ERROR, f"bug:{kind}:{id(sink)}", "%s failed on a %s", type(sink).__name__, kind,
                     exc_info=True)  # fmt: skip

    async def snapshots() -> None:
        async for snap in engine.snapshots():
            await publish("snapshot", snap)

    async def events() -> None:
        async for ev in engine.events():
            await publish("event", ev)

    async def statuses() -> None:
        assert status_interval_s is not None
        while True:
            await asyncio.sleep(status_interval_s)
            await publish("status", status())

    tasks = [asyncio.create_task(snapshots()), asyncio.create_task(events())]
    if status_interval_s is not None:
        tasks.append(asyncio.create_task(statuses()))
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


class SinkGuard:
    """Wraps one output for `forward`: counts what it raised per stream, so a failing output is visible in
    /metrics, the status counters and /healthz, and re-raises for `forward` to log (rate-limited)."""

    def __init__(self, name: str, sink: Sink) -> None:
        self.name, self.sink = name, sink
        self.errors: dict[str, int] = {"snapshot": 0, "event": 0, "status": 0}
        self.last_snapshot_failed = False
        self.last_snapshot: Snapshot | None = None  # the newest handed to the output (its goodbye skips it)

    def unsent(self, snap: Snapshot | None) -> Snapshot | None:
        """snap, unless it is the newest snapshot already handed to this output (a goodbye sends no duplicate)."""
        return None if snap is self.last_snapshot else snap

    async def publish_snapshot(self, snap: Snapshot) -> None:
        self.last_snapshot = snap
        try:
            await self.sink.publish_snapshot(snap)
        except Exception:
            self.errors["snapshot"] += 1
            self.last_snapshot_failed = True
            raise
        self.last_snapshot_failed = False

    async def publish_event(self, ev: ChangeEvent) -> None:
        try:
            await self.sink.publish_event(ev)
        except Exception:
            self.errors["event"] += 1
            raise

    async def publish_status(self, state: str, counters: Mapping[str, float | int]) -> None:
        try:
            await self.sink.publish_status(state, counters)
        except Exception:
            self.errors["status"] += 1
            raise
