"""The Python client for a running streamcorr: snapshots, events and status from MQTT or ZeroMQ.

``Subscriber("mqtt://host:1883")`` subscribes to ``{prefix}/snapshot``, ``/event`` and ``/status``; the
broker hands it the retained snapshot and status at once. ``Subscriber("tcp://host:5556")`` connects a
ZeroMQ SUB socket and asks the publisher's last-value cache (``snapshot_url``, by default the next port)
for the newest snapshot and status, so a late joiner does not wait for the next hop.

Messages are decoded into numpy-backed :class:`Snapshot`, :class:`ChangeEvent` and :class:`Status` and
wait in bounded queues (``queue_size`` each; when a consumer falls behind the oldest is dropped and
counted in ``counters.dropped``, and logged once that stream is being iterated: a script that reads only
events keeps the newest snapshots without a warning). Sequence numbers are checked per topic: messages lost
on the way are counted in :attr:`Subscriber.gaps` and logged. A retained or cached message already seen is skipped.
Besides ``mi``, a snapshot carries ``snap.dependent`` (the change detector's verdict per cell: a cell with MI
but False is not significant) and ``snap.n_eff`` (effective sample sizes); both are None from publishers that
do not send them. An event's ``ev.initial`` marks a pair found dependent at its first assessment, ``ev.onset_t_ns``
is when the change is estimated to have begun (None: no estimate) and ``ev.path`` which detector saw it
(``"fast"``: the fast path, seconds after the change; ``"window"``: the window estimate). From publishers with
``lags.max_s`` set, ``snap.lag_s`` (seconds; ``lag_s[i, j] > 0``: channel j follows channel i) and ``snap.mi_lag``
hold each pair's best lag and the MI there (NaN: none significant), and a ``lag-shift`` event has ``ev.lag_s`` and
``ev.previous_lag_s``.

Each snapshot says where it comes from in ``snap.origin``: ``"live"``, ``"retained"`` (the broker's or the
cache's copy, made ``snap.wall_age_s`` ago) or ``"offline"`` (the publisher's newest status says "offline":
a daemon that is gone). The status topic is subscribed first, so its retained copy is known before the
retained snapshot it qualifies.

Two ways to consume, one per subscriber:

- asyncio: ``async with Subscriber(url) as sub:`` then ``async for snap in sub.snapshots():``;
- plain scripts: ``with Subscriber(url) as sub:`` then ``for snap in sub.iter_snapshots(timeout_s=10):``
  (the client runs on an event loop in a background thread).

Either iterator ends at ``close()``; ``timeout_s`` raises :class:`~streamcorr.errors.SubscriberTimeout` when
that long passes without a message, ``quiet_s`` ends quietly instead (see :meth:`Subscriber.iter_snapshots`).
When the publisher goes offline while one waits (its live status says "offline": a clean stop or the broker's
last will), a snapshot or event iterator with ``timeout_s`` raises :class:`~streamcorr.errors.PublisherOffline`
at once (after the messages sent before it), one with ``quiet_s`` ends, and one with neither waits for the
publisher to come back.

The network side, one function per transport, is in :mod:`streamcorr.publish.subscriber_receive`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Collection, Iterator
from typing import Any, Literal

import zmq.asyncio

from ..config import MqttConnection
from ..engine.changes import ChangeEvent
from ..engine.matrix import Snapshot
from ..errors import ConfigError, PublisherOffline, StreamcorrError, SubscriberTimeout
from ..logutil import RateLimitedLog
from .envelope import EnvelopeError, Status, check_prefix, decode_message, topic
from .subscriber_receive import SubscriberCounters, check_streams, check_wait, parse_url, receive_mqtt, receive_zmq

__all__ = ["Subscriber", "SubscriberCounters"]

log = logging.getLogger("streamcorr.subscriber")

_CLOSED = object()  # queue sentinel: the subscriber was closed, iterators end
_OFFLINE = object()  # queue sentinel: the publisher's live status said offline
_OUTBOX = {"snapshot": "snapshot", "pairs": "snapshot", "event": "event", "status": "status"}
_KIND = {"snapshot": "snapshot", "pairs": "snapshot", "event": "event", "status": "status"}


class Subscriber:
    """Receive a streamcorr publisher's snapshots, events and status over MQTT or ZeroMQ.

    ``url`` is ``mqtt://[user:password@]host[:port]`` (``mqtts://`` for TLS) or ``tcp://host:port`` (a
    ZeroMQ PUB endpoint). ``settings`` (an ``MqttConnection``) supplies the other MQTT options; host and port
    come from the URL (port 1883, or 8883 for mqtts, when it has none).
    ``streams`` picks the topics: any of "snapshot" or "pairs" (not both), "event", "status".

    >>> sub = Subscriber("tcp://127.0.0.1:5556", prefix="plant")
    >>> sub.transport, sub.snapshot_url, sub.topics
    ('zmq', 'tcp://127.0.0.1:5557', ('plant/snapshot', 'plant/event', 'plant/status'))
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "streamcorr",
        snapshot_url: str | None = None,
        late_join: bool = True,
        queue_size: int = 64,
        streams: Collection[str] = ("snapshot", "event", "status"),
        settings: MqttConnection | None = None,
        context: zmq.asyncio.Context | None = None,
        request_timeout_s: float = 2.0,
        start_timeout_s: float = 5.0,
    ) -> None:
        streams = check_streams(streams, queue_size)
        self.prefix = check_prefix(prefix)
        self.queue_size = queue_size
        self.late_join = late_join
        self.request_timeout_s = request_timeout_s
        self.start_timeout_s = start_timeout_s
        self.topics = tuple(topic(prefix, s) for s in streams)
        self._stream_of = {topic(prefix, s): s for s in streams}
        self._context = context
        self.url = url
        self.transport, self.settings, self.snapshot_url = parse_url(url, settings, snapshot_url)
        self.counters = SubscriberCounters()
        self._last_seq: dict[str, int] = {}
        self._status: Status | None = None
        self._mode: Literal["async", "thread"] | None = None
        self._queues: dict[str, Any] = {}
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stop = False
        self._error: Exception | None = None  # what stopped the client, if not close()
        # streams someone iterates: only their drops are logged (all are counted), and statuses are queued only then
        self._iterated: set[str] = set()
        self._ready = threading.Event()
        self._warn = RateLimitedLog(log)

    # -- state ---------------------------------------------------------------------------------------
    @property
    def gaps(self) -> dict[str, int]:
        """Missed sequence numbers per stream."""
        return self.counters.gaps

    def status(self) -> Status | None:
        """The newest status received (None before any)."""
        return self._status

    @property
    def ready(self) -> bool:
        """Subscribed (MQTT), or connected and past the late-joiner request (ZeroMQ)."""
        return self._ready.is_set()

    # -- routing -------------------------------------------------------------------------------------
    def _handle(self, topic_name: str, payload: bytes, *, replay: bool) -> None:
        """Decode one message, check its seq, and queue its body. ``replay``: retained or cached."""
        stream = self._stream_of.get(topic_name)
        if stream is None:  # ZeroMQ filters by prefix, so "x/snapshots" passes a "x/snapshot" filter
            return
        try:
            msg = decode_message(payload)
        except EnvelopeError as exc:
            self.counters.bad += 1
            self._warn.warning(f"bad:{stream}", "undecodable message on %s: %s", topic_name, exc)
            return
        if msg.kind != _KIND[stream]:
            self.counters.bad += 1
            self._warn.warning(f"kind:{stream}", "a %s message on %s, ignored", msg.kind, topic_name)
            return
        last = self._last_seq.get(stream)
        if last is not None:
            if msg.seq == last or (replay and msg.seq < last):
                self.counters.duplicates += 1
                return
            if msg.seq > last + 1 and stream != "status":  # the MQTT sink reserves status seqs for its last will
                self.counters.gaps[stream] += msg.seq - last - 1
                self._warn.warning(f"gap:{stream}", "missed %d %s message(s): seq %d -> %d",
                                   msg.seq - last - 1, stream, last, msg.seq)  # fmt: skip
            elif msg.seq < last:
                self.counters.restarts += 1
                log.info("%s seq went back from %d to %d: the publisher restarted", stream, last, msg.seq)
        self._last_seq[stream] = msg.seq
        self.counters.received[stream] += 1
        body = msg.body
        if isinstance(body, Status):
            self._status = body
            if body.state == "offline" and not replay:  # what was queued before it is still yielded first
                for key in ("snapshot", "event"):
                    self._offer(key, _OFFLINE)
            if "status" not in self._iterated:  # status() has it; nobody iterates statuses, so nothing to queue
                return
        elif isinstance(body, Snapshot):
            body = self._mark(body, replay)
        self._offer(_OUTBOX[stream], body)

    def _mark(self, snap: Snapshot, replay: bool) -> Snapshot:
        """Say in the snapshot whether it is live, a retained copy, or from a publisher now offline (the
        status topic is subscribed first, so a retained "offline" is known before the retained snapshot)."""
        if self._status is not None and self._status.state == "offline":
            self._warn.warning(
                "offline", "snapshot seq %d is from a publisher that is offline (made %.0f s ago); "
                "snap.origin == 'offline'", snap.seq, snap.wall_age_s,
            )  # fmt: skip
            return dataclasses.replace(snap, origin="offline")
        if replay:
            return dataclasses.replace(snap, origin="retained")
        return snap

    def _offer(self, key: str, item: object) -> None:
        q = self._queues[key]
        if q.full():
            with contextlib.suppress(asyncio.QueueEmpty, queue.Empty):  # the consumer may have taken it
                q.get_nowait()
                if item is not _CLOSED:
                    self.counters.dropped[key] += 1
                    if key in self._iterated:  # a stream nobody reads (events only, say) keeps its newest quietly
                        self._warn.warning(f"drop:{key}", "%s queue full (%d): oldest dropped", key, self.queue_size)
        q.put_nowait(item)

    # -- transports (run on the client's event loop) ------------------------------------------------
    async def _run_client(self) -> None:
        # status first: its retained or cached copy must arrive before the snapshot it qualifies
        order = sorted(self.topics, key=lambda name: self._stream_of[name] != "status")
        try:
            if self.transport == "zmq":
                latest = self.snapshot_url if self.late_join else None
                await receive_zmq(self.url, order, self._handle, self._ready, self.counters, context=self._context,
                                  rcvhwm=self.queue_size, latest_url=latest,
                                  request_timeout_s=self.request_timeout_s)  # fmt: skip
            else:
                assert self.settings is not None
                await receive_mqtt(self.settings, order, self._handle, self._ready, self.counters,
                                   max_queued_in=max(256, 4 * self.queue_size))  # fmt: skip
        except asyncio.CancelledError:
            raise
        except StreamcorrError as exc:  # a bad endpoint: start() raises it
            self._error = exc
            log.error("subscriber to %s stopped: %s", self.url, exc)
        except Exception as exc:  # a bug, not the network: say so, and end the iterators
            self._error = exc
            log.exception("subscriber to %s stopped", self.url)
        finally:
            self._ready.clear()
            for key in self._queues:
                self._offer(key, _CLOSED)

    # -- asyncio use ----------------------------------------------------------------------------------
    def _set_mode(self, mode: Literal["async", "thread"]) -> bool:
        """True if this call chose the mode (the caller starts the client)."""
        with self._lock:
            if self._mode == mode:
                return False
            if self._mode is not None:
                other = "`with` / iter_*()" if self._mode == "thread" else "`async with` / snapshots()"
                raise ConfigError(f"this Subscriber is already used through {other}; use a second one")
            self._mode = mode
            factory = asyncio.Queue if mode == "async" else queue.Queue
            self._queues = {key: factory(self.queue_size) for key in ("snapshot", "event", "status")}
            return True

    async def start(self) -> None:
        """Start the client on the running loop; returns when subscribed, or after ``start_timeout_s``
        (the client keeps trying in the background)."""
        if not self._set_mode("async"):
            return
        self._task = asyncio.create_task(self._run_client(), name="streamcorr-subscriber")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout_s
        while not self._ready.is_set() and not self._task.done() and loop.time() < deadline:
            await asyncio.sleep(0.005)
        if self._error is not None:
            raise self._error
        if not self._ready.is_set():
            log.warning("subscriber to %s not ready after %.1f s; still trying", self.url, self.start_timeout_s)

    async def aclose(self) -> None:
        """Stop the client; iterators end."""
        if self._mode == "thread":
            await asyncio.get_running_loop().run_in_executor(None, self.close)
            return
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def __aenter__(self) -> Subscriber:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _aiter(self, key: str, wait: tuple[float | None, bool]) -> AsyncIterator[Any]:
        if self._mode != "async":
            raise StreamcorrError("start the subscriber first: `async with Subscriber(...) as sub:`")
        self._iterated.add(key)
        q: asyncio.Queue[Any] = self._queues[key]
        while True:
            try:
                item = await asyncio.wait_for(q.get(), wait[0])
            except TimeoutError:
                self._end(key, None if wait[1] else wait[0])
                return
            if item is _CLOSED:
                q.put_nowait(_CLOSED)  # for any other iterator on this queue
                self._end(key)
                return
            if item is _OFFLINE:
                if self._offline_ends(key, wait):
                    return
                continue
            yield item

    def snapshots(self, timeout_s: float | None = None, *, quiet_s: float | None = None) -> AsyncIterator[Snapshot]:
        """Snapshots as they arrive (first the retained / cached one); how it ends: as :meth:`iter_snapshots`."""
        return self._aiter("snapshot", check_wait(timeout_s, quiet_s))

    def events(self, timeout_s: float | None = None, *, quiet_s: float | None = None) -> AsyncIterator[ChangeEvent]:
        """Change events as they arrive; how it ends: as :meth:`iter_snapshots`."""
        return self._aiter("event", check_wait(timeout_s, quiet_s))

    def statuses(self, timeout_s: float | None = None, *, quiet_s: float | None = None) -> AsyncIterator[Status]:
        """Status messages from the first call on (``status()``: the newest); ends as :meth:`iter_snapshots`."""
        return self._aiter("status", check_wait(timeout_s, quiet_s))

    def _offline_ends(self, key: str, wait: tuple[float | None, bool]) -> bool:
        """At the publisher's offline marker: True to end a quiet_s iterator; PublisherOffline for one with
        timeout_s; False (wait on) without either, or when the publisher is back online since."""
        if self._status is None or self._status.state != "offline" or wait[0] is None:
            return False
        if wait[1]:
            return True
        raise PublisherOffline(
            f"the publisher at {self.url} (prefix {self.prefix!r}) went offline: its status says so (a clean stop, "
            "or the broker's last will for a lost connection). Iterate again to wait for it to come back, or "
            "pass timeout_s=None to wait without a limit", stream=key, timeout_s=float(wait[0]),
        )  # fmt: skip

    def _end(self, key: str, timed_out_s: float | None = None) -> None:
        """An iterator's end: a return after close() or quiet_s; SubscriberTimeout after ``timed_out_s`` (its
        timeout_s); a StreamcorrError from what stopped the client otherwise."""
        if timed_out_s is not None:
            seen = sum(n for stream, n in self.counters.received.items() if _OUTBOX[stream] == key)
            why = (f"{seen} received so far" if self.ready else
                   "not subscribed yet: is the broker or publisher at this address running?")  # fmt: skip
            raise SubscriberTimeout(
                f"no {key} from {self.url} (prefix {self.prefix!r}) within timeout_s={timed_out_s:g} s; {why}. "
                "To end quietly instead, pass quiet_s=...", stream=key, timeout_s=timed_out_s,
            )  # fmt: skip
        if self._error is not None:
            raise StreamcorrError(f"the subscriber to {self.url} stopped: {self._error}") from self._error

    # -- plain-thread use -----------------------------------------------------------------------------
    def start_background(self) -> None:
        """Run the client on its own event loop in a daemon thread; returns when subscribed, or after
        ``start_timeout_s``."""
        if not self._set_mode("thread"):
            return
        self._thread = threading.Thread(target=self._thread_main, name="streamcorr-subscriber", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._ready.wait(0.01) and self._thread.is_alive() and time.monotonic() < deadline:
            pass
        if self._error is not None:
            raise self._error
        if not self._ready.is_set():
            log.warning("subscriber to %s not ready after %.1f s; still trying", self.url, self.start_timeout_s)

    def _thread_main(self) -> None:
        async def main() -> None:
            with self._lock:
                if self._stop:
                    return
                self._loop = asyncio.get_running_loop()
                self._task = asyncio.current_task()
            with contextlib.suppress(asyncio.CancelledError):
                await self._run_client()

        asyncio.run(main())

    def close(self) -> None:
        """Stop the client (and join its thread); iterators end. From asyncio code prefer ``await aclose()``."""
        with self._lock:
            self._stop = True
            loop, task = self._loop, self._task
        if task is not None and not task.done():
            if self._mode == "thread" and loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop already closed
                    loop.call_soon_threadsafe(task.cancel)
            else:
                task.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        if self._mode == "thread" and task is None:  # stopped before the client ran: end the iterators here
            for key in self._queues:
                self._offer(key, _CLOSED)

    def __enter__(self) -> Subscriber:
        self.start_background()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _iter(self, key: str, wait: tuple[float | None, bool]) -> Iterator[Any]:
        self.start_background()
        self._iterated.add(key)
        q: queue.Queue[Any] = self._queues[key]
        while True:
            try:
                item = q.get(timeout=wait[0])
            except queue.Empty:
                self._end(key, None if wait[1] else wait[0])
                return
            if item is _CLOSED:
                self._offer(key, _CLOSED)
                self._end(key)
                return
            if item is _OFFLINE:
                if self._offline_ends(key, wait):
                    return
                continue
            yield item

    def iter_snapshots(self, timeout_s: float | None = None, *, quiet_s: float | None = None) -> Iterator[Snapshot]:
        """Blocking: snapshots as they arrive. It ends (``StopIteration``) at ``close()``, and

        - with ``timeout_s``: raises :class:`~streamcorr.errors.SubscriberTimeout` (a ``TimeoutError``) once
          that many seconds pass without a snapshot: a silent publisher is an error, never an empty result;
        - with ``quiet_s`` instead: ends quietly once that many seconds pass without one (take what comes);
        - with neither: waits as long as it takes.

        The client stopping on an error raises a StreamcorrError from it. Nothing publishes here, so:

        >>> from streamcorr.errors import SubscriberTimeout
        >>> with Subscriber("tcp://127.0.0.1:5599", late_join=False) as sub:
        ...     try:
        ...         for snap in sub.iter_snapshots(timeout_s=0.2):
        ...             print(snap.seq)
        ...     except SubscriberTimeout as exc:
        ...         print(f"no {exc.stream} for {exc.timeout_s} s")
        ...     print([snap.seq for snap in sub.iter_snapshots(quiet_s=0.2)])
        no snapshot for 0.2 s
        []
        """
        return self._iter("snapshot", check_wait(timeout_s, quiet_s))

    def iter_events(self, timeout_s: float | None = None, *, quiet_s: float | None = None) -> Iterator[ChangeEvent]:
        """Blocking: change events as they arrive; how it ends: as :meth:`iter_snapshots`."""
        return self._iter("event", check_wait(timeout_s, quiet_s))

    def iter_statuses(self, timeout_s: float | None = None, *, quiet_s: float | None = None) -> Iterator[Status]:
        """Blocking: status messages from the first call on; how it ends: as :meth:`iter_snapshots`."""
        return self._iter("status", check_wait(timeout_s, quiet_s))

    def __repr__(self) -> str:
        return f"Subscriber({self.url!r}, prefix={self.prefix!r}, ready={self.ready}, gaps={self.gaps})"
