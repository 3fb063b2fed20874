"""streamcorr.transport: the one MQTT reconnecting loop (against Mosquitto and a closed port) and the ZeroMQ
socket plumbing shared by the sources, the sinks and the Subscriber."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import socket

import aiomqtt
import numpy as np
import pytest
import zmq
import zmq.asyncio
from pydantic import ValidationError

from streamcorr.config import MqttConnection, MqttSourceConfig, Tls
from streamcorr.errors import ConfigError
from streamcorr.ingest.source import IngestCounters
from streamcorr.transport import mqtt as mqtt_transport
from streamcorr.transport.mqtt import (
    READ_CHUNK,
    READS_PER_WAKEUP,
    BufferedSocket,
    check_settings,
    jittered_backoff,
    keep_connected,
    receive_buffer_plan,
)
from streamcorr.transport.zmq import attach, check_endpoint, make_socket
from tests.brokers import free_port, until

log = logging.getLogger("tests.transport")


def test_jittered_backoff_doubles_up_to_its_ceiling_with_jitter_in_the_upper_half():
    """Each delay lies in [d/2, d] for d = min_s, 2 min_s, ... capped at max_s."""
    np.random.default_rng(70)
    delays = jittered_backoff(0.1, 1.0, random.Random(70))
    got = [next(delays) for _ in range(8)]
    for k, d in enumerate(got):
        ceiling = min(1.0, 0.1 * 2**k)
        assert ceiling / 2 <= d <= ceiling


def test_keep_connected_counts_each_failed_attempt_and_retries_until_cancelled():
    """With nothing listening, every attempt is a connect failure; the loop only ends when cancelled."""
    np.random.default_rng(71)
    settings = MqttConnection(port=free_port(), reconnect_min_s=0.01, reconnect_max_s=0.02, timeout_s=1)
    counters = IngestCounters()

    async def session(client: aiomqtt.Client) -> None:
        raise AssertionError("never connected")

    async def main() -> None:
        task = asyncio.create_task(keep_connected(settings, session, counters=counters, log=log, name="test"))
        await until(lambda: counters.connect_failures >= 3)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert counters.connects == 0 and counters.disconnects == 0


def test_keep_connected_returns_when_the_session_says_goodbye(mqtt_broker):
    """A session that returns ends the loop after a clean disconnect, counted once each way."""
    np.random.default_rng(72)
    settings = MqttConnection(host=mqtt_broker[0], port=mqtt_broker[1])
    counters = IngestCounters()
    sessions: list[aiomqtt.Client] = []

    async def session(client: aiomqtt.Client) -> None:
        sessions.append(client)

    asyncio.run(asyncio.wait_for(keep_connected(settings, session, counters=counters, log=log, name="test"), 10))
    assert len(sessions) == 1 and (counters.connects, counters.disconnects, counters.connect_failures) == (1, 1, 0)


def test_keep_connected_retries_a_lost_session_with_a_fresh_client(mqtt_broker):
    """A session that fails with MqttError is a lost connection: counted, then a new client connects."""
    np.random.default_rng(73)
    settings = MqttConnection(host=mqtt_broker[0], port=mqtt_broker[1], reconnect_min_s=0.01, reconnect_max_s=0.02)
    counters = IngestCounters()
    clients: list[aiomqtt.Client] = []

    async def session(client: aiomqtt.Client) -> None:
        clients.append(client)
        if len(clients) < 3:
            raise aiomqtt.MqttError("gone")

    asyncio.run(asyncio.wait_for(keep_connected(settings, session, counters=counters, log=log, name="test"), 10))
    assert len({id(c) for c in clients}) == 3
    assert (counters.connects, counters.disconnects, counters.connect_failures) == (3, 3, 0)


def test_unusable_tls_files_and_wrong_settings_are_config_errors(tmp_path):
    """A CA file that does not exist stops the loop before it connects; settings must be an MqttConnection."""
    np.random.default_rng(74)
    settings = MqttConnection(port=free_port(), tls=Tls(ca_file=str(tmp_path / "missing.crt")))
    counters = IngestCounters()

    async def session(client: aiomqtt.Client) -> None:
        raise AssertionError("never connected")

    with pytest.raises(ConfigError, match="tls"):
        asyncio.run(keep_connected(settings, session, counters=counters, log=log, name="test"))
    assert counters.connect_failures == 0
    with pytest.raises(ConfigError, match="MqttConnection"):
        check_settings({"host": "127.0.0.1"})


def test_zmq_plumbing_checks_endpoints_sets_limits_and_names_what_cannot_bind():
    """Endpoints need a ZeroMQ scheme; sockets get linger 0 and their limits; a second bind names the endpoint."""
    np.random.default_rng(75)
    with pytest.raises(ConfigError, match="snapshot_endpoint must start with"):
        check_endpoint("127.0.0.1:5557", "snapshot_endpoint")
    ctx = zmq.asyncio.Context()
    try:
        sub = make_socket(ctx, zmq.SUB, hwm=7, max_message_bytes=1000)
        pub = make_socket(ctx, zmq.PUB, hwm=9)
        assert (sub.getsockopt(zmq.RCVHWM), sub.getsockopt(zmq.MAXMSGSIZE), sub.getsockopt(zmq.LINGER)) == (7, 1000, 0)
        assert pub.getsockopt(zmq.SNDHWM) == 9
        where = attach(pub, "tcp://127.0.0.1:*", bind=True, what="test publisher")
        assert where.startswith("tcp://127.0.0.1:") and not where.endswith("*")
        with pytest.raises(ConfigError, match=f"cannot bind to {where} \\(second publisher\\)"):
            attach(make_socket(ctx, zmq.PUB), where, bind=True, what="second publisher")
        assert attach(sub, where, bind=False, what="test subscriber") == where
    finally:
        ctx.destroy(linger=0)


def test_buffered_socket_hands_out_every_byte_and_yields_after_a_few_reads():
    """A BufferedSocket returns the stream byte for byte however it is asked for it, reads READ_CHUNK at a time,
    and after READS_PER_WAKEUP reads in one drain reports "would block" once (the event loop's turn), keeping
    what it has not handed out (pending(), the bytes read and not yet handed out, is then 0)."""
    rng = np.random.default_rng(72)
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    data = rng.integers(0, 256, (READS_PER_WAKEUP + 2) * READ_CHUNK, dtype=np.uint8).tobytes()
    a.sendall(data)
    a.close()
    b.setblocking(False)
    sock = BufferedSocket(b)
    got, yields = bytearray(), 0
    sizes = itertools.cycle([1, 1, 7, 300, 5000])
    while True:
        try:
            piece = sock.recv(next(sizes))
        except BlockingIOError:
            yields += 1
            assert sock.pending() == 0  # nothing read is held back when it yields
            continue
        if not piece:
            break
        got += piece
    assert bytes(got) == data and yields >= 1
    assert sock.fileno() == b.fileno()  # the rest is the socket's
    b.close()


def test_receive_buffer_is_fixed_only_where_the_kernel_allows_it(tmp_path, monkeypatch, caplog):
    """receive_buffer_plan keeps a size within net.core.rmem_max, leaves the kernel's auto-tuning (0) above it and
    says so once, naming the source (and `streamcorr check` says which); the config takes 0 or at least 64 KiB."""
    np.random.default_rng(73)
    rmem = tmp_path / "rmem_max"
    rmem.write_text("212992\n")
    monkeypatch.setattr(mqtt_transport, "RMEM_MAX", rmem)
    with caplog.at_level(logging.INFO, logger="streamcorr.transport.mqtt"):
        assert receive_buffer_plan(4 << 20, "MQTT source") == 0
        assert receive_buffer_plan(1 << 17, "MQTT source") == 1 << 17
        assert receive_buffer_plan(0, "MQTT source") == 0
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["MQTT source"]
    assert "net.core.rmem_max (212992)" in caplog.records[0].getMessage()
    assert mqtt_transport.describe_receive_buffer(1 << 17) == "131,072 bytes, fixed"
    assert mqtt_transport.describe_receive_buffer(4 << 20).startswith("auto-tuned by the kernel (4,194,304 bytes")
    MqttSourceConfig(type="mqtt", topics=["a/#"], receive_buffer_bytes=0)
    MqttSourceConfig(type="mqtt", topics=["a/#"], receive_buffer_bytes=64 << 10)
    for bad in (1, (64 << 10) - 1, -1, True):
        with pytest.raises(ValidationError):
            MqttSourceConfig(type="mqtt", topics=["a/#"], receive_buffer_bytes=bad)
