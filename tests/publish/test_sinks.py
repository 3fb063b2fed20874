"""The publishing sinks against real sockets: ZeroMQ on loopback and the Mosquitto broker, read by plain clients."""

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import aiomqtt
import msgpack
import numpy as np
import pytest
import zmq
import zmq.asyncio

from streamcorr.config import MqttConnection, Tls
from streamcorr.engine.changes import ChangeEvent
from streamcorr.engine.matrix import Snapshot
from streamcorr.errors import ConfigError, InputError
from streamcorr.publish.envelope import Status, decode_message
from streamcorr.publish.mqtt_sink import STATUS_SEQ_BLOCK, MqttPublisher
from streamcorr.publish.sinks import Sink, SinkCounters, engine_counters
from streamcorr.publish.zmq_sink import ZmqPublisher
from tests.brokers import free_port
from tests.helpers import ANY_PORT, REPO, connection, make_event, make_snapshot, until


async def retained(broker: tuple[str, int], topics: list[str], timeout_s: float = 3.0) -> dict[str, bytes]:
    """What a client that subscribes now is handed as retained messages, by topic."""
    out: dict[str, bytes] = {}
    async with aiomqtt.Client(broker[0], broker[1]) as client:
        for name in topics:
            await client.subscribe(name)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                async for m in client.messages:
                    assert m.retain
                    out[m.topic.value] = m.payload
                    if len(out) == len(topics):
                        break
    return out


# -- ZeroMQ -----------------------------------------------------------------------------------------
async def zmq_handshake(pub: ZmqPublisher, sock: zmq.asyncio.Socket) -> None:
    """Publish statuses until the SUB socket gets one (a fresh SUB misses what is sent before it joins)."""
    for _ in range(200):
        await pub.publish_status("online", {})
        if await sock.poll(20):
            while await sock.poll(50):
                await sock.recv_multipart()
            return
    raise AssertionError("the SUB socket never joined")


def test_zmq_publisher_sends_topic_and_envelope_frames_with_per_topic_seq():
    """A raw SUB socket receives [topic, envelope] frames: snapshots, same-seq pair lists, events and status."""
    rng = np.random.default_rng(0)

    async def main():
        ctx = zmq.asyncio.Context()
        async with ZmqPublisher(endpoint=ANY_PORT, snapshot_endpoint=None, prefix="p", top_k=2, context=ctx) as pub:
            sock = ctx.socket(zmq.SUB)
            sock.connect(pub.endpoint)
            sock.setsockopt(zmq.SUBSCRIBE, b"p/")
            await zmq_handshake(pub, sock)
            snaps = [make_snapshot(rng, seq=k) for k in (5, 6)]
            for snap in snaps:
                await pub.publish_snapshot(snap)
            await pub.publish_event(make_event(rng))
            got = [await asyncio.wait_for(sock.recv_multipart(), 5) for _ in range(5)]
            sock.close(0)
            counters = pub.counters
        ctx.term()
        return snaps, got, counters

    snaps, got, counters = asyncio.run(main())
    topics = [frames[0] for frames in got]
    assert topics == [b"p/snapshot", b"p/pairs", b"p/snapshot", b"p/pairs", b"p/event"]
    msgs = [decode_message(frames[1]) for frames in got]
    assert [m.seq for m in msgs] == [1, 1, 2, 2, 1]
    assert [m.body.seq for m in msgs[:4]] == [5, 5, 6, 6]  # the engine's own snapshot seq rides along
    np.testing.assert_array_equal(msgs[2].body.mi, snaps[1].mi.astype(np.float32))
    assert msgs[1].pairs is not None and len(msgs[1].pairs) == 2
    assert counters.sent["snapshot"] == 2 and counters.sent["pairs"] == 2 and counters.sent["event"] == 1
    assert 0 <= counters.publish_lag_s < 5


def test_zmq_latest_cache_answers_any_request_with_the_newest_snapshot_and_status():
    """The REP endpoint answers with status only before a snapshot, then with the newest snapshot and status."""
    rng = np.random.default_rng(1)

    async def ask(ctx, endpoint, request: bytes) -> list[bytes]:
        req = ctx.socket(zmq.REQ)
        req.connect(endpoint)
        await req.send(request)
        frames = await asyncio.wait_for(req.recv_multipart(), 5)
        req.close(0)
        return frames

    async def main():
        ctx = zmq.asyncio.Context()
        async with ZmqPublisher(endpoint=ANY_PORT, snapshot_endpoint=ANY_PORT, prefix="q", context=ctx) as pub:
            first = await ask(ctx, pub.snapshot_endpoint, b"hello")
            for k in range(1, 4):
                await pub.publish_snapshot(make_snapshot(rng, seq=k))
            later = await ask(ctx, pub.snapshot_endpoint, b"")
            requests = pub.counters.latest_requests
        ctx.term()
        return first, later, requests

    first, later, requests = asyncio.run(main())
    assert first[0] == b"q/status" and len(first) == 2
    assert decode_message(first[1]).body.state == "online"
    assert later[0::2] == [b"q/snapshot", b"q/status"]
    assert decode_message(later[1]).body.seq == 3
    assert requests == 2


def test_zmq_stop_sends_offline_and_a_taken_port_is_a_config_error():
    """stop() publishes "offline"; binding a port that is in use raises ConfigError naming the cause."""
    np.random.default_rng(2)

    async def main():
        ctx = zmq.asyncio.Context()
        pub = ZmqPublisher(endpoint=ANY_PORT, snapshot_endpoint=None, prefix="r", context=ctx)
        assert pub.problem() == "not started"
        await pub.start()
        assert pub.problem() is None and pub.queue_depth == 0
        sock = ctx.socket(zmq.SUB)
        sock.connect(pub.endpoint)
        sock.setsockopt(zmq.SUBSCRIBE, b"r/status")
        await zmq_handshake(pub, sock)
        with pytest.raises(ConfigError, match="in use"):
            await ZmqPublisher(endpoint=pub.endpoint, snapshot_endpoint=None, context=ctx).start()
        taken = ZmqPublisher(endpoint=ANY_PORT, snapshot_endpoint=ANY_PORT, context=ctx)
        await taken.start()  # a second daemon's late-joiner socket on the same port: the error names the key
        with pytest.raises(ConfigError, match=r"outputs\.zmq\.snapshot_endpoint.*in use"):
            await ZmqPublisher(endpoint=ANY_PORT, snapshot_endpoint=taken.snapshot_endpoint, context=ctx).start()
        await taken.stop()
        await pub.stop()
        assert pub.problem() == "stopped"
        frames = await asyncio.wait_for(sock.recv_multipart(), 5)
        sock.close(0)
        ctx.term()
        await pub.publish_event(ChangeEvent(("a", "b"), 0.0, 1.0, 0, "rise"))  # after stop: counted, not raised
        return decode_message(frames[1]).body, pub.counters

    status, counters = asyncio.run(main())
    assert isinstance(status, Status) and status.state == "offline"
    assert counters.dropped["event"] == 1


def test_both_publishers_are_sinks():
    """ZmqPublisher and MqttPublisher implement the Sink protocol the daemon drives every output through."""
    np.random.default_rng(12)
    assert isinstance(ZmqPublisher(), Sink)
    assert isinstance(MqttPublisher(settings=MqttConnection()), Sink)


def test_mqtt_start_refuses_what_cannot_work_and_returns_at_once_otherwise(tmp_path):
    """start() raises ConfigError for an unreadable CA file and after stop(); with no broker it returns at once
    and problem() says why nothing is published."""
    np.random.default_rng(13)
    no_broker = MqttConnection(port=free_port(), reconnect_min_s=0.05, reconnect_max_s=0.1)

    async def main() -> tuple[str | None, str | None]:
        with pytest.raises(ConfigError, match="tls"):
            bad_tls = no_broker.model_copy(update={"tls": Tls(ca_file=str(tmp_path / "missing.crt"))})
            await MqttPublisher(settings=bad_tls).start()
        pub = MqttPublisher(settings=no_broker)
        await asyncio.wait_for(pub.start(), 1)
        await until(lambda: pub.counters.connect_failures >= 1)
        waiting = pub.problem()
        await pub.stop(timeout_s=0.1)
        with pytest.raises(ConfigError, match="stopped"):
            await pub.start()
        return waiting, pub.problem()

    assert asyncio.run(main()) == ("not connected", "stopped")


def test_sink_constructors_and_publish_reject_bad_input():
    """Bad endpoints, HWM, prefixes, queue sizes and malformed snapshots raise clear errors."""
    rng = np.random.default_rng(3)
    with pytest.raises(ConfigError, match="endpoint must start with"):
        ZmqPublisher(endpoint="127.0.0.1:5556")
    with pytest.raises(ConfigError, match="sndhwm"):
        ZmqPublisher(sndhwm=0)
    with pytest.raises(ConfigError, match="prefix"):
        ZmqPublisher(prefix="a/#")
    with pytest.raises(ConfigError, match="top_k"):
        MqttPublisher(settings=MqttConnection(), top_k=0)
    with pytest.raises(ConfigError, match="queue_size"):
        MqttPublisher(settings=MqttConnection(), queue_size=0)
    snap = make_snapshot(rng)
    bad = Snapshot(1, 0, 0, ("a",), snap.mi, snap.age_s, snap.coverage)

    async def main():
        pub = MqttPublisher(settings=MqttConnection())
        with pytest.raises(InputError, match="shape"):
            await pub.publish_snapshot(bad)
        with pytest.raises(InputError, match="online"):
            await pub.publish_status("up", {})
        return pub.queue_depth

    assert asyncio.run(main()) == 0


def test_engine_counters_and_sink_counters_flatten_to_numbers():
    """Status counters are flat name -> number maps (nested stage timers become "stage_s.<stage>")."""
    np.random.default_rng(4)
    flat = SinkCounters().as_dict()
    assert flat["sent.snapshot"] == 0 and "dropped.event" in flat
    assert all(isinstance(v, int | float) for v in flat.values())

    @dataclass
    class Counters:  # the shape of EngineCounters, without importing torch for it
        hops: int = 3
        busy: bool = True
        stage_s: dict = field(default_factory=lambda: {"model": 0.5})

    class FakeEngine:
        counters = Counters()

    assert engine_counters(FakeEngine()) == {"hops": 3, "stage_s.model": 0.5}  # type: ignore[arg-type]


# -- MQTT -------------------------------------------------------------------------------------------
def test_mqtt_online_status_is_retained_and_a_plain_cli_client_reads_it(mqtt_broker, prefix):
    """After connecting, {prefix}/status holds a retained "online" envelope that mosquitto_sub receives."""
    np.random.default_rng(5)

    async def main():
        async with MqttPublisher(settings=connection(mqtt_broker), prefix=prefix) as pub:
            assert await pub.wait_connected(5)
            cli = await asyncio.create_subprocess_exec(
                "mosquitto_sub", "-h", mqtt_broker[0], "-p", str(mqtt_broker[1]), "-t", f"{prefix}/status",
                "-C", "1", "-N", "-W", "5", stdout=subprocess.PIPE,
            )  # fmt: skip
            out, _ = await cli.communicate()
            return cli.returncode, out, pub.counters

    rc, out, counters = asyncio.run(main())
    assert rc == 0
    status = decode_message(out)
    assert status.kind == "status" and status.body.state == "online" and status.seq == 1
    assert counters.connects == 1 and counters.sent["status"] == 2  # online, then offline at close


def test_mqtt_close_sends_the_final_snapshot_and_a_retained_offline(mqtt_broker, prefix):
    """stop() flushes the pending snapshot (retained, with its pair list) and leaves "offline" retained."""
    rng = np.random.default_rng(6)
    snaps = [make_snapshot(rng, seq=k) for k in range(1, 4)]

    async def main():
        pub = MqttPublisher(settings=connection(mqtt_broker), prefix=prefix, threshold=0.0)
        await pub.start()
        assert await pub.wait_connected(5)
        for snap in snaps:  # no await in between: the first two are superseded before they can be sent
            await pub.publish_snapshot(snap)
        await pub.stop()
        assert pub.problem() == "stopped"
        return pub.counters

    counters = asyncio.run(main())
    assert counters.dropped["snapshot"] == 2 and counters.sent["snapshot"] == 1
    assert counters.connects == counters.disconnects == 1
    got = asyncio.run(retained(mqtt_broker, [f"{prefix}/snapshot", f"{prefix}/pairs", f"{prefix}/status"]))
    snap_msg = decode_message(got[f"{prefix}/snapshot"])
    assert snap_msg.seq == 1 and snap_msg.body.seq == 3
    np.testing.assert_array_equal(snap_msg.body.mi, snaps[2].mi.astype(np.float32))
    assert decode_message(got[f"{prefix}/pairs"]).seq == 1
    status = decode_message(got[f"{prefix}/status"])
    assert status.body.state == "offline" and status.body.counters["sent.snapshot"] == 1
    assert status.seq == STATUS_SEQ_BLOCK  # online was 1; offline ends the block reserved for this connection


def test_mqtt_outbox_drops_superseded_snapshots_and_oldest_events_then_sends_in_order(mqtt_broker, prefix):
    """Queued while not connected: only the newest snapshot and the newest queue_size events reach the broker."""
    rng = np.random.default_rng(7)
    events = [make_event(rng, k) for k in range(10)]

    async def main():
        pub = MqttPublisher(settings=connection(mqtt_broker), prefix=prefix, queue_size=4)
        for k in range(5):
            await pub.publish_snapshot(make_snapshot(rng, seq=k + 1))
        for ev in events:
            await pub.publish_event(ev)
        assert pub.queue_depth == 5
        received = []
        async with aiomqtt.Client(*mqtt_broker) as client:
            await client.subscribe(f"{prefix}/event")
            await client.subscribe(f"{prefix}/snapshot")
            async with pub:
                async with asyncio.timeout(5):
                    async for m in client.messages:
                        received.append((m.topic.value, decode_message(m.payload)))
                        if len(received) == 5:
                            break
        return received, pub.counters

    received, counters = asyncio.run(main())
    assert counters.dropped["snapshot"] == 4 and counters.dropped["event"] == 6
    assert [t.rsplit("/", 1)[1] for t, _ in received] == ["event"] * 4 + ["snapshot"]
    assert [m.body for _, m in received[:4]] == events[6:]
    assert [m.seq for _, m in received[:4]] == [1, 2, 3, 4]
    assert received[4][1].body.seq == 5


PUBLISHER_SCRIPT = """
import asyncio, sys
from streamcorr.config import MqttConnection
from streamcorr.publish.mqtt_sink import MqttPublisher

async def main():
    async with MqttPublisher(settings=MqttConnection(host=sys.argv[1], port=int(sys.argv[2])), prefix=sys.argv[3]):
        await asyncio.Event().wait()

asyncio.run(main())
"""


def test_mqtt_last_will_says_offline_when_the_publisher_process_is_killed(mqtt_broker, prefix):
    """SIGKILL of a publishing process (no goodbye) makes the broker publish the retained "offline" will."""
    np.random.default_rng(8)

    async def main():
        states = []
        async with aiomqtt.Client(*mqtt_broker) as client:
            await client.subscribe(f"{prefix}/status")
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", PUBLISHER_SCRIPT, mqtt_broker[0], str(mqtt_broker[1]), prefix, cwd=REPO
            )
            killed = False
            try:
                async with asyncio.timeout(20):
                    async for m in client.messages:
                        msg = decode_message(m.payload)
                        states.append((msg.body.state, msg.seq, m.retain))
                        if msg.body.state == "online":
                            proc.send_signal(signal.SIGKILL)
                            killed = True
                        else:
                            break
            finally:
                # signal only a process not yet killed: Popen.send_signal polls, and could reap the child
                # before asyncio's watcher does (which then reports 255)
                if not killed:
                    proc.kill()
                await proc.wait()
        return states, proc.returncode

    states, rc = asyncio.run(main())
    assert rc == -signal.SIGKILL
    assert [(s, q) for s, q, _ in states] == [("online", 1), ("offline", STATUS_SEQ_BLOCK)]  # the will: above all
    got = asyncio.run(retained(mqtt_broker, [f"{prefix}/status"]))
    assert decode_message(got[f"{prefix}/status"]).body.state == "offline"


def test_mqtt_publisher_reconnects_after_the_broker_restarts_and_never_gives_up(private_broker):
    """Broker gone: the publisher keeps retrying (counted); broker back: it reconnects and says "online" again."""
    rng = np.random.default_rng(9)
    port, start, stop = private_broker
    settings = MqttConnection(host="127.0.0.1", port=port, reconnect_min_s=0.05, reconnect_max_s=0.2, keepalive_s=5)

    async def main():
        pub = MqttPublisher(settings=settings, prefix="plant")
        await pub.start()
        assert await pub.wait_connected(5) and pub.problem() is None
        await asyncio.get_running_loop().run_in_executor(None, stop)
        await until(lambda: not pub.connected)
        await pub.publish_snapshot(make_snapshot(rng, seq=1))  # waits in the outbox
        await until(lambda: pub.counters.connect_failures >= 3)
        assert pub.problem() == "not connected" and pub.queue_depth == 1
        await asyncio.get_running_loop().run_in_executor(None, start)
        assert await pub.wait_connected(5)
        await until(lambda: pub.counters.sent["snapshot"] == 1)
        await pub.stop()
        got = await retained(("127.0.0.1", port), ["plant/status", "plant/snapshot"])
        return pub.counters, got

    counters, got = asyncio.run(main())
    assert counters.connects == 2 and counters.disconnects == 2
    assert counters.sent["status"] == 3  # online, online again after the restart, offline at close
    # seq: 1 online, the first block's end its will (reserved), then online above it, and offline at the end of
    # the second block: always above every status sent before
    assert decode_message(got["plant/status"]).seq == 2 * STATUS_SEQ_BLOCK
    assert decode_message(got["plant/snapshot"]).body.seq == 1


def test_mqtt_close_without_a_broker_gives_up_after_its_timeout():
    """With no broker at all, stop() returns after its timeout, counts the queued messages as dropped and ends the
    connection task."""
    rng = np.random.default_rng(10)
    settings = MqttConnection(host="127.0.0.1", port=free_port(), reconnect_min_s=0.05, reconnect_max_s=0.1)

    async def main():
        pub = MqttPublisher(settings=settings)
        await pub.start()
        await pub.publish_snapshot(make_snapshot(rng))
        await pub.publish_event(make_event(rng))
        await until(lambda: pub.counters.connect_failures >= 2)
        t0 = time.monotonic()
        await pub.stop(timeout_s=0.3)
        task = pub._run_task
        return time.monotonic() - t0, task is not None and task.done(), pub.counters

    took, done, counters = asyncio.run(main())
    assert done and took < 2
    assert counters.connects == 0 and counters.dropped["snapshot"] == 1 and counters.dropped["event"] == 1


def test_envelope_bytes_on_the_wire_are_plain_msgpack(mqtt_broker, prefix):
    """A retained MQTT snapshot is a plain msgpack map a non-Python client can read without streamcorr."""
    rng = np.random.default_rng(11)
    snap = make_snapshot(rng, n=3)

    async def main():
        async with MqttPublisher(settings=connection(mqtt_broker), prefix=prefix) as pub:
            await pub.publish_snapshot(snap)
        return await retained(mqtt_broker, [f"{prefix}/snapshot"])

    raw = msgpack.unpackb(asyncio.run(main())[f"{prefix}/snapshot"], raw=False)
    assert raw["v"] == 1 and raw["kind"] == "snapshot" and raw["channels"] == ["ch0", "ch1", "ch2"]
    mi = np.frombuffer(raw["mi"]["data"], dtype=raw["mi"]["dtype"]).reshape(raw["mi"]["shape"])
    np.testing.assert_array_equal(mi, snap.mi.astype(np.float32))


_ARENAS = """
import ctypes, os, sys, tempfile, threading
import numpy as np
from streamcorr.publish.sinks import cap_heap_arenas
if sys.argv[1] == "cap":
    assert cap_heap_arenas()
def work():
    for _ in range(200):
        _ = [np.ones(5000) for _ in range(50)]
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc = ctypes.CDLL(None)
libc.fdopen.restype = ctypes.c_void_p
with tempfile.TemporaryFile() as f:
    fp = ctypes.c_void_p(libc.fdopen(os.dup(f.fileno()), b"w"))
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    f.seek(0)
    print(f.read().decode().count("<heap nr="))
"""


@pytest.mark.skipif(not hasattr(__import__("ctypes").CDLL(None), "mallopt"), reason="glibc only")
def test_cap_heap_arenas_bounds_the_arenas_of_many_threads():
    """With the cap (what `streamcorr run` sets for its process) eight allocating threads share two glibc arenas;
    without it each gets its own, which keeps its own fragmented free space."""
    arenas = {
        how: int(subprocess.run([sys.executable, "-c", _ARENAS, how], capture_output=True, text=True, check=True,
                                timeout=120).stdout.split()[-1])
        for how in ("cap", "default")
    }  # fmt: skip
    assert arenas["cap"] <= 2 < arenas["default"], arenas
