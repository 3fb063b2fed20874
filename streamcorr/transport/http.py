"""Bounds on the daemon's HTTP listener that aiohttp does not enforce itself.

* At most ``max_connections`` connections are open at once; one more is accepted and closed at once
  (``rejected``), so a flood of sockets cannot exhaust the process's file descriptors.
* A connection must complete its request headers within ``header_timeout_s`` of opening, and again
  within ``header_timeout_s`` after each response (keep-alive); otherwise it is closed
  (``header_timeouts``). A half-sent request therefore holds a descriptor for at most that long.
  A request being handled (a WebSocket included) is not timed.

>>> guard = HttpGuard(max_connections=2, header_timeout_s=5.0)
>>> guard.counters()
{'open': 0, 'accepted': 0, 'rejected': 0, 'header_timeouts': 0}
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..errors import ConfigError
from ..logutil import RateLimitedLog

__all__ = ["HttpGuard"]

log = logging.getLogger("streamcorr.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _Guarded(asyncio.Protocol):
    """Forwards every protocol call to aiohttp's handler, adding the connection count and the header timer."""

    def __init__(self, inner: Any, guard: HttpGuard) -> None:
        self.inner, self.guard = inner, guard
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.started = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        g = self.guard
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if g.open >= g.max_connections:
            g.rejected += 1
            g.warn.warning("full", "http: %d connections open (http.max_connections); closing a new one", g.open)
            transport.abort()
            return
        g.open += 1
        g.accepted += 1
        g.by_transport[transport] = self
        self.started = True
        self.arm()
        self.inner.connection_made(transport)

    def arm(self) -> None:
        self.disarm()
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.guard.header_timeout_s, self._expire)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self) -> None:
        self.timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.guard.header_timeouts += 1
            self.guard.warn.warning(
                "timeout", "http: no complete request within %.1f s (http.header_timeout_s); closing",
                self.guard.header_timeout_s,
            )  # fmt: skip
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.started:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.started else None

    def pause_writing(self) -> None:
        if self.started:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.started:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        if not self.started:
            return
        self.started = False
        self.guard.open -= 1
        if self.transport is not None:
            self.guard.by_transport.pop(self.transport, None)
        self.inner.connection_lost(exc)


class HttpGuard:
    """A protocol factory around an aiohttp ``web.Server`` plus the middleware that times request headers."""

    def __init__(self, *, max_connections: int = 256, header_timeout_s: float = 10.0) -> None:
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
            raise ConfigError(f"max_connections must be a positive number; got {max_connections!r}")
        if not header_timeout_s > 0:
            raise ConfigError(f"header_timeout_s must be > 0 seconds; got {header_timeout_s!r}")
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.open = 0
        self.accepted = 0
        self.rejected = 0
        self.header_timeouts = 0
        self.by_transport: dict[asyncio.Transport, _Guarded] = {}
        self.warn = RateLimitedLog(log)
        self._server: asyncio.base_events.Server | None = None

    def counters(self) -> dict[str, int]:
        return {
            "open": self.open,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "header_timeouts": self.header_timeouts,
        }

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        guarded = self.by_transport.get(request.transport) if request.transport is not None else None
        if guarded is not None:
            guarded.disarm()  # the headers are in: the handler's own time is not limited here
        try:
            return await handler(request)
        finally:
            if guarded is not None and guarded.started:
                guarded.arm()  # the next request's headers must come within the timeout too

    async def listen(self, server: web.Server, host: str, port: int) -> int:
        """Serve ``server`` on host:port through the guard; returns the port bound (``port=0``: a free one)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Guarded(server(), self), host, port, reuse_address=True)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for g in list(self.by_transport.values()):
                if g.transport is not None:
                    g.transport.abort()
            self._server = None
