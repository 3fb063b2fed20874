"""MQTT plumbing shared by ``MqttSource``, ``MqttPublisher`` and the Subscriber: a client factory, jittered
backoff and :func:`keep_connected`, the one loop that holds a connection.

The settings are the config section :class:`streamcorr.config.MqttConnection` (or a subclass, such as a source's
or an output's section): one definition of the keys, their defaults and their bounds.

:func:`keep_connected` never gives up on a broker: it connects with a fresh client (aiomqtt clients are not
reusable after a failure), hands the client to a session coroutine, and when the connection fails or is lost it
counts it (``connect_failures`` or ``disconnects``), logs one line per kind at most every few seconds, waits a
jittered, growing delay (``reconnect_min_s`` doubling up to ``reconnect_max_s``, back to the minimum after each
successful connect) and connects again. It returns only when the session returns (a clean goodbye, counted as a
disconnect) and ends when cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import aiomqtt
import paho.mqtt.client as paho

from ..config import MqttConnection, Tls
from ..errors import ConfigError
from ..logutil import RateLimitedLog, broker_hint

_log = logging.getLogger("streamcorr.transport.mqtt")

__all__ = [
    "ConnectionCounters",
    "check_settings",
    "check_tls",
    "describe_receive_buffer",
    "jittered_backoff",
    "keep_connected",
    "make_client",
    "receive_buffer_plan",
    "rmem_max",
    "take_messages",
    "tls_context",
]

Session = Callable[[aiomqtt.Client], Awaitable[None]]


class ConnectionCounters(Protocol):
    """The connection entries of a ledger (IngestCounters, SinkCounters and SubscriberCounters all have them)."""

    connects: int  # connections made
    disconnects: int  # connections ended, lost or closed
    connect_failures: int  # attempts that did not connect


def check_settings(settings: object) -> MqttConnection:
    """``settings`` if it is an MqttConnection (a config section); ConfigError naming the fix otherwise."""
    if not isinstance(settings, MqttConnection):
        got = type(settings).__name__
        raise ConfigError(f"settings must be a streamcorr.config.MqttConnection (or a section built on it); got {got}")
    return settings


def check_tls(settings: MqttConnection) -> None:
    """ConfigError if the TLS files cannot be used: read once before connecting, so that a wrong path stops the
    client with its name instead of counting a connect failure on every attempt."""
    if settings.tls is None:
        return
    try:
        tls_context(settings.tls)
    except (OSError, ValueError) as exc:  # missing or unreadable file, bad PEM (ssl.SSLError is an OSError)
        raise ConfigError(f"tls: cannot use ca_file / cert_file / key_file: {exc}") from exc


def tls_context(tls: Tls) -> ssl.SSLContext:
    """An SSL context for the broker: the given CA (None: the system trust store) and client certificate."""
    ctx = ssl.create_default_context(cafile=tls.ca_file)
    if tls.cert_file:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.insecure:  # host-name verification off: test brokers only
        ctx.check_hostname = False
    return ctx


def make_client(
    settings: MqttConnection,
    *,
    will: aiomqtt.Will | None = None,
    max_queued_in: int | None = None,
    queue_type: type[asyncio.Queue[aiomqtt.Message]] | None = None,
) -> aiomqtt.Client:
    """A fresh client for one connection attempt (aiomqtt clients are not reusable after a failure).
    ``max_queued_in`` bounds aiomqtt's own incoming queue; ``queue_type`` replaces it (a counting queue, say)."""
    tls = settings.tls
    options: dict[str, Any] = {} if queue_type is None else {"queue_type": queue_type}
    return aiomqtt.Client(
        hostname=settings.host,
        port=settings.port,
        identifier=settings.client_id,
        username=settings.username,
        password=settings.password,
        tls_context=tls_context(tls) if tls else None,
        tls_insecure=tls.insecure if tls else None,
        keepalive=settings.keepalive_s,
        timeout=settings.timeout_s,
        will=will,
        max_queued_incoming_messages=max_queued_in,
        **options,
    )


READ_CHUNK = 1 << 16  # bytes read from the socket at a time while receiving
READS_PER_WAKEUP = 4  # chunks read before the event loop gets its turn (a burst must not starve the engine)


class BufferedSocket:
    """A connected socket read in chunks of READ_CHUNK bytes. paho reads each packet in three ``recv`` calls (its
    type, its length, its body): three system calls per message. Served from one read, a burst of small
    messages costs a few calls per chunk instead.

    ``pending()`` (bytes read and not yet handed out) makes the reader drain a chunk in one wake-up, as it does
    for TLS. After READS_PER_WAKEUP chunks in one drain the next read reports "would block" (paho keeps the
    partial packet): the reader returns, other tasks run, and the socket, still readable, wakes it again.
    Everything else is the socket's."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._buf = b""
        self._pos = 0
        self._reads = 0  # chunks read in this drain

    def recv(self, bufsize: int) -> bytes:
        if self._pos >= len(self._buf):
            if self._reads >= READS_PER_WAKEUP:
                self._reads = 0
                raise BlockingIOError("streamcorr: the event loop's turn")
            self._buf, self._pos = self._sock.recv(READ_CHUNK), 0  # BlockingIOError / SSLWantReadError pass on
            self._reads += 1
        out: bytes = self._buf[self._pos : self._pos + bufsize]
        self._pos += len(out)
        return out

    def pending(self) -> int:
        inner = int(self._sock.pending()) if hasattr(self._sock, "pending") else 0
        left = len(self._buf) - self._pos + inner
        if left == 0:
            self._reads = 0  # the drain ends here
        return left

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


RMEM_MAX = Path("/proc/sys/net/core/rmem_max")


def rmem_max() -> int | None:
    """The kernel's net.core.rmem_max in bytes (the largest receive buffer a process may fix), None if unknown."""
    try:
        return int(RMEM_MAX.read_text())
    except (OSError, ValueError):
        return None


def _fixable(size: int) -> tuple[bool, int | None]:
    """Whether ``size`` bytes can be fixed as the receive buffer, and net.core.rmem_max (None if unknown): not
    above rmem_max, since a fixed buffer of that cap holds less than the kernel's auto-tuning grows to."""
    cap = rmem_max()
    return size > 0 and (cap is None or size <= cap), cap


def describe_receive_buffer(size: int) -> str:
    """What ``receive_buffer_bytes`` gives on this machine, for ``streamcorr check``."""
    fixed, cap = _fixable(size)
    if fixed:
        return f"{size:,} bytes, fixed"
    if size == 0:
        return "auto-tuned by the kernel"
    return f"auto-tuned by the kernel ({size:,} bytes asked for is above net.core.rmem_max, {cap:,})"


def receive_buffer_plan(size: int, name: str) -> int:
    """The receive buffer to fix for ``size`` bytes asked for: ``size``, or 0 (the kernel's auto-tuned buffer)
    where it is above net.core.rmem_max, logged once, naming the source."""
    fixed, cap = _fixable(size)
    if not fixed and size > 0:
        _log.info("%s: receive_buffer_bytes %d is above net.core.rmem_max (%d): the kernel's auto-tuned receive "
                  "buffer is used (raise rmem_max to fix %d bytes)", name, size, cap, size)  # fmt: skip
    return size if fixed else 0


def _set_receive_buffer(sock: Any, size: int) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
    except (OSError, AttributeError) as exc:
        _log.info("MQTT: cannot set the receive buffer to %d bytes (%s); the kernel's own is used", size, exc)


def take_messages(
    client: aiomqtt.Client, on_message: Callable[[str | None, bytes], None], *, receive_buffer_bytes: int = 0
) -> None:
    """Before connecting: hand each received message's topic (None where it is not UTF-8) and payload straight to
    ``on_message`` (called in the event loop's thread), and read the socket in chunks (:class:`BufferedSocket`).

    aiomqtt's own path (a Message object, a queue and a task switch per message), paho's three reads per packet
    and its per-topic callback matching were most of what a small message cost the MQTT source, which takes
    messages here instead (bench.mqtt_burst: CPU per message taken). ``client.messages`` then yields nothing
    and, iterated, still raises MqttError when the connection is lost. Relies on aiomqtt 2's paho client
    (``client._client``), on paho 2 keeping its socket in ``_sock`` and handing each message to
    ``_handle_on_message``; RuntimeError if they are not there (pyproject pins both majors).
    ``receive_buffer_bytes`` > 0 fixes the socket's receive buffer (SO_RCVBUF; see :func:`receive_buffer_plan`)."""
    inner = getattr(client, "_client", None)
    if not isinstance(inner, paho.Client) or not hasattr(inner, "_sock") or not hasattr(inner, "_handle_on_message"):
        raise RuntimeError("this aiomqtt or paho-mqtt is not the one streamcorr was built for (aiomqtt 2, paho 2)")
    opened = inner.on_socket_open

    def on_socket_open(paho_client: paho.Client, userdata: Any, sock: Any) -> None:
        if receive_buffer_bytes > 0:
            _set_receive_buffer(sock, receive_buffer_bytes)
        paho_client._sock = BufferedSocket(sock)
        if opened is not None:
            opened(paho_client, userdata, sock)

    def handle_message(message: paho.MQTTMessage) -> None:
        try:
            topic: str | None = message.topic
        except UnicodeDecodeError:  # a broker that passes on a topic that is not UTF-8
            topic = None
        on_message(topic, bytes(message.payload))  # bytes already: no copy

    inner.on_socket_open = on_socket_open
    inner._handle_on_message = handle_message  # type: ignore[method-assign]  # no per-topic callbacks: no matching


def jittered_backoff(min_s: float, max_s: float, rng: random.Random | None = None) -> Iterator[float]:
    """Delays before reconnect attempts: exponential up to max_s, each drawn uniformly in [d/2, d].

    >>> delays = jittered_backoff(1.0, 4.0, random.Random(0))
    >>> [0.5 <= next(delays) <= 1.0, 1.0 <= next(delays) <= 2.0, 2.0 <= next(delays) <= 4.0, next(delays) <= 4.0]
    [True, True, True, True]
    """
    rng = rng or random.Random()
    delay = min_s
    while True:
        yield rng.uniform(delay / 2, delay)
        delay = min(max_s, delay * 2)


async def keep_connected(
    settings: MqttConnection,
    session: Session,
    *,
    counters: ConnectionCounters,
    log: logging.Logger,
    name: str,
    new_client: Callable[[], aiomqtt.Client] | None = None,
    retry: tuple[type[Exception], ...] = (aiomqtt.MqttError, OSError),
    wake: asyncio.Event | None = None,
) -> None:
    """Connect, run ``session(client)``, and reconnect after each failure or loss, until cancelled.

    Returns once ``session`` returns (the caller's goodbye: the client then disconnects cleanly). ``new_client``
    makes each attempt's client (default: ``make_client(settings)``). Exceptions in ``retry`` are counted and
    retried; those beyond MqttError and OSError are bugs, logged with their traceback; any other propagates.
    ``wake``: while it is not set, setting it cuts the wait before the next attempt short.
    ``name`` starts the log lines ("MQTT source", say). Raises ConfigError (before connecting) for TLS files that
    cannot be used.
    """
    check_tls(settings)
    warn = RateLimitedLog(log)
    where = f"{settings.host}:{settings.port}"
    delays = jittered_backoff(settings.reconnect_min_s, settings.reconnect_max_s)
    while True:
        up = False
        try:
            async with (new_client or (lambda: make_client(settings)))() as client:
                up = True
                counters.connects += 1
                delays = jittered_backoff(settings.reconnect_min_s, settings.reconnect_max_s)  # healthy: start low
                await session(client)
            counters.disconnects += 1
            return
        except retry as exc:
            if not isinstance(exc, aiomqtt.MqttError | OSError):
                warn(logging.ERROR, "bug", "%s failed on %s; reconnecting", name, where, exc_info=True)
            if up:
                counters.disconnects += 1
                warn.warning("lost", "%s lost %s: %s; reconnecting", name, where, exc)
            else:
                counters.connect_failures += 1
                warn.warning("connect", "%s cannot connect to %s: %s; retrying%s", name, where, exc, broker_hint(exc))
        delay = next(delays)
        if wake is None or wake.is_set():
            await asyncio.sleep(delay)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), delay)
