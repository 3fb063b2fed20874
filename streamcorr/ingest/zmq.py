"""ZeroMQ in: a SUB or PULL socket whose messages are decoded into samples for a sink (``Engine.push``).

Messages are multipart ``[topic, payload]``; a single frame is a payload with topic ``""``; more frames are a
counted drop ("frames"). SUB filters by topic prefix (ZeroMQ matches the first frame, so for single-frame
messages the filter applies to the payload); PULL ignores ``topics``. Connecting sockets reconnect by
themselves (libzmq), so ``run`` only returns when cancelled; ``connects`` and ``disconnects`` count peer
sessions from the socket monitor.

Backpressure: libzmq queues at most ``rcvhwm`` messages. PUSH -> PULL blocks the sender when full (nothing
is lost); PUB -> SUB drops at the publisher or receiver **silently**: publishers that need to know add an
integer ``seq`` field to each payload (incremented per message and topic), and the decoder counts the
missing ones in ``counters.seq_gaps``. A frame larger than ``max_message_bytes`` (default: twice the
decoder's ``max_payload_bytes``) makes libzmq drop the peer's connection (it reconnects; counted in
``disconnects``). Messages are read frame by frame and at most two frames are kept, so a message of many
frames costs this process one frame at a time: it is counted as "frames", and a two-frame message over
``max_message_bytes`` in all (topic and payload together) as "oversize"; a topic frame longer than the
decoder's ``max_topic_bytes`` is a "topic" drop. (libzmq itself holds a multipart message whole until its
last frame arrives, with no bound on the frame count: a peer that can reach the socket can make it hold
that much; bind to 127.0.0.1 or a private network.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Literal

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from ..errors import ConfigError
from ..transport.zmq import attach, check_endpoint, make_socket
from .payload import PayloadDecoder
from .source import ArrivalClock, IngestCounters, RateLimitedLog, SampleSink, deliver

__all__ = ["ZmqSource"]

log = logging.getLogger("streamcorr.ingest.zmq")

_BATCH_MAX = 256  # queued messages taken at once before the sink is called once per channel
_PEER_UP = (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED)
_PEER_DOWN = (zmq.EVENT_DISCONNECTED,)


class ZmqSource:
    """Receives ``[topic, payload]`` messages on a ZeroMQ SUB or PULL socket and feeds a sink.

    >>> src = ZmqSource(endpoint="tcp://127.0.0.1:5555", decoder=PayloadDecoder(), sink=lambda ch, t, v: len(t))
    >>> src.mode, src.topics, src.peers
    ('sub', [''], 0)

    Run it with ``await src.run()`` (until cancelled). With ``bind=True`` and a wildcard port
    (``tcp://127.0.0.1:*``) the bound address appears in ``bound_endpoint`` once ``ready`` is set.
    """

    def __init__(
        self,
        *,
        endpoint: str,
        mode: Literal["sub", "pull"] = "sub",
        bind: bool = False,
        topics: list[str] | None = None,
        decoder: PayloadDecoder,
        sink: SampleSink,
        rcvhwm: int = 10_000,
        context: zmq.Context[Any] | None = None,
        max_message_bytes: int | None = None,
    ) -> None:
        if mode not in ("sub", "pull"):
            raise ConfigError(f"mode must be 'sub' or 'pull'; got {mode!r}")
        check_endpoint(endpoint)
        if rcvhwm < 1:
            raise ConfigError(f"rcvhwm must be >= 1 message; got {rcvhwm}")
        topics = [""] if topics is None else list(topics)
        if mode == "sub" and not topics:
            raise ConfigError("topics is empty, so a SUB socket would receive nothing; use [''] for all")
        self.endpoint = endpoint
        self.mode = mode
        self.bind = bind
        self.topics = topics
        self.decoder = decoder
        self.sink = sink
        self.rcvhwm = rcvhwm
        self.max_message_bytes = max_message_bytes or 2 * decoder.max_payload_bytes
        self.counters: IngestCounters = decoder.counters  # one ledger: decode drops and transport stats
        self.bound_endpoint: str | None = None
        self.ready = asyncio.Event()
        self.peers = 0  # peer sessions up now (connections, for a binding socket)
        self._context = context
        self._clock = ArrivalClock()
        self._rate_log = RateLimitedLog(log)

    @property
    def connected(self) -> bool:
        return self.peers > 0

    @property
    def queue_depth(self) -> int:
        return 0  # the receive queue lives inside libzmq (rcvhwm); its drops show only as seq_gaps

    def _socket(self) -> zmq.asyncio.Socket:
        ctx = self._context
        if ctx is None:
            actx = zmq.asyncio.Context.instance()
        elif isinstance(ctx, zmq.asyncio.Context):
            actx = ctx
        else:
            actx = zmq.asyncio.Context.shadow(ctx.underlying)
        kind = zmq.SUB if self.mode == "sub" else zmq.PULL
        return make_socket(actx, kind, hwm=self.rcvhwm, max_message_bytes=self.max_message_bytes)

    async def run(self) -> None:
        """Bind or connect, then receive until cancelled; ConfigError if the endpoint cannot be used."""
        sock = self._socket()
        monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        watcher = asyncio.create_task(self._watch(monitor), name="zmq-source-monitor")
        try:
            where = attach(sock, self.endpoint, bind=self.bind, what=f"ZeroMQ {self.mode} source")
            self.bound_endpoint = where if self.bind else None
            if self.mode == "sub":
                for topic in self.topics:
                    sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
            if self.bind and any(h in self.endpoint for h in ("://*", "://0.0.0.0", "://[::]")):
                log.warning(
                    "zmq %s listens on every interface (%s); use 127.0.0.1 unless that is meant",
                    self.mode,
                    self.endpoint,
                )
            log.info("zmq %s %s %s", self.mode, "bound to" if self.bind else "connected to", self.endpoint)
            self.ready.set()
            while True:
                taken = self._take(*await self._recv(sock))
                try:
                    for _ in range(_BATCH_MAX - 1):  # take what is queued, then call the sink once per channel
                        try:
                            received = await self._recv(sock, zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        taken += self._take(*received)
                finally:  # even if cancelled meanwhile: what was received is decoded and delivered
                    deliver(self.decoder.decode_many(taken), self.sink, self.counters, self._rate_log)
                await asyncio.sleep(0)  # a ready message never suspends: give the loop a turn per batch
        finally:
            self.ready.clear()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)
            self.peers = 0

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        while True:
            try:
                event = parse_monitor_message(await monitor.recv_multipart())
            except RuntimeError as exc:  # a malformed monitor event must not end the watcher
                self._rate_log(logging.WARNING, "monitor", "unreadable zmq monitor event: %s", exc)
                continue
            kind = event["event"]
            if kind in _PEER_UP:
                self.counters.connects += 1
                self.peers += 1
            elif kind in _PEER_DOWN:
                self.counters.disconnects += 1
                self.peers = max(0, self.peers - 1)
                where = event["endpoint"].decode(errors="replace")
                self._rate_log(logging.WARNING, "disconnect", "zmq peer disconnected (%s)", where)

    async def _recv(self, sock: zmq.asyncio.Socket, flags: int = 0) -> tuple[list[zmq.Frame], int, int]:
        """One message: (its first two frames, its frame count, its bytes in all), read frame by frame so that a
        message of many frames never sits in this process whole. zmq.Again (with NOBLOCK) if none is waiting."""
        frame = await sock.recv(flags, copy=False)
        kept, count, total = [frame], 1, len(frame)
        while frame.more:  # the rest of a multipart message is already here (libzmq delivers them whole)
            frame = await sock.recv(copy=False)
            count += 1
            total += len(frame)
            if count <= 2 and total <= self.max_message_bytes:
                kept.append(frame)
            elif len(kept) > 0 and (count > 2 or total > self.max_message_bytes):
                kept.clear()  # release what was kept: this message is dropped whole
        return kept, count, total

    def _take(
        self, frames: list[zmq.Frame] | list[bytes], count: int | None = None, total: int = 0
    ) -> list[tuple[str, bytes, float]]:
        """Check the message's shape and sizes (before copying anything out of libzmq): [(topic, payload,
        arrival_s)] to decode, or [] for a message dropped (and counted) here."""
        count = len(frames) if count is None else count
        reason = ""
        if count > 2:
            reason, detail = "frames", f"a {count}-frame message ({total} bytes; want [topic, payload])"
        elif total > self.max_message_bytes:
            reason, detail = "oversize", f"a {total}-byte message > max_message_bytes ({self.max_message_bytes})"
        elif count == 2 and len(frames[0]) > self.decoder.max_topic_bytes:
            reason, detail = "topic", f"a {len(frames[0])}-byte topic > max_topic_bytes"
        if reason:
            self.counters.messages += 1
            self.counters.drop(reason)
            self._rate_log(logging.WARNING, reason, "dropped %s", detail)
            return []
        parts = [f if isinstance(f, bytes) else f.bytes for f in frames]
        if count == 1:
            topic_bytes, payload = b"", parts[0]
        else:
            topic_bytes, payload = parts
        try:
            topic = topic_bytes.decode()
        except UnicodeDecodeError:
            self.counters.messages += 1
            self.counters.drop("topic")
            self._rate_log(logging.WARNING, "topic", "dropped a message whose topic is not UTF-8: %r", topic_bytes[:40])
            return []
        return [(topic, payload, self._clock())]
