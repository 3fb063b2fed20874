"""ZmqSource over real ZeroMQ sockets: PUB/SUB and PUSH/PULL into an Engine, frame faults, hostile payloads."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable

import msgpack
import numpy as np
import pytest
import zmq
import zmq.asyncio

from streamcorr.config import MqttConnection
from streamcorr.errors import ConfigError
from streamcorr.ingest.mqtt import MqttSource
from streamcorr.ingest.payload import PayloadDecoder
from streamcorr.ingest.source import Source
from streamcorr.ingest.zmq import ZmqSource
from tests.brokers import HOSTILE_CHANNELS, HOSTILE_DECODER, hostile_corpus, small_engine, stop, until, vm_rss_bytes

RSS_BOUND_BYTES = 64 << 20  # growth allowed while 10k hostile messages pass (steady state is far below)


def collect() -> tuple[list[tuple[str, float, float]], Callable[[str, np.ndarray, np.ndarray], int]]:
    samples: list[tuple[str, float, float]] = []

    def sink(channel: str, t: np.ndarray, v: np.ndarray) -> int:
        samples.extend(zip([channel] * len(t), t.tolist(), v.tolist(), strict=True))
        return len(t)

    return samples, sink


def test_config_errors():
    """Bad mode, endpoint scheme, HWM and an empty SUB topic list are ConfigErrors."""
    np.random.default_rng(0)
    ok = {"endpoint": "tcp://127.0.0.1:1", "decoder": PayloadDecoder(), "sink": collect()[1]}
    for change in ({"mode": "req"}, {"endpoint": "udp://x:1"}, {"rcvhwm": 0}, {"topics": []}):
        with pytest.raises(ConfigError):
            ZmqSource(**(ok | change))  # type: ignore[arg-type]
    ZmqSource(**ok | {"mode": "pull", "topics": []})  # type: ignore[arg-type]


def test_both_sources_implement_the_source_protocol():
    """ZmqSource and MqttSource are what the daemon drives every input through."""
    np.random.default_rng(2)
    zmq_src = ZmqSource(endpoint="tcp://127.0.0.1:1", decoder=PayloadDecoder(), sink=collect()[1])
    mqtt_src = MqttSource(settings=MqttConnection(), topics=["a/#"], decoder=PayloadDecoder(), sink=collect()[1])
    assert isinstance(zmq_src, Source) and isinstance(mqtt_src, Source)
    assert (zmq_src.queue_depth, mqtt_src.queue_depth, zmq_src.connected, mqtt_src.connected) == (0, 0, False, False)


def test_bind_conflict_is_config_error():
    """Binding an address already in use raises a ConfigError naming the endpoint."""
    np.random.default_rng(1)

    async def main() -> None:
        pull = {"mode": "pull", "bind": True, "decoder": PayloadDecoder(), "sink": collect()[1]}
        first = ZmqSource(endpoint="tcp://127.0.0.1:*", **pull)  # type: ignore[arg-type]
        task = asyncio.create_task(first.run())
        await first.ready.wait()
        assert first.bound_endpoint is not None
        second = ZmqSource(endpoint=first.bound_endpoint, **pull)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=first.bound_endpoint):
            await second.run()
        await stop(task)

    asyncio.run(main())


def test_pub_sub_topic_filter_into_engine():
    """A PUB socket's messages on subscribed topic prefixes reach a real Engine, exactly; others are filtered out."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal(300)
    y = x + 0.1 * rng.standard_normal(300)

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        pub = ctx.socket(zmq.XPUB)  # XPUB: the test sees the subscription arrive before publishing
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        eng = small_engine()
        dec = PayloadDecoder(channel_template="{topic[1]}.{key}")
        src = ZmqSource(endpoint=f"tcp://127.0.0.1:{port}", topics=["keep/"], decoder=dec, sink=eng.push, context=ctx)

        async def burst(ks: range) -> None:
            for k in ks:
                await pub.send_multipart([b"drop/imu", json.dumps({"t": k / 10, "ax": 1.0}).encode()])
                await pub.send_multipart([b"keep/imu", json.dumps({"t": k / 10, "ax": x[k], "ay": y[k]}).encode()])

        async with eng:
            task = asyncio.create_task(src.run())
            assert await asyncio.wait_for(pub.recv(), 10) == b"\x01keep/"
            await burst(range(200))  # two bursts: the engine places its first window after its first batch
            await until(lambda: dec.counters.samples_handed == 400, what="the first 200 messages")
            await burst(range(200, 300))
            await until(lambda: dec.counters.samples_handed == 600, what="300 messages")
            await asyncio.sleep(0.1)  # nothing else may arrive
            await eng.flush()
            assert src.connected and src.counters.connects == 1
            await stop(task)
        pub.close(0)
        ctx.term()
        c = dec.counters
        assert (c.messages, c.samples_decoded, c.samples_accepted, c.dropped) == (300, 600, 600, 0)
        assert eng.latest is not None and eng.latest.channels == ("imu.ax", "imu.ay")
        assert eng.latest.mi[0, 1] > 0.5

    asyncio.run(main())


def test_push_pull_chunks_single_frames_and_disconnect():
    """PUSH -> PULL (bound) carries msgpack float64 chunks and single-frame payloads; peers are counted."""
    rng = np.random.default_rng(3)
    data = rng.normal(size=(50, 2, 100))

    async def main() -> None:
        samples, sink = collect()
        dec = PayloadDecoder(channel_template="{topic}{key}")
        src = ZmqSource(endpoint="tcp://127.0.0.1:*", mode="pull", bind=True, decoder=dec, sink=sink)
        task = asyncio.create_task(src.run())
        await src.ready.wait()
        ctx = zmq.asyncio.Context()
        push = ctx.socket(zmq.PUSH)
        push.connect(src.bound_endpoint or "")
        for k in range(50):
            t = (np.arange(100) + 100 * k) * 1e-3
            chans = {"x": data[k, 0].tobytes(), "y": data[k, 1].tobytes()}
            await push.send_multipart([b"dev.", msgpack.packb({"t": t.tobytes(), "channels": chans, "seq": k})])
        await push.send(b"42.5")  # one frame: payload, topic ""
        await push.send_multipart([b"a", b"b", b"c"])  # three frames: dropped
        await until(lambda: dec.counters.messages == 52 and dec.counters.samples_handed == 10_001)
        assert src.connected and dec.counters.connects == 1
        push.close(0)
        await until(lambda: dec.counters.disconnects == 1, what="disconnect event")
        assert not src.connected
        await stop(task)
        ctx.term()
        got_x = np.array([v for ch, _, v in samples if ch == "dev.x"])
        np.testing.assert_array_equal(got_x, data[:, 0].ravel())
        assert [(ch, v) for ch, _, v in samples if ch == "value"] == [("value", 42.5)]
        c = dec.counters
        assert (c.samples_decoded, c.samples_accepted, c.drops, c.seq_gaps) == (10_001, 10_001, {"frames": 1}, 0)

    asyncio.run(main())


def test_oversized_message_drops_connection_not_source():
    """A message beyond max_message_bytes makes libzmq drop that peer (counted); the source keeps receiving."""
    np.random.default_rng(4)

    async def main() -> None:
        dec = PayloadDecoder(max_payload_bytes=1000)
        src = ZmqSource(endpoint="tcp://127.0.0.1:*", mode="pull", bind=True, decoder=dec, sink=collect()[1])
        assert src.max_message_bytes == 2000
        task = asyncio.create_task(src.run())
        await src.ready.wait()
        ctx = zmq.asyncio.Context()
        push = ctx.socket(zmq.PUSH)
        push.connect(src.bound_endpoint or "")
        await push.send_multipart([b"a", b"1.0"])
        await push.send_multipart([b"a", b"x" * 1500])  # counted oversize by the decoder
        await until(lambda: dec.counters.messages == 2)
        await push.send_multipart([b"a", b"x" * 50_000])  # beyond MAXMSGSIZE: libzmq closes the connection
        await until(lambda: dec.counters.disconnects >= 1, what="peer dropped")
        await until(lambda: src.connected, what="peer reconnected")
        await push.send_multipart([b"a", b"2.0"])
        await until(lambda: dec.counters.samples_decoded == 2, what="message after the reconnect")
        assert dec.counters.drops == {"oversize": 1} and dec.counters.connects >= 2
        await stop(task)
        push.close(0)
        ctx.term()

    asyncio.run(main())


def test_silent_hwm_drops_revealed_by_seq():
    """PUB/SUB high-water drops are silent in ZeroMQ; a seq field makes them countable: sent = received + gaps."""
    np.random.default_rng(5)
    n = 5000
    stalled = threading.Event()

    def sink(channel: str, t: np.ndarray, v: np.ndarray) -> int:
        if not stalled.is_set():  # block the event loop once while the publisher floods
            stalled.set()
            time.sleep(0.5)
        return len(t)

    async def main() -> None:
        ctx = zmq.Context()
        pub = ctx.socket(zmq.XPUB)
        pub.setsockopt(zmq.SNDHWM, 10)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        dec = PayloadDecoder()
        src = ZmqSource(endpoint=f"tcp://127.0.0.1:{port}", decoder=dec, sink=sink, rcvhwm=10, context=ctx)
        task = asyncio.create_task(src.run())
        assert await asyncio.to_thread(pub.recv) == b"\x01"

        def flood() -> None:
            pub.send_multipart([b"s", json.dumps({"seq": 0, "v": 0.0}).encode()])
            stalled.wait(5)
            for k in range(1, n):
                pub.send_multipart([b"s", json.dumps({"seq": k, "v": 1.0}).encode()])
            time.sleep(0.3)
            pub.send_multipart([b"s", json.dumps({"seq": n, "v": 2.0}).encode()])  # the last one arrives

        await asyncio.to_thread(flood)
        await until(lambda: dec.counters.messages + dec.counters.seq_gaps == n + 1, what="ledger closes")
        await stop(task)
        pub.close(0)
        ctx.term()
        assert dec.counters.seq_gaps > 0  # some were lost, silently for ZeroMQ, but counted
        assert dec.counters.seq_resets == 0

    asyncio.run(main())


def test_hostile_payloads_counted_exactly():
    """10k malformed and hostile PUSH messages (frame faults included): no crash, every item counted, RSS bounded."""
    rng = np.random.default_rng(6)
    corpus, want = hostile_corpus(rng, 10_000, "hostile", frame_faults=True)

    async def main() -> None:
        eng = small_engine(channels=HOSTILE_CHANNELS, auto_add_channels=False)
        dec = PayloadDecoder(**HOSTILE_DECODER)  # type: ignore[arg-type]
        src = ZmqSource(endpoint="tcp://127.0.0.1:*", mode="pull", bind=True, decoder=dec, sink=eng.push)
        async with eng:
            task = asyncio.create_task(src.run())
            await src.ready.wait()
            rss0 = vm_rss_bytes()
            ctx = zmq.asyncio.Context()
            push = ctx.socket(zmq.PUSH)
            push.connect(src.bound_endpoint or "")
            for frames in corpus:
                await push.send_multipart(frames)
            await until(lambda: dec.counters.messages == want.messages, timeout_s=20, what="all messages")
            await until(lambda: dec.counters.samples_handed == want.decoded, what="the last batch delivered")
            await eng.flush()
            rss_growth = vm_rss_bytes() - rss0
            await stop(task)
            push.close(0)
            ctx.term()
        c = dec.counters
        assert c.drops == dict(want.drops)
        assert (c.samples_decoded, c.samples_handed, c.samples_accepted) == (want.decoded, want.decoded, want.accepted)
        assert eng.counters.unknown_channel == want.unknown_samples
        assert (c.sink_errors, c.disconnects) == (0, 0)
        assert eng.counters.hops > 0
        assert rss_growth < RSS_BOUND_BYTES, f"RSS grew by {rss_growth / 2**20:.1f} MiB"

    asyncio.run(main())
