"""sd_notify(3) for a ``Type=notify`` systemd unit (examples/streamcorr.service), without libsystemd."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping

__all__ = ["SystemdNotifier"]

log = logging.getLogger("streamcorr.daemon.service")


class SystemdNotifier:
    """sd_notify(3) for a ``Type=notify`` unit (examples/streamcorr.service), without libsystemd: ``ready()`` once
    running, ``stopping()`` at shutdown, ``extend_start(s)`` while a first start measures its calibration, and
    ``watchdog()``, a task that pings from the event loop every half ``WatchdogSec`` so that systemd restarts a
    daemon whose loop stalls. Outside such a unit (no ``NOTIFY_SOCKET``) every call does nothing."""

    def __init__(self, environ: Mapping[str, str] = os.environ) -> None:
        addr = environ.get("NOTIFY_SOCKET", "")
        self.addr = "\0" + addr[1:] if addr.startswith("@") else addr  # "@name": the abstract namespace
        usec, pid = environ.get("WATCHDOG_USEC", ""), environ.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())  # a child that inherited the variables must not ping
        self.watchdog_s = int(usec) / 1e6 if usec.isdigit() and int(usec) > 0 and mine else None
        self._warned = False

    def send(self, *fields: str) -> None:
        if not self.addr:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self.addr)
                sock.sendall("\n".join(fields).encode())
        except OSError as exc:
            if not self._warned:  # systemd gone or the socket unreachable: the service runs on regardless
                self._warned = True
                log.warning("cannot notify systemd at NOTIFY_SOCKET=%s: %s", self.addr, exc.strerror or exc)

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=shutting down")

    def extend_start(self, s: float, status: str) -> None:
        """Give a start that is making progress ``s`` more seconds beyond TimeoutStartSec."""
        self.send(f"EXTEND_TIMEOUT_USEC={int(s * 1e6)}", f"STATUS={status}")

    async def watchdog(self) -> None:
        if self.watchdog_s is None:
            return
        while True:
            self.send("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_s / 2)
