"""The ZeroMQ sink: envelopes on an XPUB socket whose queue per subscriber is bounded in bytes, and a
last-value cache that late joiners ask.

Each message is two frames, ``[topic, envelope]``; an XPUB socket speaks to SUB sockets exactly as a PUB does.
The cache is a REP socket on ``snapshot_endpoint``: any request (up to 4 KiB) is answered with the frames
``[topic, envelope, topic, envelope, ...]`` of the newest snapshot, pairs list and status, or one empty frame
before anything was published. A subscriber that misses messages sees a jump in ``seq``.

**Bytes per subscriber.** libzmq keeps one queue per subscriber, bounds it in messages (``ZMQ_SNDHWM``) and
drops silently what does not fit. The sink derives that mark from ``max_queue_bytes`` and the largest message
sent so far: ``max_queue_bytes // largest - 1`` rounded down to a power of two, at least 1 and at most
``sndhwm``. libzmq cannot change the mark of live queues safely (a queue whose reader owes acknowledgements
stops for good; a queue being set up or torn down at that moment crashes its I/O thread), so before a larger
message lowers the mark the sink binds a fresh XPUB with it on the same endpoint, and every queue has the
current mark from its start. Subscribers reconnect by themselves and lose the messages of that moment (a jump
in ``seq``; the late-joiner cache still has the newest snapshot; ``counters.extra["rebinds"]``): a few times
while the matrix first grows (the mark only halves), then never. A subscriber's queue then holds at most
``hwm`` messages plus the one its connection is writing: at most ``max(max_queue_bytes, 2 x the largest
message)`` bytes of this process's memory per subscriber (tcp and ipc; an inproc peer adds its own receive
mark). A message several subscribers hold is held once, and libzmq lets go of a subscriber's queue as soon as
it leaves. The kernel's socket buffers (a few MiB per connection on Linux) come on top, outside the process.
Not used, and why: ``ZMQ_XPUB_NODROP`` fails the send for every subscriber while one is full (one stuck
client would stop them all); ``ZMQ_CONFLATE`` keeps single-part messages only; ``ZMQ_SNDBUF`` bounds the
kernel's buffer, not libzmq's queue.

**What is counted.** libzmq does not say which subscriber missed which message. Snapshots and pair lists are
handed to libzmq without a copy, and the sink learns when libzmq lets go of each (pyzmq's ``MessageTracker``):

- ``counters.extra["queued_bytes"]``: bytes of snapshots and pair lists libzmq holds now, each message once
  (exact); ``queue_depth``: how many;
- ``counters.dropped["snapshot"]``, ``["pairs"]``: a lower bound on the messages of that stream that at least
  one subscriber missed. While a message is held, the subscriber holding it has read nothing after it and so
  takes at most ``hwm`` more; every message of the same stream beyond those is counted, once. Exact for a
  subscriber that stopped reading (each message it misses once its queue is full); several slow subscribers at
  a time count as one, and a subscriber that reads slowly may miss more than is counted. Events and status are
  small and not tracked (a subscriber sees their losses as ``seq`` gaps);
- ``counters.extra["subscriptions"]``: topics subscribed now, over all subscribers (XPUB reports each
  subscribe, and a subscriber that leaves as unsubscribes); ``["queue_limit_messages"]``: ``hwm`` now.

A message that cannot be encoded (a snapshot over the envelope limit, say) is counted in ``counters.dropped``,
logged (rate-limited) and raised as ``InputError`` to the caller; the publisher goes on with the next message.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import zmq
import zmq.asyncio

from ..config import ZmqOutput
from ..engine.changes import ChangeEvent
from ..engine.matrix import Snapshot
from ..errors import ConfigError, InputError
from ..logutil import RateLimitedLog
from ..transport.zmq import attach, check_endpoint, make_socket, make_sync_socket
from .envelope import check_pair_selection, check_prefix, encode_event, encode_snapshot, encode_status, topic
from .sinks import SinkCounters, return_free_memory

__all__ = ["ZmqPublisher"]

log = logging.getLogger("streamcorr.publish.zmq")

MAX_REQUEST_BYTES = 4096  # late-joiner requests carry nothing; bigger ones are refused by libzmq
MAX_SUBSCRIPTION_BYTES = 4096  # a topic to subscribe to; libzmq drops a subscriber that sends more
CLOSE_LINGER_MS = 200  # time the final "offline" status gets to leave at stop()
DEFAULT_QUEUE_BYTES: int = ZmqOutput.model_fields["max_queue_bytes"].default  # 8 MiB: seven 256-channel snapshots
TRACKED = ("snapshot", "pairs")  # the large messages: sent without a copy, each one's release seen
REBIND_TRIES = 100  # 10 ms apart: binding the endpoint again after a lower queue mark
HOUSEKEEPING_S = 0.5  # subscriptions read and the gauges refreshed this often while nothing is sent
MAX_NOTICES_PER_TURN = 10_000  # subscription notices read at a time (a flood must not stall the loop)


@dataclass(slots=True)
class _Held:
    stream: str
    index: int  # among the stream's tracked messages, from 1
    nbytes: int
    hwm: int  # the mark when it was sent (marks only fall)
    tracker: zmq.MessageTracker


class _Queued:
    """The tracked messages libzmq still holds, and the lower bound on those a subscriber missed (see above)."""

    def __init__(self) -> None:
        self.held: list[_Held] = []
        self.sent = dict.fromkeys(TRACKED, 0)
        self._counted = {s: collections.deque[list[int]]() for s in TRACKED}  # [first, last] indices counted
        self._n_counted = dict.fromkeys(TRACKED, 0)  # indices in _counted

    def refresh(self) -> None:
        self.held = [h for h in self.held if not h.tracker.done]

    @property
    def nbytes(self) -> int:
        return sum(h.nbytes for h in self.held)

    def add(self, stream: str, nbytes: int, hwm: int, tracker: zmq.MessageTracker) -> bool:
        """Record a message just sent; True if it raises the count of messages a subscriber certainly missed."""
        self.sent[stream] += 1
        index = self.sent[stream]
        self.refresh()
        oldest = next((h for h in self.held if h.stream == stream), None)
        self.held.append(_Held(stream, index, nbytes, hwm, tracker))
        counted = self._counted[stream]
        if oldest is None:  # no window open on this stream: nothing counted so far can matter again
            counted.clear()
            self._n_counted[stream] = 0
            return False
        while counted and counted[0][1] <= oldest.index:  # counted before the window's start
            first, last = counted.popleft()
            self._n_counted[stream] -= last - first + 1
        if counted and counted[0][0] <= oldest.index:
            self._n_counted[stream] -= oldest.index + 1 - counted[0][0]
            counted[0][0] = oldest.index + 1
        # the holder of `oldest` takes at most oldest.hwm of the messages after it: the rest are certain losses
        certain = index - oldest.index - oldest.hwm
        if certain <= self._n_counted[stream]:
            return False
        if counted and counted[-1][1] == index - 1:
            counted[-1][1] = index
        else:
            counted.append([index, index])
        self._n_counted[stream] += 1
        return True


class ZmqPublisher:
    """Publish snapshots, events and status on a ZeroMQ XPUB socket (bound to 127.0.0.1 by default); a Sink.

    ``max_queue_bytes`` bounds each subscriber's queue (see the module's docstring); ``sndhwm`` caps the
    high-water mark derived from it, in messages.

    >>> import asyncio
    >>> async def main():
    ...     async with ZmqPublisher(endpoint="tcp://127.0.0.1:*", snapshot_endpoint=None) as pub:
    ...         await pub.publish_status("online", {"hops": 3})
    ...         return pub.endpoint.startswith("tcp://127.0.0.1:"), pub.counters.sent["status"]
    >>> asyncio.run(main())  # the second status is start()'s own "online"
    (True, 2)
    """

    def __init__(
        self,
        *,
        endpoint: str = "tcp://127.0.0.1:5556",
        bind: bool = True,
        snapshot_endpoint: str | None = "tcp://127.0.0.1:5557",
        prefix: str = "streamcorr",
        max_queue_bytes: int = DEFAULT_QUEUE_BYTES,
        sndhwm: int = 1000,
        top_k: int | None = None,
        threshold: float | None = None,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        check_endpoint(endpoint)
        if snapshot_endpoint is not None:
            check_endpoint(snapshot_endpoint, "snapshot_endpoint")
        for key, value, unit in (("max_queue_bytes", max_queue_bytes, "bytes"), ("sndhwm", sndhwm, "messages")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{key} must be a positive number of {unit}; got {value!r}")
        if context is not None and not isinstance(context, zmq.asyncio.Context):
            raise ConfigError("context must be a zmq.asyncio.Context (or None for a private one)")
        check_pair_selection(top_k, threshold)
        self.endpoint = endpoint  # after start(): the endpoint actually bound (a "*" port resolved)
        self.snapshot_endpoint = snapshot_endpoint
        self.bind = bind
        self.prefix = check_prefix(prefix)
        self.max_queue_bytes = max_queue_bytes
        self.sndhwm = sndhwm
        self.top_k, self.threshold = top_k, threshold
        self.counters = SinkCounters(extra={"queued_bytes": 0, "subscriptions": 0, "queue_limit_messages": sndhwm,
                                            "rebinds": 0})  # fmt: skip
        self._context = context
        self._own_context: zmq.asyncio.Context | None = None
        self._pub: zmq.Socket[bytes] | None = None
        self._rep: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._topics = {s: topic(prefix, s).encode() for s in ("snapshot", "pairs", "event", "status")}
        self._seq = dict.fromkeys(self._topics, 0)
        self._latest: dict[str, bytes] = {}  # stream -> newest envelope, for late joiners
        self._last_t_ns: int | None = None
        self._largest = 0  # bytes of the largest message sent so far
        self._hwm = sndhwm
        self._queued = _Queued()
        self._left_at: float | None = None  # monotonic time a subscriber was last seen leaving, until trimmed
        self._stopped = False
        self._warn = RateLimitedLog(log)

    @property
    def pairs_enabled(self) -> bool:
        return self.top_k is not None or self.threshold is not None

    @property
    def queue_depth(self) -> int:
        """Snapshots and pair lists libzmq holds now, for one subscriber or several (see the module docstring)."""
        self._queued.refresh()
        return len(self._queued.held)

    @property
    def hwm(self) -> int:
        """The high-water mark per subscriber now, in messages (derived from ``max_queue_bytes``)."""
        return self._hwm

    def problem(self) -> str | None:
        """Why it cannot publish now ("not started", "stopped"), or None once bound."""
        if self._pub is not None:
            return None
        return "stopped" if self._stopped else "not started"

    async def __aenter__(self) -> ZmqPublisher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Bind (or connect) the sockets, start answering late joiners, and publish an "online" status."""
        if self._pub is not None:
            return
        ctx = self._context
        if ctx is None:
            ctx = self._own_context = zmq.asyncio.Context()
        pub = make_sync_socket(ctx, zmq.XPUB, hwm=self._hwm, max_message_bytes=MAX_SUBSCRIPTION_BYTES)
        pub.setsockopt(zmq.XPUB_VERBOSER, 1)  # every subscribe and unsubscribe, a leaving subscriber's too
        pub.copy_threshold = 0  # tracked sends never copy, however small
        rep: zmq.asyncio.Socket | None = None
        try:
            self.endpoint = attach(pub, self.endpoint, bind=self.bind, what="ZeroMQ publisher")
            if self.snapshot_endpoint is not None:
                rep = make_socket(ctx, zmq.REP, max_message_bytes=MAX_REQUEST_BYTES)
                self.snapshot_endpoint = attach(
                    rep,
                    self.snapshot_endpoint,
                    bind=True,
                    what="late-joiner cache: choose a free port with "
                    "outputs.zmq.snapshot_endpoint, or null to turn it off",
                )
        except ConfigError:
            pub.close(0)
            if rep is not None:
                rep.close(0)
            await self._term_context()
            raise
        self._pub, self._rep = pub, rep
        self._stopped = False
        self._tasks = [asyncio.create_task(self._housekeeping(), name="streamcorr-zmq-queues")]
        if rep is not None:
            self._tasks.append(asyncio.create_task(self._serve_latest(rep), name="streamcorr-zmq-latest"))
        log.info("publishing on %s (late joiners: %s)", self.endpoint, self.snapshot_endpoint)
        await self.publish_status("online", self.counters.as_dict())

    async def stop(self) -> None:
        """Publish an "offline" status (best effort), then close the sockets."""
        if self._pub is None:
            return
        await self.publish_status("offline", self.counters.as_dict())
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self._pub.close(linger=CLOSE_LINGER_MS)
        if self._rep is not None:
            self._rep.close(linger=0)
        self._pub = self._rep = None
        self._stopped = True
        await self._term_context()

    async def _term_context(self) -> None:
        if self._own_context is not None:
            # term() waits for the linger period: off the event loop
            await asyncio.get_running_loop().run_in_executor(None, self._own_context.term)
            self._own_context = None

    async def _serve_latest(self, rep: zmq.asyncio.Socket) -> None:
        while True:
            try:
                await rep.recv_multipart()
                frames: list[bytes] = []
                for stream in ("snapshot", "pairs", "status"):
                    if stream in self._latest:
                        frames += [self._topics[stream], self._latest[stream]]
                await rep.send_multipart(frames or [b""])
            except zmq.ZMQError as exc:  # a REP socket in a bad state after a vanished peer: keep serving
                self._warn.warning("latest", "late-joiner request failed: %s", exc)
                await asyncio.sleep(0.01)
                continue
            self.counters.latest_requests += 1

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(HOUSEKEEPING_S)
            self._read_subscriptions()
            self._refresh_gauges()
            # a subscriber left a turn ago: libzmq has freed its queue; glibc keeps the pages until asked
            left_at = self._left_at
            if left_at is not None and time.monotonic() - left_at >= HOUSEKEEPING_S and return_free_memory():
                self._left_at = None

    def _read_subscriptions(self) -> None:
        """Read XPUB's subscribe / unsubscribe notices; a new subscriber's queue gets the current mark."""
        assert self._pub is not None
        for _ in range(MAX_NOTICES_PER_TURN):
            try:
                notice = self._pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if notice[:1] == b"\x01":
                self.counters.extra["subscriptions"] += 1
            elif notice[:1] == b"\x00":
                self.counters.extra["subscriptions"] = max(0, self.counters.extra["subscriptions"] - 1)
                self._left_at = time.monotonic()

    def _refresh_gauges(self) -> None:
        self._queued.refresh()
        self.counters.extra["queued_bytes"] = self._queued.nbytes
        self.counters.extra["queue_limit_messages"] = self._hwm

    async def _fit_hwm(self, nbytes: int) -> None:
        """Lower the mark before a message larger than any before it leaves, so queues stay within the bytes."""
        if nbytes <= self._largest:
            return
        self._largest = nbytes
        hwm = max(1, min(self.sndhwm, self.max_queue_bytes // nbytes - 1))
        if hwm >= self._hwm:
            return
        hwm = 1 << (hwm.bit_length() - 1)  # a power of two: a growing matrix binds anew a few times, not per channel
        # never ZMQ_SNDHWM on a socket with queues: libzmq 4.3.5 stops a queue for good whose reader has not yet
        # acknowledged more messages than the new mark, and crashes its I/O thread when a queue is being set up
        # or torn down at that moment; a fresh socket gives every queue the mark from the start
        await self._rebind(hwm)

    async def _rebind(self, hwm: int) -> None:
        """A fresh XPUB with the lower mark on the same endpoint; subscribers reconnect and subscribe again."""
        ctx = self._context or self._own_context
        assert ctx is not None and self._pub is not None
        self._pub.close(linger=0)
        self._pub = None
        pub = make_sync_socket(ctx, zmq.XPUB, hwm=hwm, max_message_bytes=MAX_SUBSCRIPTION_BYTES)
        pub.setsockopt(zmq.XPUB_VERBOSER, 1)
        pub.copy_threshold = 0
        for _ in range(REBIND_TRIES):  # the closed socket lets go of its port on libzmq's I/O thread
            try:
                attach(pub, self.endpoint, bind=self.bind, what="ZeroMQ publisher")
                break
            except ConfigError:
                await asyncio.sleep(0.01)
        else:
            pub.close(linger=0)
            raise ConfigError(f"could not bind {self.endpoint} again with a lower queue mark ({hwm} messages)")
        self._pub, self._hwm = pub, hwm
        self.counters.extra["subscriptions"] = 0  # each subscriber's subscription arrives again
        self.counters.extra["rebinds"] += 1
        log.info("ZeroMQ publisher bound anew with a queue mark of %d messages for %d-byte messages (subscribers "
                 "reconnect)", hwm, self._largest)  # fmt: skip

    async def _send(self, stream: str, payload: bytes, seq: int) -> bool:
        if self._pub is None:
            self.counters.dropped[stream] += 1
            self._warn.warning("closed", "ZmqPublisher is not started; %s dropped", stream)
            return False
        self._read_subscriptions()
        topic_frame = self._topics[stream]
        try:
            await self._fit_hwm(len(topic_frame) + len(payload))
            assert self._pub is not None
            self._pub.send(topic_frame, zmq.NOBLOCK | zmq.SNDMORE)
            if stream in TRACKED:  # no copy: libzmq holds `payload` itself, and the tracker says when it lets go
                tracker = self._pub.send(payload, zmq.NOBLOCK, copy=False, track=True)
            else:
                self._pub.send(payload, zmq.NOBLOCK)
        except (zmq.ZMQError, ConfigError) as exc:
            self.counters.dropped[stream] += 1
            self._warn.warning(f"send:{stream}", "ZeroMQ %s not sent: %s", stream, exc)
            return False
        self._seq[stream] = seq
        self.counters.sent[stream] += 1
        self._latest[stream] = payload
        if stream in TRACKED:
            if self._queued.add(stream, len(payload), self._hwm, tracker):
                self.counters.dropped[stream] += 1
                self._warn.warning(f"slow:{stream}", "a ZeroMQ subscriber is not reading: %s dropped", stream)
            self.counters.extra["queued_bytes"] = self._queued.nbytes
        return True

    def _encode(self, stream: str, make: Callable[[], bytes]) -> bytes:
        """make(), or: count the message as dropped, log it (rate-limited) and raise InputError."""
        try:
            return make()
        except Exception as exc:  # InputError, and anything else msgpack may raise on a value
            self.counters.dropped[stream] += 1
            self._warn.warning(f"encode:{stream}", "ZeroMQ %s not encodable, dropped: %s", stream, exc)
            raise InputError(f"{stream} not encodable: {exc}") from exc

    async def publish_snapshot(self, snap: Snapshot) -> None:
        """Send a snapshot (and its pair list, when configured); raises InputError if it cannot be encoded."""
        seq = self._seq["snapshot"] + 1
        payload = self._encode("snapshot", lambda: encode_snapshot(snap, seq=seq))
        pairs = None
        if self.pairs_enabled:
            pairs = self._encode("pairs", lambda: encode_snapshot(
                snap, seq=seq, top_k=self.top_k, threshold=self.threshold, pairs_only=True))  # fmt: skip
        if await self._send("snapshot", payload, seq):
            self.counters.publish_lag_s = (time.time_ns() - snap.wall_ns) / 1e9
            self._last_t_ns = snap.t_ns
        if pairs is not None:
            await self._send("pairs", pairs, seq)

    async def publish_event(self, ev: ChangeEvent) -> None:
        """Send a change event; raises InputError if it cannot be encoded."""
        seq = self._seq["event"] + 1
        await self._send("event", self._encode("event", lambda: encode_event(ev, seq=seq)), seq)

    async def publish_status(self, state: str, counters: Mapping[str, float | int]) -> None:
        """Send a status ("online" | "offline") with a map of counters; also kept for late joiners."""
        seq = self._seq["status"] + 1
        payload = self._encode("status", lambda: encode_status(state, counters, seq=seq, t_ns=self._last_t_ns))
        await self._send("status", payload, seq)

    def __repr__(self) -> str:
        lag = "" if math.isnan(self.counters.publish_lag_s) else f", lag {self.counters.publish_lag_s:.3f} s"
        return f"ZmqPublisher({self.endpoint!r}, sent {self.counters.sent}{lag})"
