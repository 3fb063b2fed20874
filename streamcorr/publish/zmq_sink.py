"""The ZeroMQ sink: envelopes on a PUB socket, and a last-value cache that late joiners ask.

Each message is two frames, ``[topic, envelope]``. PUB never blocks: a subscriber that falls
``sndhwm`` messages behind loses messages inside libzmq, which the subscriber sees as a jump in
``seq``. The cache is a REP socket on ``snapshot_endpoint``: any request (up to 4 KiB) is answered
with the frames ``[topic, envelope, topic, envelope, ...]`` of the newest snapshot, pairs list and
status, or one empty frame before anything was published.

A message that cannot be encoded (a snapshot over the envelope limit, say) is counted in
``counters.dropped``, logged (rate-limited) and raised as ``InputError`` to the caller; the publisher
goes on with the next message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping

import zmq
import zmq.asyncio

from ..changes import ChangeEvent
from ..errors import ConfigError, InputError
from ..logutil import RateLimitedLog
from ..matrix import Snapshot
from ..transport.zmq import attach, check_endpoint, make_socket
from .envelope import check_pair_selection, check_prefix, encode_event, encode_snapshot, encode_status, topic
from .sinks import SinkCounters

__all__ = ["ZmqPublisher"]

log = logging.getLogger("streamcorr.publish.zmq")

MAX_REQUEST_BYTES = 4096  # late-joiner requests carry nothing; bigger ones are refused by libzmq
CLOSE_LINGER_MS = 200  # time the final "offline" status gets to leave at stop()


class ZmqPublisher:
    """Publish snapshots, events and status on a ZeroMQ PUB socket (bound to 127.0.0.1 by default); a Sink.

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
        sndhwm: int = 1000,
        top_k: int | None = None,
        threshold: float | None = None,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        check_endpoint(endpoint)
        if snapshot_endpoint is not None:
            check_endpoint(snapshot_endpoint, "snapshot_endpoint")
        if isinstance(sndhwm, bool) or not isinstance(sndhwm, int) or sndhwm < 1:
            raise ConfigError(f"sndhwm must be a positive number of messages; got {sndhwm!r}")
        if context is not None and not isinstance(context, zmq.asyncio.Context):
            raise ConfigError("context must be a zmq.asyncio.Context (or None for a private one)")
        check_pair_selection(top_k, threshold)
        self.endpoint = endpoint  # after start(): the endpoint actually bound (a "*" port resolved)
        self.snapshot_endpoint = snapshot_endpoint
        self.bind = bind
        self.prefix = check_prefix(prefix)
        self.sndhwm = sndhwm
        self.top_k, self.threshold = top_k, threshold
        self.counters = SinkCounters()
        self._context = context
        self._own_context: zmq.asyncio.Context | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._rep: zmq.asyncio.Socket | None = None
        self._serve_task: asyncio.Task[None] | None = None
        self._topics = {s: topic(prefix, s).encode() for s in ("snapshot", "pairs", "event", "status")}
        self._seq = dict.fromkeys(self._topics, 0)
        self._latest: dict[str, bytes] = {}  # stream -> newest envelope, for late joiners
        self._last_t_ns: int | None = None
        self._stopped = False
        self._warn = RateLimitedLog(log)

    @property
    def pairs_enabled(self) -> bool:
        return self.top_k is not None or self.threshold is not None

    @property
    def queue_depth(self) -> int:
        return 0  # PUB never waits: what a subscriber cannot take is dropped inside libzmq (a seq gap there)

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
        pub = make_socket(ctx, zmq.PUB, hwm=self.sndhwm)
        rep: zmq.asyncio.Socket | None = None
        try:
            self.endpoint = attach(pub, self.endpoint, bind=self.bind, what="ZeroMQ publisher")
            if self.snapshot_endpoint is not None:
                rep = make_socket(ctx, zmq.REP, max_message_bytes=MAX_REQUEST_BYTES)
                self.snapshot_endpoint = attach(rep, self.snapshot_endpoint, bind=True, what="late-joiner cache")
        except ConfigError:
            pub.close(0)
            if rep is not None:
                rep.close(0)
            await self._term_context()
            raise
        self._pub, self._rep = pub, rep
        self._stopped = False
        if rep is not None:
            self._serve_task = asyncio.create_task(self._serve_latest(rep), name="streamcorr-zmq-latest")
        log.info("publishing on %s (late joiners: %s)", self.endpoint, self.snapshot_endpoint)
        await self.publish_status("online", self.counters.as_dict())

    async def stop(self) -> None:
        """Publish an "offline" status (best effort), then close the sockets."""
        if self._pub is None:
            return
        await self.publish_status("offline", self.counters.as_dict())
        if self._serve_task is not None:
            self._serve_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._serve_task
            self._serve_task = None
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

    async def _send(self, stream: str, payload: bytes, seq: int) -> bool:
        if self._pub is None:
            self.counters.dropped[stream] += 1
            self._warn.warning("closed", "ZmqPublisher is not started; %s dropped", stream)
            return False
        try:
            await self._pub.send_multipart([self._topics[stream], payload], flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self.counters.dropped[stream] += 1
            self._warn.warning(f"send:{stream}", "ZeroMQ %s not sent: %s", stream, exc)
            return False
        self._seq[stream] = seq
        self.counters.sent[stream] += 1
        self._latest[stream] = payload
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
