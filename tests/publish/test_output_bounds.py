"""Outputs bounded in bytes per client (issue 29): ZeroMQ subscribers and web clients that never read cost at
most the configured bytes each, what they miss is counted (in the sink's counters and on the daemon's /metrics),
and the memory comes back when they leave. Real sockets throughout; the ZeroMQ publisher runs in a process of
its own so that its RSS is measured alone."""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import zmq
import zmq.asyncio
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from streamcorr.engine.changes import ChangeEvent
from streamcorr.engine.matrix import Snapshot
from streamcorr.publish.envelope import decode_message, encode_snapshot
from streamcorr.publish.web import WebView
from streamcorr.publish.zmq_sink import HOUSEKEEPING_S, ZmqPublisher

MIB = 1 << 20
N_CHANNELS = 256  # the found case: a 256-channel snapshot is about 1.1 MiB on the wire
N_SNAPSHOTS = 60
STUCK = 3  # subscribers that never read


def _snapshot(n: int, seed: int) -> Snapshot:
    rng = np.random.default_rng(seed)
    mi = rng.random((n, n))
    mi = (mi + mi.T) / 2
    return Snapshot(1, 1_000_000_000, time.time_ns(), tuple(f"ch{k:03d}" for k in range(n)), mi,
                    rng.random((n, n)) * 10, np.ones((n, n)), source=np.ones((n, n), np.uint8),
                    dependent=mi > 0.9, n_eff=np.full((n, n), 200.0))  # fmt: skip


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _stats(pub: ZmqPublisher, base_rss: int) -> dict[str, Any]:
    return {"rss_growth": _rss_bytes() - base_rss, "dropped": pub.counters.dropped["snapshot"], "hwm": pub.hwm,
            "sent": pub.counters.sent["snapshot"], **pub.counters.extra}  # fmt: skip


async def _publish(conn: Connection, max_queue_bytes: int) -> None:
    snap = _snapshot(N_CHANNELS, 29)
    encode_snapshot(snap, seq=1)  # the encoder's first use, before the baseline
    async with ZmqPublisher(endpoint="tcp://127.0.0.1:*", snapshot_endpoint=None, prefix="b",
                            max_queue_bytes=max_queue_bytes) as pub:  # fmt: skip
        await pub.publish_snapshot(snap)  # the first large snapshot sets the mark (a fresh socket), before anyone joins
        base = _rss_bytes()
        conn.send(pub.endpoint)
        deadline = time.monotonic() + 30
        while pub.counters.extra["subscriptions"] < STUCK and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for k in range(N_SNAPSHOTS):
            await pub.publish_snapshot(dataclasses.replace(snap, seq=k + 1))
            await asyncio.sleep(0.005)
        await asyncio.sleep(2 * HOUSEKEEPING_S)  # the gauges refreshed
        conn.send(_stats(pub, base))
        conn.recv()  # the subscribers have left
        await asyncio.sleep(5 * HOUSEKEEPING_S)  # their notices read, their queues freed, the heap trimmed
        deadline = time.monotonic() + 20  # on a loaded machine (a parallel test run) the trim can come later
        while _stats(pub, base)["rss_growth"] >= 16 * MIB and time.monotonic() < deadline:
            await asyncio.sleep(HOUSEKEEPING_S)
        conn.send(_stats(pub, base))


def _publisher(conn: Connection, max_queue_bytes: int) -> None:
    asyncio.run(_publish(conn, max_queue_bytes))


@contextmanager
def _publisher_process(max_queue_bytes: int) -> Iterator[tuple[Connection, str]]:
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    proc = multiprocessing.get_context("spawn").Process(target=_publisher, args=(theirs, max_queue_bytes))
    proc.start()
    try:
        assert ours.poll(60), "the publisher process did not start"
        yield ours, ours.recv()
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


def _stuck_subscriber(ctx: zmq.Context[Any], endpoint: str) -> zmq.Socket[Any]:
    """A SUB socket that holds one message itself and a few KiB in the kernel, and is never read."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 1)
    sub.setsockopt(zmq.RCVBUF, 4096)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"b/snapshot")
    return sub


def _with_stuck_subscribers(max_queue_bytes: int) -> tuple[dict[str, Any], dict[str, Any], int]:
    """Run the publisher against three stuck subscribers: (its stats while they are stuck, after they left, the
    snapshots the first one received when it finally read)."""
    ctx: zmq.Context[Any] = zmq.Context()
    with _publisher_process(max_queue_bytes) as (conn, endpoint):
        subs = [_stuck_subscriber(ctx, endpoint) for _ in range(STUCK)]
        assert conn.poll(120), "the publisher did not report"
        stuck = conn.recv()
        seqs = []
        while subs[0].poll(1000):  # what reached the first one: from its queues, the kernel's and the publisher's
            seqs.append(decode_message(subs[0].recv_multipart()[1]).seq)
        assert seqs == sorted(set(seqs))
        for sub in subs:
            sub.close()
        conn.send("left")
        assert conn.poll(60)
        left = conn.recv()
    ctx.term()
    return stuck, left, len(seqs)


def test_stuck_zmq_subscribers_cost_at_most_the_byte_bound_and_what_they_miss_is_counted() -> None:
    """Three SUB clients that never read 60 snapshots of 256 channels: libzmq holds at most max_queue_bytes per
    subscriber, RSS grows by no more than that (plus the encoder's working memory), and the snapshot drops are
    counted: never more than a subscriber missed, at most the high-water mark fewer."""
    budget = 4 * MIB
    stuck, left, received = _with_stuck_subscribers(budget)
    assert stuck["sent"] == N_SNAPSHOTS + 1 and 1 <= stuck["hwm"] <= budget // MIB  # and one before they joined
    assert 0 < stuck["queued_bytes"] <= STUCK * budget
    assert stuck["rss_growth"] < STUCK * budget + 24 * MIB  # before the fix: all 60 held, about 70 MiB
    missed = N_SNAPSHOTS - received
    assert stuck["dropped"] <= missed <= stuck["dropped"] + stuck["hwm"] + 1, (stuck, received)
    assert left["queued_bytes"] == 0 and left["subscriptions"] == 0


def test_memory_comes_back_when_stuck_zmq_subscribers_leave() -> None:
    """With a budget large enough to hold all 60 snapshots (about 70 MiB), the publisher's RSS returns to within
    16 MiB of where it started once the stuck subscribers disconnect."""
    stuck, left, _ = _with_stuck_subscribers(256 * MIB)
    assert stuck["queued_bytes"] > 50 * MIB and stuck["rss_growth"] > 50 * MIB  # something to give back
    assert left["queued_bytes"] == 0
    assert left["rss_growth"] < 16 * MIB, (stuck, left)  # before the fix: the peak stayed


def test_zmq_drops_and_queued_bytes_are_on_the_daemons_metrics() -> None:
    """The daemon's /metrics shows a stuck subscriber's drops as streamcorr_output_dropped{output="zmq"} and the
    bytes libzmq holds, the subscriptions and the high-water mark as streamcorr_zmq_* gauges."""
    from streamcorr.config import parse_config
    from streamcorr.daemon.service import Daemon  # here: the publisher processes import this module, and need no torch

    cfg = parse_config({
        "version": 1,
        "sources": [{"type": "zmq", "endpoint": "inproc://unused-source", "mode": "pull", "bind": True}],
        "outputs": {"zmq": {"endpoint": "tcp://127.0.0.1:*", "snapshot_endpoint": None, "prefix": "b",
                            "max_queue_bytes": 2 * MIB}},
        "http": {"enabled": False},
    })  # fmt: skip
    daemon = Daemon(cfg)
    snap = _snapshot(N_CHANNELS, 30)

    async def main() -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float], ZmqPublisher]:
        sink = next(guard.sink for guard in daemon.outputs if guard.name == "zmq")
        assert isinstance(sink, ZmqPublisher)
        ctx: zmq.Context[Any] = zmq.Context()
        await sink.start()
        try:
            # the first large snapshot sets the mark (binding anew: the "online" status already left)
            await sink.publish_snapshot(dataclasses.replace(snap, seq=1))
            sub = _stuck_subscriber(ctx, sink.endpoint)
            while sink.counters.extra["subscriptions"] < 1:
                await asyncio.sleep(0.05)
            # the kernel's socket buffers take a stuck subscriber's first messages (up to tcp_rmem + tcp_wmem, tens of
            # MiB where they auto-tune), libzmq holds what comes after: publish in rounds until it holds some
            for k in range(120):
                await sink.publish_snapshot(dataclasses.replace(snap, seq=k + 2))
                if k % 20 < 19:
                    continue
                await asyncio.sleep(2 * HOUSEKEEPING_S)
                for _ in range(100):  # a loaded machine may run housekeeping late: wait for it, up to 5 s more
                    if sink.counters.extra["queued_bytes"] > 0:
                        break
                    await asyncio.sleep(0.05)
                if sink.counters.extra["queued_bytes"] > 0:
                    break
            text = generate_latest(daemon.registry).decode()
            sub.close()
        finally:
            await sink.stop()
            ctx.term()
        values = {(s.name, tuple(sorted(s.labels.items()))): s.value
                  for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip
        return values, sink

    values, sink = asyncio.run(main())
    dropped = values["streamcorr_output_dropped_total", (("output", "zmq"), ("stream", "snapshot"))]
    assert dropped == sink.counters.dropped["snapshot"] >= 10
    largest = len(encode_snapshot(snap, seq=21)) + len(b"b/snapshot")
    assert 0 < values["streamcorr_zmq_queued_bytes", ()] <= max(2 * MIB, 2 * largest)  # the documented bound
    assert values["streamcorr_zmq_subscriptions", ()] == 1
    assert values["streamcorr_zmq_queue_limit_messages", ()] == 1  # 2 MiB // 1.1 MiB - 1


async def _stalled_websocket(port: int) -> socket.socket:
    """A WebSocket client that completes the handshake and then never reads (a few KiB of kernel buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    request = (f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")  # fmt: skip
    await loop.sock_sendall(sock, request.encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += await asyncio.wait_for(loop.sock_recv(sock, 1), 5)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def test_a_stalled_web_client_is_bounded_in_bytes_and_its_drops_are_counted() -> None:
    """A web client that stops reading holds at most max_queue_bytes (the frame being written included):
    snapshots are replaced by the newest, the oldest events dropped, every drop counted; when it leaves its
    bytes are freed."""
    budget = 16 * 1024
    rng = np.random.default_rng(31)
    n_events = 2000

    async def main() -> tuple[int, dict[str, int], dict[str, int], dict[str, int], int]:
        async with WebView(port=0, max_queue_bytes=budget) as view:
            sock = await _stalled_websocket(view.port)
            peak = 0
            for k in range(n_events):
                if k % 20 == 0:
                    await view.publish_snapshot(_snapshot(8, int(rng.integers(1 << 30))))
                await view.publish_event(ChangeEvent(("ch000", "ch001"), 0.1, 0.9, k, "became-dependent"))
                peak = max(peak, view.counters_dict()["queued_bytes"])
                await asyncio.sleep(0)  # the sender writes until the kernel's buffers are full, then waits
            stalled = view.counters_dict()
            sock.close()  # unread data: the server sees a reset
            for _ in range(100):
                if view.counters_dict()["clients"] == 0:
                    break
                await asyncio.sleep(0.05)
            return peak, stalled, view.counters_dict(), dict(view.counters.sent), view.queue_depth

    peak, stalled, left, sent, depth = asyncio.run(asyncio.wait_for(main(), 30))
    assert 0 < peak <= budget
    assert stalled["events_dropped"] > n_events // 2 and stalled["snapshots_dropped"] > 0
    assert sent["event"] + stalled["events_dropped"] <= n_events
    assert left["clients"] == 0 and left["queued_bytes"] == 0 and depth == 0


def test_a_reading_subscriber_keeps_receiving_when_snapshots_grow_past_the_bound() -> None:
    """A subscriber that joined while the matrix was small still receives snapshots after they grow so large that
    the queue mark must come down (the sink binds anew; before, its queue stopped for good)."""

    async def main() -> tuple[list[int], float]:
        small, large = _snapshot(2, 41), _snapshot(N_CHANNELS, 42)
        ctx = zmq.asyncio.Context()
        async with ZmqPublisher(endpoint="tcp://127.0.0.1:*", snapshot_endpoint=None, prefix="g",
                                max_queue_bytes=4 * MIB, context=ctx) as pub:  # fmt: skip
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.connect(pub.endpoint)
            sub.setsockopt(zmq.SUBSCRIBE, b"g/snapshot")
            seqs: list[int] = []

            async def read() -> None:
                while True:
                    seqs.append(decode_message((await sub.recv_multipart())[1]).seq)

            reader = asyncio.create_task(read())
            seq = 0
            while not seqs:  # the subscription has arrived and small snapshots flow
                seq += 1
                await pub.publish_snapshot(dataclasses.replace(small, seq=seq))
                await asyncio.sleep(0.05)
            grown_at = seq + 1
            for _ in range(20):
                seq += 1
                await pub.publish_snapshot(dataclasses.replace(large, seq=seq))
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)
            reader.cancel()
            sub.close()
            rebinds = pub.counters.extra["rebinds"]
        ctx.term()
        return [s for s in seqs if s >= grown_at], rebinds

    after, rebinds = asyncio.run(main())
    assert rebinds == 1
    assert len(after) >= 15, after  # all but those sent while the subscriber reconnected


def test_a_growing_matrix_binds_anew_a_few_times_not_once_per_channel() -> None:
    """Snapshots that grow one channel at a time from 2 to 160 lower the mark about ten times (it only halves),
    not once per channel, and the mark always keeps the queue within the byte budget."""

    async def main() -> tuple[float, list[tuple[int, int]]]:
        marks = []
        async with ZmqPublisher(endpoint="tcp://127.0.0.1:*", snapshot_endpoint=None, prefix="m",
                                max_queue_bytes=8 * MIB) as pub:  # fmt: skip
            for n in range(2, 161):
                snap = _snapshot(n, n)
                await pub.publish_snapshot(snap)
                marks.append((len(encode_snapshot(snap, seq=1)) + len(b"m/snapshot"), pub.hwm))
            return pub.counters.extra["rebinds"], marks

    rebinds, marks = asyncio.run(main())
    assert 1 <= rebinds <= 10, rebinds
    assert all(hwm * size <= 8 * MIB for size, hwm in marks)
