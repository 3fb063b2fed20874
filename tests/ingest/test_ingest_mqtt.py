"""MqttSource against a real Mosquitto: mosquitto_pub into an Engine, broker restart, hostile payloads."""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid

import aiomqtt
import numpy as np
import pytest
from pydantic import ValidationError

from streamcorr.config import MqttConnection
from streamcorr.errors import ConfigError
from streamcorr.ingest.mqtt import MqttSource
from streamcorr.ingest.payload import PayloadDecoder
from streamcorr.transport.mqtt import READ_CHUNK, READS_PER_WAKEUP
from tests.brokers import (
    HOSTILE_CHANNELS,
    HOSTILE_DECODER,
    PrivateBroker,
    free_port,
    hostile_corpus,
    small_engine,
    stop,
    until,
    vm_rss_bytes,
)

RSS_BOUND_BYTES = 64 << 20  # growth allowed while 10k hostile messages pass (steady state is far below)


class ListSink:
    def __init__(self) -> None:
        self.samples: list[tuple[str, float, float]] = []

    def __call__(self, channel: str, t: np.ndarray, v: np.ndarray) -> int:
        self.samples.extend(zip([channel] * len(t), t.tolist(), v.tolist(), strict=True))
        return len(t)


async def mosquitto_pub(host: str, port: int, topic: str, lines: list[bytes]) -> None:
    """Publish each line as one message with the mosquitto_pub command-line client (-l: stdin lines)."""
    proc = await asyncio.create_subprocess_exec(
        "mosquitto_pub", "-h", host, "-p", str(port), "-t", topic, "-l", "-q", "0",
        stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await proc.communicate(b"\n".join(lines) + b"\n")
    assert proc.returncode == 0, err.decode()


def test_config_errors():
    """Empty or malformed topic filters, a zero queue and settings that are not an MqttConnection are refused with
    ConfigError; a bad QoS or backoff cannot even be built as settings (the config section validates them)."""
    np.random.default_rng(0)
    ok = {"settings": MqttConnection(), "topics": ["a/#"], "decoder": PayloadDecoder(), "sink": ListSink()}
    for change in (
        {"topics": []},
        {"topics": ["a/#/b"]},
        {"topics": ["a/b+"]},
        {"topics": [""]},
        {"queue_size": 0},
        {"settings": {"host": "127.0.0.1"}},
    ):
        with pytest.raises(ConfigError):
            MqttSource(**(ok | change))  # type: ignore[arg-type]
    for bad in ({"qos": 3}, {"reconnect_min_s": 0}, {"reconnect_min_s": 2, "reconnect_max_s": 1}):
        with pytest.raises(ValidationError):
            MqttConnection(**bad)  # type: ignore[arg-type]
    MqttSource(**ok | {"topics": ["+/x/#", "#", "a/+"]})  # type: ignore[arg-type]


def test_mosquitto_pub_reaches_engine(mqtt_broker):
    """Lines published by mosquitto_pub arrive in a real Engine with exact counts and give a snapshot."""
    rng = np.random.default_rng(1)
    host, port = mqtt_broker
    prefix = f"streamcorr-test/{uuid.uuid4().hex}"
    x = rng.standard_normal(300)
    y = x + 0.1 * rng.standard_normal(300)
    lines = [json.dumps({"t": k / 10, "ax": x[k], "ay": y[k]}).encode() for k in range(300)]

    async def main() -> None:
        eng = small_engine()
        dec = PayloadDecoder(channel_template="{topic[-1]}.{key}")
        src = MqttSource(
            settings=MqttConnection(host=host, port=port), topics=[f"{prefix}/+/imu"], decoder=dec, sink=eng.push
        )
        async with eng:
            task = asyncio.create_task(src.run())
            await until(lambda: src.connected, what="connect and subscribe")
            await mosquitto_pub(host, port, f"{prefix}/arm/gps", lines[:5])  # outside the filter
            # two bursts: the engine places its first window after the first batch it is handed
            await mosquitto_pub(host, port, f"{prefix}/arm/imu", lines[:200])
            await until(lambda: dec.counters.samples_handed == 400, what="the first 200 messages")
            await mosquitto_pub(host, port, f"{prefix}/arm/imu", lines[200:])
            await until(lambda: dec.counters.samples_handed == 600, what="300 messages")
            await eng.flush()
            await stop(task)
        c = src.counters
        assert (c.messages, c.samples_decoded, c.samples_accepted, c.dropped) == (300, 600, 600, 0)
        assert (c.connects, c.disconnects, c.connect_failures, c.queue_full) == (1, 0, 0, 0)
        assert eng.latest is not None and eng.latest.channels == ("imu.ax", "imu.ay")
        assert eng.latest.mi[0, 1] > 0.5  # y is x plus 10% noise: strongly dependent

    asyncio.run(main())


def test_a_burst_arrives_whole_and_in_order(mqtt_broker):
    """3,000 messages published at once by mosquitto_pub reach the sink in order, each sample once, and the last
    ones without waiting for more traffic (a batch gathers for a moment, then hands on what it has)."""
    rng = np.random.default_rng(31)
    host, port = mqtt_broker
    topic = f"streamcorr-test/{uuid.uuid4().hex}/dev"
    values = rng.standard_normal(3000)
    lines = [json.dumps({"t": 1.0 + k / 100, "v": values[k]}).encode() for k in range(3000)]

    async def main() -> ListSink:
        sink = ListSink()
        src = MqttSource(settings=MqttConnection(host=host, port=port), topics=[topic],
                         decoder=PayloadDecoder(channel_template="dev.{key}"), sink=sink)  # fmt: skip
        task = asyncio.create_task(src.run())
        await until(lambda: src.connected, what="connect and subscribe")
        await mosquitto_pub(host, port, topic, lines)
        await until(lambda: len(sink.samples) == 3000, what="all 3,000 messages", timeout_s=10)
        await stop(task)
        return sink

    sink = asyncio.run(main())
    assert [v for _, _, v in sink.samples] == values.tolist()
    assert [t for _, t, _ in sink.samples] == pytest.approx([1.0 + k / 100 for k in range(3000)])


def test_messages_larger_than_a_read_chunk_arrive_whole_between_small_ones(mqtt_broker):
    """Chunks of 600 KB and 300 KB (more socket reads than one wake-up makes) between single readings reach the
    sink with every sample, in order; a topic that is not UTF-8 is counted, not raised (handed to the source
    directly: Mosquitto refuses such topics)."""
    rng = np.random.default_rng(32)
    host, port = mqtt_broker
    topic = f"streamcorr-test/{uuid.uuid4().hex}/dev"
    big = [rng.standard_normal(n) for n in (15_000, 7_500)]
    t_next = iter(np.arange(1.0, 100.0, 0.001).tolist())

    def chunk(values: np.ndarray) -> bytes:
        return json.dumps({"t": [next(t_next) for _ in values], "channels": {"v": values.tolist()}}).encode()

    small = rng.standard_normal(6)
    messages = [json.dumps({"t": next(t_next), "v": small[0]}).encode(), chunk(big[0])]
    messages += [json.dumps({"t": next(t_next), "v": x}).encode() for x in small[1:4]]
    messages += [chunk(big[1]), *[json.dumps({"t": next(t_next), "v": x}).encode() for x in small[4:]]]
    assert len(messages[1]) > len(messages[5]) > READS_PER_WAKEUP * READ_CHUNK  # more than one wake-up reads
    want = [small[0], *big[0], *small[1:4], *big[1], *small[4:]]

    async def main() -> tuple[ListSink, MqttSource]:
        sink = ListSink()
        src = MqttSource(settings=MqttConnection(host=host, port=port), topics=[topic],
                         decoder=PayloadDecoder(channel_template="dev.{key}"), sink=sink)  # fmt: skip
        task = asyncio.create_task(src.run())
        await until(lambda: src.connected, what="connect and subscribe")
        async with aiomqtt.Client(host, port) as client:
            for m in messages:
                await client.publish(topic, m)
        await until(lambda: len(sink.samples) == len(want), what="every sample", timeout_s=10)
        await stop(task)
        return sink, src

    sink, src = asyncio.run(main())
    assert [v for _, _, v in sink.samples] == [float(x) for x in want]
    assert src.counters.messages == len(messages) and src.counters.dropped == 0
    src._take(None, b"1.0")  # what paho hands on for a topic that is not UTF-8
    assert src.counters.drops == {"topic": 1} and src.counters.messages == len(messages) + 1


def test_bare_numbers_and_malformed_from_mosquitto_pub(mqtt_broker):
    """Bare numbers get arrival times; malformed lines are counted by reason, not raised."""
    rng = np.random.default_rng(2)
    host, port = mqtt_broker
    topic = f"streamcorr-test/{uuid.uuid4().hex}/temp"
    values = rng.normal(20, 2, size=50)
    lines = [repr(float(v)).encode() for v in values] + [b"{oops", b"hot", b'{"t": 1, "x": "warm"}']

    async def main() -> None:
        sink = ListSink()
        dec = PayloadDecoder(channel_template="{topic[2]}")
        src = MqttSource(settings=MqttConnection(host=host, port=port), topics=[topic], decoder=dec, sink=sink)
        task = asyncio.create_task(src.run())
        await until(lambda: src.connected)
        await mosquitto_pub(host, port, topic, lines)
        await until(lambda: dec.counters.messages == len(lines) and dec.counters.samples_handed == len(values))
        await stop(task)
        assert [v for _, _, v in sink.samples] == values.tolist()
        times = [t for _, t, _ in sink.samples]
        assert all(b > a for a, b in itertools.pairwise(times))  # arrival times strictly increase
        assert dec.counters.drops == {"decode": 2, "type": 1}

    asyncio.run(main())


def test_broker_restart_reconnects_and_resumes(tmp_path):
    """Stopping the broker mid-run is counted as a disconnect; run() keeps retrying and resumes after restart."""
    rng = np.random.default_rng(3)
    payloads = [json.dumps({"t": k * 0.01, "v": float(rng.normal())}).encode() for k in range(40)]

    async def publish(port: int, msgs: list[bytes]) -> None:
        async with aiomqtt.Client("127.0.0.1", port) as client:
            for p in msgs:
                await client.publish("plant/sensor", p)

    async def main(broker: PrivateBroker) -> None:
        settings = MqttConnection(port=broker.port, reconnect_min_s=0.05, reconnect_max_s=0.2, timeout_s=2)
        sink = ListSink()
        src = MqttSource(settings=settings, topics=["plant/#"], decoder=PayloadDecoder(), sink=sink)
        task = asyncio.create_task(src.run())
        await until(lambda: src.connected)
        await publish(broker.port, payloads[:20])
        await until(lambda: src.counters.samples_handed == 20)
        await asyncio.to_thread(broker.stop)
        await until(lambda: not src.connected and src.counters.disconnects == 1, what="disconnect noticed")
        await until(lambda: src.counters.connect_failures >= 2, what="retries while the broker is down")
        assert not task.done()
        await asyncio.to_thread(broker.start)
        await until(lambda: src.connected and src.counters.connects == 2, what="reconnect", timeout_s=15)
        await publish(broker.port, payloads[20:])
        await until(lambda: src.counters.samples_handed == 40, what="messages after the restart")
        await stop(task)
        assert [v for _, _, v in sink.samples] == [json.loads(p)["v"] for p in payloads]
        assert src.counters.dropped == 0 and src.counters.disconnects == 1

    with PrivateBroker(tmp_path) as broker:
        asyncio.run(main(broker))


def test_connect_failures_counted_and_never_exit():
    """With no broker at all, run() keeps retrying with backoff, counting each failed attempt."""
    np.random.default_rng(4)
    settings = MqttConnection(port=free_port(), reconnect_min_s=0.01, reconnect_max_s=0.05, timeout_s=1)

    async def main() -> None:
        src = MqttSource(settings=settings, topics=["x"], decoder=PayloadDecoder(), sink=ListSink())
        task = asyncio.create_task(src.run())
        await until(lambda: src.counters.connect_failures >= 3)
        assert not src.connected and src.counters.connects == 0
        await stop(task)

    asyncio.run(main())


def test_a_stalled_sink_loses_nothing(mqtt_broker):
    """With one-message batches and a sink that stalls the event loop for 0.5 s, the burst waits in the socket
    and every message is taken: the source drops nothing itself (queue_full stays 0)."""
    rng = np.random.default_rng(5)
    host, port = mqtt_broker
    topic = f"streamcorr-test/{uuid.uuid4().hex}/burst"
    lines = [json.dumps({"t": k * 0.01, "v": float(rng.normal())}).encode() for k in range(300)]
    stalled = [False]

    def slow_sink(channel: str, t: np.ndarray, v: np.ndarray) -> int:
        if not stalled[0]:  # block the event loop once, so the burst piles up in the socket
            stalled[0] = True
            import time

            time.sleep(0.5)
        return len(t)

    async def main() -> None:
        dec = PayloadDecoder()
        src = MqttSource(
            settings=MqttConnection(host=host, port=port), topics=[topic], decoder=dec, sink=slow_sink, queue_size=1
        )
        task = asyncio.create_task(src.run())
        await until(lambda: src.connected)
        await mosquitto_pub(host, port, topic, lines)
        await until(lambda: dec.counters.messages == len(lines), what="every message")
        await asyncio.sleep(0.2)  # nothing more may arrive
        await stop(task)
        assert stalled[0] and dec.counters.messages == len(lines) and dec.counters.queue_full == 0
        assert dec.counters.samples_decoded == dec.counters.messages == dec.counters.samples_handed

    asyncio.run(main())


def test_hostile_payloads_counted_exactly(mqtt_broker):
    """10k malformed and hostile messages through Mosquitto: no crash, every item counted, RSS bounded."""
    rng = np.random.default_rng(6)
    host, port = mqtt_broker
    prefix = f"hostile-{uuid.uuid4().hex}"
    corpus, want = hostile_corpus(rng, 10_000, prefix)

    async def main() -> None:
        eng = small_engine(channels=HOSTILE_CHANNELS, auto_add_channels=False)
        dec = PayloadDecoder(**HOSTILE_DECODER)  # type: ignore[arg-type]
        src = MqttSource(
            settings=MqttConnection(host=host, port=port), topics=[f"{prefix}/#"], decoder=dec, sink=eng.push
        )
        async with eng:
            task = asyncio.create_task(src.run())
            await until(lambda: src.connected)
            rss0 = vm_rss_bytes()
            async with aiomqtt.Client(host, port) as pub:
                for k, (topic, payload) in enumerate(corpus):
                    await pub.publish(topic.decode(), payload)
                    if k % 250 == 249:  # keep within Mosquitto's per-client queue: wait for the source
                        await until(lambda k=k: dec.counters.messages >= k - 250, what="source catching up")
            await until(lambda: dec.counters.messages == want.messages, timeout_s=20, what="all messages")
            await until(lambda: dec.counters.samples_handed == want.decoded, what="the last batch delivered")
            await eng.flush()
            rss_growth = vm_rss_bytes() - rss0
            await stop(task)
        c = dec.counters
        assert c.drops == dict(want.drops)
        assert (c.samples_decoded, c.samples_handed, c.samples_accepted) == (want.decoded, want.decoded, want.accepted)
        assert eng.counters.unknown_channel == want.unknown_samples
        assert (c.queue_full, c.sink_errors, c.disconnects) == (0, 0, 0)
        assert eng.counters.hops > 0  # the engine kept evaluating throughout
        assert rss_growth < RSS_BOUND_BYTES, f"RSS grew by {rss_growth / 2**20:.1f} MiB"

    asyncio.run(main())
