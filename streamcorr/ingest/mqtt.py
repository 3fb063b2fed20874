"""MQTT in: ``MqttSource``, which subscribes to topic filters and feeds decoded samples to a sink.

``MqttSource`` decodes each message with a ``PayloadDecoder`` and hands the samples to a sink (``Engine.push``).
Its connection is :func:`streamcorr.transport.mqtt.keep_connected`: it never gives up on a broker, reconnecting
after jittered, growing delays with a fresh client and counting ``connects``, ``disconnects`` and
``connect_failures`` in its ledger. Messages published while no connection is up are lost at QoS 0 (with QoS 1/2
and a fixed ``client_id`` the broker may keep them for the session).

Receiving: paho hands each message's topic and payload straight to the source
(:func:`streamcorr.transport.mqtt.take_messages`: no per-message object, queue or task switch), reading the
socket in chunks. Messages are decoded in batches, and each channel's samples reach the sink in one push: a
batch is decoded as soon as it holds ``queue_size`` messages (at most 1,000) or ``queue_bytes`` bytes (topics
and payloads), and otherwise ``_BATCH_S`` after its first message. So at most that much waits undecoded, and
the source itself drops nothing: a burst faster than decoding waits in the socket's receive buffer
(``receive_buffer_bytes``: fixed where the kernel's ``net.core.rmem_max`` allows it, auto-tuned otherwise),
and beyond it the broker drops messages for a slow client (QoS 0), which the ledger sees as ``seq_gaps`` where
messages carry a ``seq``. Memory held for one message beyond a batch is the broker's largest message
(Mosquitto's ``message_size_limit``; set it, as the MQTT maximum is 256 MiB).
"""

from __future__ import annotations

import asyncio
import logging

import aiomqtt

from ..config import MIN_RECEIVE_BUFFER, MQTT_RECEIVE_BUFFER, MqttConnection
from ..errors import ConfigError
from ..transport.mqtt import check_settings, keep_connected, make_client, receive_buffer_plan, take_messages
from .payload import PayloadDecoder
from .source import ArrivalClock, IngestCounters, RateLimitedLog, SampleSink, deliver

__all__ = ["MqttSource"]

log = logging.getLogger("streamcorr.ingest.mqtt")

_BATCH_MAX = 1000  # messages decoded at once, at most (a batch fills only while messages arrive fast)
_BATCH_S = 0.05  # a batch gathers this long: each channel's samples reach the engine in one push, not one by one


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
        receive_buffer_bytes: int = MQTT_RECEIVE_BUFFER,
    ) -> None:
        if not topics:
            raise ConfigError("topics is empty; give at least one MQTT topic filter, e.g. 'sensors/#'")
        for topic in topics:
            check_topic_filter(topic)
        if queue_size < 1:
            raise ConfigError(f"queue_size must be >= 1 message; got {queue_size}")
        if queue_bytes < 1:
            raise ConfigError(f"queue_bytes must be >= 1 byte; got {queue_bytes}")
        if receive_buffer_bytes < 0 or 0 < receive_buffer_bytes < MIN_RECEIVE_BUFFER:
            raise ConfigError(f"receive_buffer_bytes must be 0 (the kernel's own) or at least {MIN_RECEIVE_BUFFER}; "
                              f"got {receive_buffer_bytes}")  # fmt: skip
        self.settings = check_settings(settings)
        self.topics = list(topics)
        self.decoder = decoder
        self.sink = sink
        self.queue_size = queue_size
        self.queue_bytes = queue_bytes
        self._batch_len = min(_BATCH_MAX, queue_size)
        self.receive_buffer_bytes = receive_buffer_bytes
        self._receive_buffer = receive_buffer_bytes  # what run() sets, within the kernel's limit
        self.counters: IngestCounters = decoder.counters  # one ledger: decode drops and transport stats
        self.connected = False
        self._taken: list[tuple[str, bytes, float]] = []  # (topic, payload, arrival_s) received, not yet decoded
        self._taken_bytes = 0
        self._arrived = asyncio.Event()  # set when _taken turns non-empty
        self._clock = ArrivalClock()
        self._rate_log = RateLimitedLog(log)

    @property
    def queue_depth(self) -> int:
        """Messages received and not yet decoded."""
        return len(self._taken)

    async def run(self) -> None:
        """Connect, subscribe and ingest until cancelled; broker loss means reconnecting, never returning.
        Raises ConfigError only for settings that cannot work (TLS files that cannot be read)."""
        self._receive_buffer = receive_buffer_plan(self.receive_buffer_bytes, "MQTT source")
        try:
            await keep_connected(self.settings, self._session, counters=self.counters, log=log, name="MQTT source",
                                 new_client=self._new_client)  # fmt: skip
        finally:  # messages paho handed over while the last connection closed
            self._deliver()

    def _new_client(self) -> aiomqtt.Client:
        client = make_client(self.settings)
        take_messages(client, self._take, receive_buffer_bytes=self._receive_buffer)
        return client

    async def _session(self, client: aiomqtt.Client) -> None:
        self._arrived = asyncio.Event()  # this run's loop; a persistent session may have delivered some already
        if self._taken:
            self._arrived.set()
        try:
            for topic in self.topics:
                await self._subscribe(client, topic)
            self.connected = True
            log.info("connected to %s:%d, subscribed to %s", self.settings.host, self.settings.port, self.topics)
            await self._consume(client)
        finally:
            self.connected = False
            self._deliver()  # a subscription that failed, say: what arrived is still delivered
        raise aiomqtt.MqttError("the message stream ended")  # only a lost connection ends it; never a goodbye

    async def _subscribe(self, client: aiomqtt.Client, topic: str) -> None:
        granted = await client.subscribe(topic, qos=self.settings.qos)
        codes = [code if isinstance(code, int) else int(code.value) for code in granted]  # int, or v5 ReasonCode
        if any(c >= 0x80 for c in codes):  # the broker refused (ACL, bad filter): say so, keep the rest
            log.error("broker refused subscription to %r (reason codes %s)", topic, codes)

    def _take(self, topic: str | None, payload: bytes) -> None:
        """One received message (paho's callback, in the event loop's thread): into the batch, which is decoded at
        once when full. A topic that is not UTF-8 is counted and dropped."""
        if topic is None:
            self.counters.messages += 1
            self.counters.drop("topic")
            self._rate_log(logging.WARNING, "topic", "dropped a message whose topic is not UTF-8")
            return
        taken = self._taken
        taken.append((topic, payload, self._clock()))  # stamped on arrival, for payloads without a time
        self._taken_bytes += len(topic) + len(payload)
        if len(taken) >= self._batch_len or self._taken_bytes >= self.queue_bytes:
            self._deliver()
        elif len(taken) == 1:
            self._arrived.set()

    async def _consume(self, client: aiomqtt.Client) -> None:
        # client.messages yields nothing here (take_messages): iterated, it raises MqttError when the connection is
        # lost, which ends the session
        lost = asyncio.ensure_future(self._watch(client))
        try:
            while True:
                arrived = asyncio.ensure_future(self._arrived.wait())
                try:
                    await asyncio.wait((arrived, lost), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    arrived.cancel()
                if not lost.done():  # a batch that does not fill gathers for _BATCH_S: well within a hop
                    await asyncio.wait((lost,), timeout=_BATCH_S)
                self._deliver()
                if lost.done():
                    lost.result()  # raises MqttError
                    return
        finally:
            lost.cancel()
            if lost.done() and not lost.cancelled():
                lost.exception()  # retrieved: the session's end is reported by the caller
            self._deliver()  # cancelled meanwhile: what was taken is still delivered

    @staticmethod
    async def _watch(client: aiomqtt.Client) -> None:
        async for _ in client.messages:
            pass

    def _deliver(self) -> None:
        """Decode what was taken and hand each channel's samples to the sink in one call."""
        taken, self._taken, self._taken_bytes = self._taken, [], 0
        self._arrived.clear()
        if not taken:
            return
        deliver(self.decoder.decode_many(taken), self.sink, self.counters, self._rate_log)
