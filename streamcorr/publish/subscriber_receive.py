"""The Subscriber's receive halves, one per transport. Each hands every message to ``handle(topic, payload,
replay=...)`` until cancelled, and sets ``ready`` while messages can arrive.

- MQTT: :func:`streamcorr.transport.mqtt.keep_connected` with a session that subscribes to the topics in the
  order given (the status topic first, so that its retained copy arrives before the retained snapshot it
  qualifies) and reads; ``replay`` is the message's retain flag.
- ZeroMQ: a SUB socket from :mod:`streamcorr.transport.zmq`, after one request to the publisher's last-value
  cache for its newest snapshot and status (``replay=True``), so that a late joiner need not wait for a hop.

:func:`parse_url` turns a Subscriber's url into its transport and connection settings; :func:`check_streams` and
:func:`check_wait` check its other arguments.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol
from urllib.parse import SplitResult, urlsplit

import aiomqtt
import zmq
import zmq.asyncio
from pydantic import ValidationError

from ..config import MqttConnection, Tls
from ..errors import ConfigError
from ..logutil import RateLimitedLog
from ..transport.mqtt import check_settings, keep_connected, make_client
from ..transport.zmq import attach, make_socket
from .envelope import MAX_ENVELOPE_BYTES, STREAMS

__all__ = ["Handle", "SubscriberCounters", "check_streams", "check_wait", "parse_url", "receive_mqtt", "receive_zmq"]

log = logging.getLogger("streamcorr.subscriber")


def _per_stream() -> dict[str, int]:
    return dict.fromkeys(STREAMS, 0)


@dataclass
class SubscriberCounters:
    """What the subscriber received, skipped and lost, per stream where it matters."""

    received: dict[str, int] = field(default_factory=_per_stream)
    gaps: dict[str, int] = field(default_factory=_per_stream)  # seq numbers never seen: lost in transit
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("snapshot", "event", "status"), 0))
    duplicates: int = 0  # retained or cached messages already seen
    restarts: int = 0  # seq went back: the publisher restarted
    bad: int = 0  # payloads that are not valid envelopes, or of the wrong kind for their topic
    connects: int = 0  # MQTT
    disconnects: int = 0  # MQTT
    connect_failures: int = 0  # MQTT
    late_joins: int = 0  # ZeroMQ: answers from the last-value cache
    late_join_failures: int = 0  # ZeroMQ: the cache did not answer in time


class Handle(Protocol):
    """What receives each message: the Subscriber's decoding and routing."""

    def __call__(self, topic_name: str, payload: bytes, *, replay: bool) -> None: ...


async def receive_mqtt(
    settings: MqttConnection,
    topics: Sequence[str],
    handle: Handle,
    ready: threading.Event,
    counters: SubscriberCounters,
    *,
    max_queued_in: int,
) -> None:
    """Subscribe to ``topics`` (in this order) and hand on every message, reconnecting until cancelled.
    ``max_queued_in`` bounds aiomqtt's own queue, which only bridges to the Subscriber's: overflow shows as gaps."""

    async def session(client: aiomqtt.Client) -> None:
        try:
            await client.subscribe([(name, int(settings.qos)) for name in topics])
            ready.set()
            log.info("subscribed to %s on %s:%d", ", ".join(topics), settings.host, settings.port)
            async for m in client.messages:
                handle(m.topic.value, m.payload if isinstance(m.payload, bytes) else b"", replay=m.retain)
        finally:
            ready.clear()
        raise aiomqtt.MqttError("the message stream ended")  # only a lost connection ends it

    await keep_connected(
        settings,
        session,
        counters=counters,
        log=log,
        name="subscriber",
        new_client=lambda: make_client(settings, max_queued_in=max_queued_in),
    )


async def receive_zmq(
    url: str,
    topics: Sequence[str],
    handle: Handle,
    ready: threading.Event,
    counters: SubscriberCounters,
    *,
    context: zmq.asyncio.Context | None,
    rcvhwm: int,
    latest_url: str | None,
    request_timeout_s: float,
) -> None:
    """Connect a SUB socket to ``url``, ask ``latest_url`` (if any) for the newest messages, then hand on every
    message until cancelled. ConfigError if ``url`` cannot be connected to."""
    warn = RateLimitedLog(log)
    ctx = zmq.asyncio.Context() if context is None else context
    # beyond rcvhwm libzmq drops, which shows as gaps
    sock = make_socket(ctx, zmq.SUB, hwm=rcvhwm, max_message_bytes=MAX_ENVELOPE_BYTES + 1024)
    try:
        attach(sock, url, bind=False, what="subscriber")
        for name in topics:
            sock.setsockopt(zmq.SUBSCRIBE, name.encode())
        if latest_url is not None:
            for topic_name, payload in await _ask_latest(ctx, latest_url, request_timeout_s, counters, topics):
                handle(topic_name, payload, replay=True)
        ready.set()
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 2:
                counters.bad += 1
                warn.warning("frames", "a ZeroMQ message of %d frames (expected 2), ignored", len(frames))
                continue
            handle(frames[0].decode("utf-8", "replace"), frames[1], replay=False)
    finally:
        ready.clear()
        sock.close(linger=0)
        if context is None:
            ctx.term()  # every socket is closed with linger 0: returns at once


async def _ask_latest(
    ctx: zmq.asyncio.Context, url: str, timeout_s: float, counters: SubscriberCounters, topics: Sequence[str]
) -> list[tuple[str, bytes]]:
    """The last-value cache's (topic, envelope) pairs, in the order of ``topics``; none when it does not answer
    within ``timeout_s`` (counted in ``late_join_failures`` and logged)."""
    req = make_socket(ctx, zmq.REQ, max_message_bytes=4 * MAX_ENVELOPE_BYTES)
    try:
        req.connect(url)
        await req.send(b"latest")
        if not await req.poll(timeout=int(timeout_s * 1000)):
            counters.late_join_failures += 1
            log.warning("no answer from %s in %.1f s: starting without the latest snapshot", url, timeout_s)
            return []
        frames = await req.recv_multipart()
        counters.late_joins += 1
    except zmq.ZMQError as exc:
        counters.late_join_failures += 1
        log.warning("asking %s for the latest snapshot failed: %s", url, exc)
        return []
    finally:
        req.close(linger=0)
    pairs = [(frames[k].decode("utf-8", "replace"), frames[k + 1]) for k in range(0, len(frames) - 1, 2)]
    rank = {name: k for k, name in enumerate(topics)}
    return sorted(pairs, key=lambda tp: rank.get(tp[0], len(rank)))  # status first, as for MQTT


def parse_url(
    url: str, settings: MqttConnection | None, snapshot_url: str | None
) -> tuple[Literal["mqtt", "zmq"], MqttConnection | None, str | None]:
    """(transport, MQTT connection, late-joiner url) for a Subscriber's url; ConfigError for one it cannot use."""
    parts = urlsplit(url)
    if parts.scheme in ("mqtt", "mqtts"):
        return "mqtt", _mqtt_connection(parts, url, settings), None
    if parts.scheme not in ("tcp", "ipc"):
        raise ConfigError(f"url must start with mqtt://, mqtts://, tcp:// or ipc://; got {url!r}")
    if settings is not None:
        raise ConfigError("settings are MQTT options; this url is ZeroMQ")
    if snapshot_url is None and parts.scheme == "tcp":
        try:
            port = parts.port
        except ValueError as exc:
            raise ConfigError(f"bad port in {url!r}: {exc}") from exc
        if port is None:
            raise ConfigError(f"a ZeroMQ url needs a port, e.g. tcp://127.0.0.1:5556; got {url!r}")
        host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
        snapshot_url = f"tcp://{host}:{port + 1}"  # the publisher's default pairing
    return "zmq", None, snapshot_url


def _mqtt_connection(parts: SplitResult, url: str, settings: MqttConnection | None) -> MqttConnection:
    """Host, port, login and TLS from the url; everything else from ``settings``."""
    tls = parts.scheme == "mqtts"
    base = MqttConnection() if settings is None else check_settings(settings)
    try:
        port = parts.port or (8883 if tls else 1883)
    except ValueError as exc:
        raise ConfigError(f"bad port in {url!r}: {exc}") from exc
    fields = base.model_dump(include=set(MqttConnection.model_fields)) | {
        "host": parts.hostname or base.host,
        "port": port,
        "username": parts.username or base.username,
        "password": parts.password or base.password,
        "tls": base.tls or (Tls() if tls else None),
    }
    try:
        return MqttConnection.model_validate(fields)
    except ValidationError as exc:
        raise ConfigError(f"bad MQTT settings from {url!r}: {exc.errors()[0]['msg']}") from None


def check_wait(timeout_s: float | None, quiet_s: float | None) -> tuple[float | None, bool]:
    """(seconds to wait for each message, whether running out ends quietly); ConfigError for bad values."""
    for name, value in (("timeout_s", timeout_s), ("quiet_s", quiet_s)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not value > 0):
            raise ConfigError(f"{name} must be a positive number of seconds (or None); got {value!r}")
    if timeout_s is not None and quiet_s is not None:
        raise ConfigError("give timeout_s (raise SubscriberTimeout) or quiet_s (end quietly), not both")
    return (quiet_s, True) if quiet_s is not None else (timeout_s, False)


def check_streams(streams: Collection[str], queue_size: int) -> tuple[str, ...]:
    """The streams as a tuple, checked, with the queue size; ConfigError naming the fix otherwise."""
    if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
        raise ConfigError(f"queue_size must be a positive number of messages; got {queue_size!r}")
    streams = tuple(streams)
    unknown = set(streams) - set(STREAMS)
    if unknown or not streams or len(set(streams)) != len(streams):
        raise ConfigError(f"streams must be distinct names from {STREAMS}; got {streams}")
    if "snapshot" in streams and "pairs" in streams:
        raise ConfigError("subscribe to 'snapshot' or 'pairs', not both: both arrive as snapshots")
    return streams
