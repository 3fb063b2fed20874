"""The MQTT sink: one connection kept up for as long as the publisher runs, fed from a bounded outbox.

Retained ``{prefix}/status`` says whether the publisher is up: "online" on every connect, "offline" on
:meth:`MqttPublisher.stop` and, through the client's last will, when the connection dies without a
goodbye (crash, kill, network loss). Snapshots (and pair lists) are retained too, so a subscriber that
arrives late gets the newest at once; events are not.

Status ``seq`` numbers increase across everything one publisher sends, the last will included: the
will is fixed at connect time, so each connection reserves a block of ``STATUS_SEQ_BLOCK`` numbers
and the will (or the goodbye of :meth:`stop`) takes the block's last one; the next connection
continues above it. Status seq therefore jumps between connections (not a loss), and only a real
restart of the publisher makes it go back.

Outbox policy (``publish_*`` never wait for the network): one pending snapshot, the newest (a
superseded one is counted in ``counters.dropped["snapshot"]``); up to ``queue_size`` events, the oldest
dropped when full; one pending status, the newest. While the broker is away the outbox waits and the
connection (:func:`streamcorr.transport.mqtt.keep_connected`) is retried after jittered, growing delays with a
fresh client per attempt, until :meth:`MqttPublisher.stop`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Mapping

import aiomqtt

from ..config import MqttConnection
from ..engine.changes import ChangeEvent
from ..engine.matrix import Snapshot
from ..errors import ConfigError, StreamcorrError
from ..logutil import RateLimitedLog
from ..transport.mqtt import check_settings, check_tls, keep_connected, make_client
from .envelope import (
    check_event,
    check_pair_selection,
    check_prefix,
    check_snapshot,
    encode_event,
    encode_snapshot,
    encode_status,
    topic,
)
from .sinks import SinkCounters

__all__ = ["MqttPublisher"]

log = logging.getLogger("streamcorr.publish.mqtt")

STATUS_SEQ_BLOCK = 1 << 32  # status seqs reserved per connection; its last will takes the block's last one


class MqttPublisher:
    """Publish snapshots, events and status to an MQTT broker, reconnecting for as long as it runs (a Sink).

    ``await pub.start()`` starts the connection in a task of its own and returns at once; ``await pub.stop()``
    sends what is queued and "offline", then disconnects. ``async with MqttPublisher(...) as pub:`` does both.
    ``settings`` is the connection: an ``MqttConnection``, or an output's config section built on it.

    >>> pub = MqttPublisher(settings=MqttConnection(port=1), prefix="plant/line1", queue_size=2)
    >>> pub.topics["status"], pub.connected, pub.problem()
    ('plant/line1/status', False, 'not started')
    """

    def __init__(
        self,
        *,
        settings: MqttConnection,
        prefix: str = "streamcorr",
        retain_snapshot: bool = True,
        queue_size: int = 256,
        top_k: int | None = None,
        threshold: float | None = None,
    ) -> None:
        self.settings = check_settings(settings)
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
            raise ConfigError(f"queue_size must be a positive number of events; got {queue_size!r}")
        check_pair_selection(top_k, threshold)
        self.prefix = check_prefix(prefix)
        self.retain_snapshot = retain_snapshot
        self.queue_size = queue_size
        self.top_k, self.threshold = top_k, threshold
        self.topics = {s: topic(prefix, s) for s in ("snapshot", "pairs", "event", "status")}
        self.counters = SinkCounters()
        self._seq = dict.fromkeys(("snapshot", "event", "status"), 0)  # pairs share the snapshot's seq
        self._snapshot: Snapshot | None = None
        self._events: collections.deque[ChangeEvent] = collections.deque()
        self._status: tuple[str, dict[str, int | float]] | None = None
        self._last_t_ns: int | None = None
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._connected = asyncio.Event()
        self._run_task: asyncio.Task[None] | None = None
        self._statuses = (0, 0)  # the connection being made: its "online" and its "offline" status seq
        self._warn = RateLimitedLog(log)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def queue_depth(self) -> int:
        """Messages waiting in the outbox."""
        return len(self._events) + (self._snapshot is not None) + (self._status is not None)

    def problem(self) -> str | None:
        """Why it cannot publish now, or None while connected."""
        task = self._run_task
        if task is None:
            return "not started"
        if self._closing.is_set():
            return "stopped"
        if task.done():
            exc = None if task.cancelled() else task.exception()
            return "its connection loop stopped" + (f": {exc}" if exc else "")
        if not self.connected:
            return "not connected"  # the caller names the output; its log lines name the broker
        return None

    async def wait_connected(self, timeout_s: float | None = None) -> bool:
        """True once connected (and "online" sent); False after timeout_s without a connection."""
        try:
            await asyncio.wait_for(self._connected.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    # -- the outbox ---------------------------------------------------------------------------------
    def _refuse(self, stream: str) -> bool:
        if self._closing.is_set():
            self.counters.dropped[stream] += 1
            self._warn.warning("closed", "MqttPublisher is closed; %s dropped", stream)
            return True
        return False

    async def publish_snapshot(self, snap: Snapshot) -> None:
        """Queue a snapshot, replacing (and counting as dropped) one not yet sent. Raises InputError if it
        cannot be encoded (counted in ``counters.dropped`` and logged, too)."""
        try:
            check_snapshot(snap)
        except StreamcorrError as exc:
            self.counters.dropped["snapshot"] += 1
            self._warn.warning("encode", "snapshot not encodable, dropped: %s", exc)
            raise
        if self._refuse("snapshot"):
            return
        if self._snapshot is not None:
            self.counters.dropped["snapshot"] += 1
        self._snapshot = snap
        self._wake.set()

    async def publish_event(self, ev: ChangeEvent) -> None:
        """Queue an event; when ``queue_size`` are waiting the oldest is dropped and counted."""
        check_event(ev)
        if self._refuse("event"):
            return
        if len(self._events) >= self.queue_size:
            self._events.popleft()
            self.counters.dropped["event"] += 1
            self._warn.warning("event-full", "MQTT event queue full (%d): oldest dropped", self.queue_size)
        self._events.append(ev)
        self._wake.set()

    async def publish_status(self, state: str, counters: Mapping[str, float | int]) -> None:
        """Queue a retained status, replacing one not yet sent."""
        encode_status(state, counters, seq=0)  # validates now, so that the caller gets the error
        if self._refuse("status"):
            return
        if self._status is not None:
            self.counters.dropped["status"] += 1
        self._status = (state, dict(counters))
        self._wake.set()

    async def _send_next(self, client: aiomqtt.Client) -> bool:
        """Send the next outbox message; False when the outbox is empty. Network errors propagate, with the
        message put back in the outbox (unless something newer took its place)."""
        qos = self.settings.qos
        if self._status is not None:
            state, counters = self._status
            self._status = None
            try:
                payload = encode_status(state, counters, seq=self._seq["status"] + 1, t_ns=self._last_t_ns)
            except Exception as exc:  # an unencodable message is dropped and counted, never the end of the sink
                self._unencodable("status", exc)
                return True
            try:
                await client.publish(self.topics["status"], payload, qos=qos, retain=True)
            except BaseException:
                if self._status is None:
                    self._status = (state, counters)
                raise
            self._sent("status")
            return True
        if self._events:
            ev = self._events.popleft()
            try:
                event = encode_event(ev, seq=self._seq["event"] + 1)
            except Exception as exc:
                self._unencodable("event", exc)
                return True
            try:
                await client.publish(self.topics["event"], event, qos=qos)
            except BaseException:
                if len(self._events) < self.queue_size:
                    self._events.appendleft(ev)
                else:
                    self.counters.dropped["event"] += 1
                raise
            self._sent("event")
            return True
        if self._snapshot is not None:
            snap, self._snapshot = self._snapshot, None
            await self._send_snapshot(client, snap)
            return True
        return False

    async def _send_snapshot(self, client: aiomqtt.Client, snap: Snapshot) -> None:
        seq = self._seq["snapshot"] + 1
        try:
            payload = encode_snapshot(snap, seq=seq)
            pairs = None
            if self.top_k is not None or self.threshold is not None:
                pairs = encode_snapshot(snap, seq=seq, top_k=self.top_k, threshold=self.threshold, pairs_only=True)
        except Exception as exc:  # checked at enqueue; a snapshot mutated since then lands here
            self._unencodable("snapshot", exc)
            return
        try:
            await client.publish(self.topics["snapshot"], payload, qos=self.settings.qos, retain=self.retain_snapshot)
        except BaseException:
            if self._snapshot is None:
                self._snapshot = snap
            raise
        self._sent("snapshot")
        self.counters.publish_lag_s = (time.time_ns() - snap.wall_ns) / 1e9
        self._last_t_ns = snap.t_ns
        if pairs is not None:
            try:
                await client.publish(self.topics["pairs"], pairs, qos=self.settings.qos, retain=self.retain_snapshot)
            except BaseException:
                self.counters.dropped["pairs"] += 1
                raise
            self.counters.sent["pairs"] += 1

    def _unencodable(self, stream: str, exc: Exception) -> None:
        self.counters.dropped[stream] += 1
        self._warn.warning(f"encode:{stream}", "MQTT %s not encodable, dropped: %s", stream, exc)

    def _sent(self, stream: str) -> None:
        self._seq[stream] += 1
        self.counters.sent[stream] += 1

    # -- the connection ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the connection task and return at once (``wait_connected`` waits for the broker). Raises
        ConfigError for settings that cannot work (TLS files that cannot be read) and after :meth:`stop`."""
        if self._closing.is_set():
            raise ConfigError("this MqttPublisher was stopped; make a new one")
        if self._run_task is not None and not self._run_task.done():
            return
        check_tls(self.settings)
        self._run_task = asyncio.create_task(self._run(), name="streamcorr-mqtt-publisher")

    async def _run(self) -> None:
        """Hold the connection and send the outbox until stop() (or cancellation)."""
        try:
            await keep_connected(
                self.settings,
                self._session,
                counters=self.counters,
                log=log,
                name="MQTT publisher",
                new_client=self._new_client,
                retry=(Exception,),  # a bug in one message's path must not end the sink: logged, then a new connection
                wake=self._closing,  # a stop() during the wait tries to connect at once, to deliver the goodbye
            )
            log.info("MQTT publisher closed (%s:%d)", self.settings.host, self.settings.port)
        finally:
            self._connected.clear()

    def _new_client(self) -> aiomqtt.Client:
        # seq numbers for this connection's "online" and its "offline" (the will, or stop()): the offline one ends
        # a block above any status this connection sends, so a will published after later statuses still has the
        # highest seq, and subscribers see no restart
        online_seq, offline_seq = self._seq["status"] + 1, self._seq["status"] + STATUS_SEQ_BLOCK
        self._statuses = online_seq, offline_seq
        offline = encode_status("offline", {}, seq=offline_seq, t_ns=self._last_t_ns)
        will = aiomqtt.Will(self.topics["status"], offline, qos=self.settings.qos, retain=True)
        return make_client(self.settings, will=will)

    async def _session(self, client: aiomqtt.Client) -> None:
        """One connection: "online", the outbox until closing, then "offline" (a clean disconnect sends no will)."""
        online_seq, offline_seq = self._statuses
        self._seq["status"] = online_seq
        status, qos = self.topics["status"], self.settings.qos
        try:
            online = encode_status("online", self.counters.as_dict(), seq=online_seq, t_ns=self._last_t_ns)
            await client.publish(status, online, qos=qos, retain=True)
            self.counters.sent["status"] += 1
            self._connected.set()
            log.info("MQTT publisher connected to %s:%d (prefix %r)", self.settings.host, self.settings.port,
                     self.prefix)  # fmt: skip
            await self._pump(client)
            offline = encode_status("offline", self.counters.as_dict(), seq=offline_seq, t_ns=self._last_t_ns)
            await client.publish(status, offline, qos=qos, retain=True)
            self.counters.sent["status"] += 1
        finally:  # the will may be out: the next connection's statuses start above it
            self._seq["status"] = offline_seq
            self._connected.clear()

    async def _pump(self, client: aiomqtt.Client) -> None:
        """Send the outbox as it fills; return when closing and empty; raise MqttError on a lost connection."""
        watcher = asyncio.create_task(self._watch(client))
        try:
            while True:
                if await self._send_next(client):
                    continue
                if self._closing.is_set():
                    return
                self._wake.clear()  # no await since the outbox was found empty: no wake-up is lost
                waiter = asyncio.create_task(self._wake.wait())
                done, _ = await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if watcher in done:
                    watcher.result()  # raises the connection's error
                    raise aiomqtt.MqttError("connection closed")
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                await watcher

    @staticmethod
    async def _watch(client: aiomqtt.Client) -> None:
        # nothing is subscribed: the iterator only ends, with MqttError, when the connection drops
        async for _ in client.messages:
            pass

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (the final snapshot included) and a retained "offline" status, then disconnect.
        After timeout_s without a connection to do that on, stop anyway (the broker's will says "offline")."""
        self._closing.set()
        self._wake.set()
        task = self._run_task
        if task is None or task.done() or task is asyncio.current_task():
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout_s)
        except TimeoutError:
            left = self.queue_depth
            self.counters.dropped["snapshot"] += self._snapshot is not None
            self.counters.dropped["event"] += len(self._events)
            log.warning(
                "MQTT publisher closed without a goodbye after %.1f s; %d queued messages lost", timeout_s, left
            )
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> MqttPublisher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __repr__(self) -> str:
        state = "connected" if self.connected else "not connected"
        return f"MqttPublisher({self.settings.host}:{self.settings.port}, {self.prefix!r}, {state})"
