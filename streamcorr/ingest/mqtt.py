"""MQTT in: settings, client factory and backoff (shared with the publishing sink), and ``MqttSource``.

``MqttSource`` subscribes to topic filters, decodes each message with a ``PayloadDecoder`` and hands the
samples to a sink (``Engine.push``). It never gives up on a broker: after a failed connect or a lost
connection it waits a jittered, growing delay and connects again with a fresh client, counting
``connects``, ``disconnects`` and ``connect_failures``. Messages published while no connection is up are
lost at QoS 0 (with QoS 1/2 and a fixed ``client_id`` the broker may keep them for the session).

Backpressure: received messages wait in a queue of at most ``queue_size`` messages and ``queue_bytes``
bytes (topics and payloads). When either is reached the arriving message is discarded undecoded and
counted in ``counters.queue_full`` (aiomqtt alone would only log a warning). Memory held for one message
beyond that is the broker's largest message (Mosquitto's ``message_size_limit``; set it, as the MQTT
maximum is 256 MiB).
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiomqtt

from ..errors import ConfigError
from .payload import PayloadDecoder
from .source import ArrivalClock, Batch, IngestCounters, RateLimitedLog, SampleSink, decode_safely, deliver, merge

__all__ = ["MqttSettings", "MqttSource", "MqttTls", "jittered_backoff", "make_client"]

log = logging.getLogger("streamcorr.ingest.mqtt")

_BATCH_MAX = 1000  # messages decoded before the sink is called (only reached while behind)
_BATCH_S = 0.01  # longest a batch keeps gathering


@dataclass(frozen=True)
class MqttTls:
    ca_file: str | None = None  # None: the system trust store
    cert_file: str | None = None  # client certificate, for brokers that require one
    key_file: str | None = None
    insecure: bool = False  # skip host-name verification (test brokers only)

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.insecure:
            ctx.check_hostname = False
        return ctx


@dataclass(frozen=True)
class MqttSettings:
    host: str = "127.0.0.1"
    port: int = 1883
    client_id: str | None = None  # None: the broker assigns one
    username: str | None = None
    password: str | None = None
    tls: MqttTls | None = None
    keepalive_s: int = 30
    qos: int = 0
    timeout_s: float = 10.0
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0


def make_client(
    settings: MqttSettings, *, will: aiomqtt.Will | None = None, max_queued_in: int | None = None
) -> aiomqtt.Client:
    """A fresh client for one connection attempt (aiomqtt clients are not reusable after a failure)."""
    return aiomqtt.Client(**_client_kwargs(settings), will=will, max_queued_incoming_messages=max_queued_in)


def _client_kwargs(settings: MqttSettings) -> dict[str, Any]:
    """aiomqtt.Client arguments from the settings (shared by make_client and the source's own factory)."""
    return {
        "hostname": settings.host,
        "port": settings.port,
        "identifier": settings.client_id,
        "username": settings.username,
        "password": settings.password,
        "tls_context": settings.tls.context() if settings.tls else None,
        "tls_insecure": settings.tls.insecure if settings.tls else None,
        "keepalive": settings.keepalive_s,
        "timeout": settings.timeout_s,
    }


def jittered_backoff(min_s: float, max_s: float, rng: random.Random | None = None) -> Iterator[float]:
    """Delays before reconnect attempts: exponential up to max_s, each drawn uniformly in [d/2, d]."""
    rng = rng or random.Random()
    delay = min_s
    while True:
        yield rng.uniform(delay / 2, delay)
        delay = min(max_s, delay * 2)


def _message_bytes(message: aiomqtt.Message) -> int:
    """Bytes a received message holds: its payload and its topic."""
    payload = message.payload
    size = len(payload) if isinstance(payload, bytes | bytearray) else 64
    return size + len(message.topic.value)


def check_topic_filter(topic: str) -> None:
    """Raise ConfigError unless topic is a valid MQTT subscription filter (``+`` and ``#`` as whole levels)."""
    if not isinstance(topic, str) or not topic or "\0" in topic or len(topic.encode()) > 65535:
        raise ConfigError(f"MQTT topic filter {topic!r} must be a non-empty string of at most 65535 bytes")
    levels = topic.split("/")
    for k, level in enumerate(levels):
        if "#" in level and (level != "#" or k != len(levels) - 1):
            raise ConfigError(f"MQTT topic filter {topic!r}: '#' must be the whole last level, as in 'a/#'")
        if "+" in level and level != "+":
            raise ConfigError(f"MQTT topic filter {topic!r}: '+' must be a whole level, as in 'a/+/c'")


class MqttSource:
    """Subscribes to MQTT topic filters and feeds decoded samples to a sink, reconnecting forever.

    >>> src = MqttSource(settings=MqttSettings(port=1883), topics=["robot/+/imu"],
    ...                  decoder=PayloadDecoder(), sink=lambda ch, t, v: len(t))
    >>> src.connected, src.counters.connects
    (False, 0)

    Run it with ``await src.run()`` (until cancelled); ``connected`` is True once connected and subscribed.
    """

    def __init__(
        self,
        *,
        settings: MqttSettings,
        topics: list[str],
        decoder: PayloadDecoder,
        sink: SampleSink,
        queue_size: int = 10_000,
        queue_bytes: int = 64 << 20,
    ) -> None:
        if not topics:
            raise ConfigError("topics is empty; give at least one MQTT topic filter, e.g. 'sensors/#'")
        for topic in topics:
            check_topic_filter(topic)
        if settings.qos not in (0, 1, 2):
            raise ConfigError(f"MQTT qos must be 0, 1 or 2; got {settings.qos}")
        if queue_size < 1:
            raise ConfigError(f"queue_size must be >= 1 message; got {queue_size}")
        if queue_bytes < 1:
            raise ConfigError(f"queue_bytes must be >= 1 byte; got {queue_bytes}")
        if not 0 < settings.reconnect_min_s <= settings.reconnect_max_s:
            raise ConfigError(
                f"need 0 < reconnect_min_s <= reconnect_max_s; got {settings.reconnect_min_s}, "
                f"{settings.reconnect_max_s}"
            )
        self.settings = settings
        self.topics = list(topics)
        self.decoder = decoder
        self.sink = sink
        self.queue_size = queue_size
        self.queue_bytes = queue_bytes
        self.counters: IngestCounters = decoder.counters  # one ledger: decode drops and transport stats
        self.connected = False
        self._queue: asyncio.Queue[aiomqtt.Message] | None = None
        self._clock = ArrivalClock()
        self._rate_log = RateLimitedLog(log)

    @property
    def queue_depth(self) -> int:
        """Messages received and not yet decoded."""
        return 0 if self._queue is None else self._queue.qsize()

    async def run(self) -> None:
        """Connect, subscribe and ingest until cancelled; broker loss means reconnecting, never returning."""
        s = self.settings
        delays = jittered_backoff(s.reconnect_min_s, s.reconnect_max_s)
        while True:
            client = aiomqtt.Client(**_client_kwargs(s), queue_type=self._queue_type())
            was_connected = False
            try:
                async with client:
                    was_connected = True
                    self.counters.connects += 1
                    for topic in self.topics:
                        await self._subscribe(client, topic)
                    self.connected = True
                    delays = jittered_backoff(s.reconnect_min_s, s.reconnect_max_s)  # healthy again: start low
                    log.info("connected to %s:%d, subscribed to %s", s.host, s.port, self.topics)
                    await self._consume(client)
            except (aiomqtt.MqttError, OSError) as exc:
                if was_connected:
                    self.counters.disconnects += 1
                    what = "lost connection to"
                else:
                    self.counters.connect_failures += 1
                    what = "cannot connect to"
                self._rate_log(logging.WARNING, what, "%s %s:%d: %s", what, s.host, s.port, exc)
            finally:
                self.connected = False
            await asyncio.sleep(next(delays))

    async def _subscribe(self, client: aiomqtt.Client, topic: str) -> None:
        granted = await client.subscribe(topic, qos=self.settings.qos)
        codes = [code if isinstance(code, int) else int(code.value) for code in granted]  # int, or v5 ReasonCode
        if any(c >= 0x80 for c in codes):  # the broker refused (ACL, bad filter): say so, keep the rest
            log.error("broker refused subscription to %r (reason codes %s)", topic, codes)

    async def _consume(self, client: aiomqtt.Client) -> None:
        loop = asyncio.get_running_loop()
        async for message in client.messages:
            # Micro-batching: keep taking messages while more arrive within a loop turn (a backlog), then
            # call the sink once per channel; when messages trickle in, each is delivered at once.
            batches = self._decode(message)
            deadline, taken = loop.time() + _BATCH_S, 1
            queue = self._queue
            try:
                while queue is not None and taken < _BATCH_MAX:
                    if queue.empty():
                        if loop.time() > deadline:
                            break
                        await asyncio.sleep(0)  # one turn for the socket reader
                        if queue.empty():
                            break
                    batches += self._decode(queue.get_nowait())
                    taken += 1
            finally:  # cancelled or disconnected meanwhile: what was decoded is still delivered
                deliver(merge(batches), self.sink, self.counters, self._rate_log)

    def _decode(self, message: aiomqtt.Message) -> list[Batch]:
        payload = message.payload
        if not isinstance(payload, bytes | bytearray):  # received messages are bytes; be safe anyway
            payload = str(payload).encode() if payload is not None else b""
        return decode_safely(self.decoder, message.topic.value, bytes(payload), self._clock(), self._rate_log)

    def _queue_type(self) -> type[asyncio.Queue[aiomqtt.Message]]:
        """A queue class for aiomqtt that counts what it discards when full and registers itself here."""
        source = self

        class _CountingQueue(asyncio.Queue[aiomqtt.Message]):
            def __init__(self, maxsize: int = 0) -> None:
                super().__init__(maxsize=source.queue_size)
                self.nbytes = 0
                source._queue = self

            def put_nowait(self, item: aiomqtt.Message) -> None:
                size = _message_bytes(item)
                # drop the arriving message: the queue holds the oldest, already in order
                if self.full() or (self.nbytes + size > source.queue_bytes and not self.empty()):
                    source.counters.queue_full += 1
                    source._rate_log(logging.WARNING, "queue_full", "incoming queue full (%d messages, %d bytes)",
                                     self.qsize(), self.nbytes)  # fmt: skip
                    return
                super().put_nowait(item)
                self.nbytes += size

            def get_nowait(self) -> aiomqtt.Message:
                item = super().get_nowait()
                self.nbytes -= _message_bytes(item)
                return item

        return _CountingQueue
