"""MQTT in: ``MqttSource``, which subscribes to topic filters and feeds decoded samples to a sink.

``MqttSource`` decodes each message with a ``PayloadDecoder`` and hands the samples to a sink (``Engine.push``).
Its connection is :func:`streamcorr.transport.mqtt.keep_connected`: it never gives up on a broker, reconnecting
after jittered, growing delays with a fresh client and counting ``connects``, ``disconnects`` and
``connect_failures`` in its ledger. Messages published while no connection is up are lost at QoS 0 (with QoS 1/2
and a fixed ``client_id`` the broker may keep them for the session).

Backpressure: received messages wait in a queue of at most ``queue_size`` messages and ``queue_bytes``
bytes (topics and payloads). When either is reached the arriving message is discarded undecoded and
counted in ``counters.queue_full`` (aiomqtt alone would only log a warning). Memory held for one message
beyond that is the broker's largest message (Mosquitto's ``message_size_limit``; set it, as the MQTT
maximum is 256 MiB).
"""

from __future__ import annotations

import asyncio
import logging

import aiomqtt

from ..config import MqttConnection
from ..errors import ConfigError
from ..transport.mqtt import check_settings, keep_connected, make_client
from .payload import PayloadDecoder
from .source import ArrivalClock, Batch, IngestCounters, RateLimitedLog, SampleSink, decode_safely, deliver, merge

__all__ = ["MqttSource"]

log = logging.getLogger("streamcorr.ingest.mqtt")

_BATCH_MAX = 1000  # messages decoded before the sink is called (only reached while behind)
_BATCH_S = 0.05  # a batch gathers this long: each channel's samples reach the engine in one push, not one by one
_POLL_S = 0.005  # how often a gathering batch looks at the queue


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

    ``settings`` is the connection: an ``MqttConnection``, or a source's config section built on it.

    >>> src = MqttSource(settings=MqttConnection(port=1883), topics=["robot/+/imu"],
    ...                  decoder=PayloadDecoder(), sink=lambda ch, t, v: len(t))
    >>> src.connected, src.counters.connects
    (False, 0)

    Run it with ``await src.run()`` (until cancelled); ``connected`` is True once connected and subscribed.
    """

    def __init__(
        self,
        *,
        settings: MqttConnection,
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
        if queue_size < 1:
            raise ConfigError(f"queue_size must be >= 1 message; got {queue_size}")
        if queue_bytes < 1:
            raise ConfigError(f"queue_bytes must be >= 1 byte; got {queue_bytes}")
        self.settings = check_settings(settings)
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
        """Connect, subscribe and ingest until cancelled; broker loss means reconnecting, never returning.
        Raises ConfigError only for settings that cannot work (TLS files that cannot be read)."""
        await keep_connected(
            self.settings,
            self._session,
            counters=self.counters,
            log=log,
            name="MQTT source",
            new_client=lambda: make_client(self.settings, queue_type=self._queue_type()),
        )

    async def _session(self, client: aiomqtt.Client) -> None:
        try:
            for topic in self.topics:
                await self._subscribe(client, topic)
            self.connected = True
            log.info("connected to %s:%d, subscribed to %s", self.settings.host, self.settings.port, self.topics)
            await self._consume(client)
        finally:
            self.connected = False
        raise aiomqtt.MqttError("the message stream ended")  # only a lost connection ends it; never a goodbye

    async def _subscribe(self, client: aiomqtt.Client, topic: str) -> None:
        granted = await client.subscribe(topic, qos=self.settings.qos)
        codes = [code if isinstance(code, int) else int(code.value) for code in granted]  # int, or v5 ReasonCode
        if any(c >= 0x80 for c in codes):  # the broker refused (ACL, bad filter): say so, keep the rest
            log.error("broker refused subscription to %r (reason codes %s)", topic, codes)

    async def _consume(self, client: aiomqtt.Client) -> None:
        loop = asyncio.get_running_loop()
        async for message in client.messages:
            # Micro-batching: gather messages for _BATCH_S (or _BATCH_MAX of them), then call the sink once per
            # channel: one message per reading costs one numpy push per channel and batch, not per message. A sample
            # reaches the engine at most _BATCH_S late, well within a hop.
            batches = self._decode(message)
            deadline, taken = loop.time() + _BATCH_S, 1
            queue = self._queue
            try:
                while queue is not None and taken < _BATCH_MAX:
                    if queue.empty():
                        left = deadline - loop.time()
                        if left <= 0:
                            break
                        await asyncio.sleep(min(left, _POLL_S))  # the socket reader fills the queue meanwhile
                        continue
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
