"""sd_notify over a real Unix datagram socket: what a Type=notify unit receives, and nothing outside one."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from streamcorr.daemon.systemd import SystemdNotifier


@pytest.fixture
def notify_socket(tmp_path):
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(2.0)
        yield path, sock


def test_ready_stopping_and_extend_arrive_as_systemd_reads_them(notify_socket):
    """Each call is one datagram of newline-separated KEY=value fields."""
    path, sock = notify_socket
    n = SystemdNotifier({"NOTIFY_SOCKET": path})
    n.ready("running: 1 source(s)")
    n.extend_start(2.5, "measuring")
    n.stopping()
    got = [sock.recv(4096).decode().split("\n") for _ in range(3)]
    assert got == [["READY=1", "STATUS=running: 1 source(s)"], ["EXTEND_TIMEOUT_USEC=2500000", "STATUS=measuring"],
                   ["STOPPING=1", "STATUS=shutting down"]]  # fmt: skip


def test_the_watchdog_pings_at_half_its_interval_only_in_its_own_process(notify_socket):
    """WATCHDOG_USEC sets the ping interval; a WATCHDOG_PID of another process turns the watchdog off."""
    path, sock = notify_socket
    mine = SystemdNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid())})
    assert mine.watchdog_s == 0.2
    assert SystemdNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"}).watchdog_s is None

    async def run() -> None:
        task = asyncio.create_task(mine.watchdog())
        await asyncio.sleep(0.35)  # pings at 0, 0.1, 0.2, 0.3 s
        task.cancel()

    asyncio.run(run())
    pings = 0
    sock.settimeout(0.1)
    while True:
        try:
            pings += sock.recv(4096) == b"WATCHDOG=1"
        except TimeoutError:
            break
    assert 3 <= pings <= 5


def test_outside_a_unit_nothing_is_sent_and_a_gone_socket_warns_once(tmp_path, caplog):
    """Without NOTIFY_SOCKET every call is a no-op; an unreachable socket is logged once and never raises."""
    SystemdNotifier({}).ready("x")
    n = SystemdNotifier({"NOTIFY_SOCKET": str(tmp_path / "absent")})
    n.ready("x")
    n.stopping()
    assert sum("cannot notify systemd" in r.getMessage() for r in caplog.records) == 1
