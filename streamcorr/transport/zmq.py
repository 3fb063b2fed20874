"""ZeroMQ plumbing shared by ``ZmqSource``, ``ZmqPublisher`` and the Subscriber: endpoint checks, sockets whose
limits are set before they are used, and bind / connect errors that name the endpoint.

Every socket made here has ``LINGER`` 0: closing never waits for a peer (a sink that wants its last message to
leave closes with its own linger).
"""

from __future__ import annotations

from typing import Any, TypeVar

import zmq
import zmq.asyncio

from ..errors import ConfigError

__all__ = ["SCHEMES", "attach", "check_endpoint", "make_socket", "make_sync_socket"]

_S = TypeVar("_S", bound="zmq.Socket[Any]")

SCHEMES = ("tcp://", "ipc://", "inproc://")
_SENDERS = (zmq.PUB, zmq.XPUB, zmq.PUSH)  # their high-water mark is on the send side


def check_endpoint(endpoint: object, key: str = "endpoint") -> str:
    """``endpoint`` if it is a ZeroMQ endpoint string; ConfigError naming ``key`` otherwise.

    >>> check_endpoint("127.0.0.1:5556")
    Traceback (most recent call last):
    ...
    streamcorr.errors.ConfigError: endpoint must start with tcp://, ipc:// or inproc://; got '127.0.0.1:5556'
    """
    if not (isinstance(endpoint, str) and endpoint.startswith(SCHEMES)):
        raise ConfigError(f"{key} must start with {', '.join(SCHEMES[:-1])} or {SCHEMES[-1]}; got {endpoint!r}")
    return endpoint


def make_socket(
    ctx: zmq.asyncio.Context, kind: int, *, hwm: int | None = None, max_message_bytes: int | None = None
) -> zmq.asyncio.Socket:
    """A socket of ``kind`` with linger 0, its high-water mark (messages; SNDHWM for PUB and PUSH, RCVHWM for the
    others) and the largest message it accepts from a peer (``MAXMSGSIZE``: libzmq drops a peer that sends more)."""
    return _limited(ctx.socket(kind), kind, hwm, max_message_bytes)


def make_sync_socket(
    ctx: zmq.asyncio.Context, kind: int, *, hwm: int | None = None, max_message_bytes: int | None = None
) -> zmq.Socket[bytes]:
    """As :func:`make_socket`, with pyzmq's plain (blocking) API on the same context and I/O threads: for a
    socket used only with ``NOBLOCK`` from the event loop, whose send must return its ``MessageTracker`` and
    whose receive queue is drained synchronously (no future waits on it)."""
    plain: zmq.Context[zmq.Socket[bytes]] = zmq.Context.shadow(ctx.underlying)  # never terminates ctx
    return _limited(plain.socket(kind), kind, hwm, max_message_bytes)


def _limited(sock: _S, kind: int, hwm: int | None, max_message_bytes: int | None) -> _S:
    sock.setsockopt(zmq.LINGER, 0)
    if hwm is not None:
        sock.setsockopt(zmq.SNDHWM if kind in _SENDERS else zmq.RCVHWM, hwm)
    if max_message_bytes is not None:
        sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    return sock


def attach(sock: zmq.Socket[Any], endpoint: str, *, bind: bool, what: str) -> str:
    """Bind or connect ``sock``; returns the endpoint bound (a ``*`` port resolved) or connected to. A ZeroMQ
    error (a port in use, a host that cannot be resolved) is a ConfigError naming ``what`` and the endpoint."""
    try:
        if bind:
            sock.bind(endpoint)
            return sock.getsockopt_string(zmq.LAST_ENDPOINT)
        sock.connect(endpoint)
        return endpoint
    except zmq.ZMQError as exc:
        raise ConfigError(f"cannot {'bind' if bind else 'connect'} to {endpoint} ({what}): {exc}") from exc
