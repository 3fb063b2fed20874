"""Issue 10, classes 1-3, 5 and 6 below the daemon: names at the door, future stamps, the channel limit, byte
bounds on decoder caches, topics and ZeroMQ messages, and snapshots that cannot outgrow the envelope limit."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import time
import tracemalloc
import uuid

import aiomqtt
import msgpack
import numpy as np
import pytest
import zmq
import zmq.asyncio

from streamcorr.config import MqttConnection, parse_config
from streamcorr.engine.matrix import Snapshot
from streamcorr.errors import ConfigError, InputError
from streamcorr.ingest.mqtt import MqttSource
from streamcorr.ingest.payload import CACHE_BYTES, PayloadDecoder
from streamcorr.ingest.zmq import ZmqSource
from streamcorr.publish.envelope import MAX_ENVELOPE_BYTES, decode_message, encode_snapshot
from streamcorr.publish.mqtt_sink import MqttPublisher
from streamcorr.publish.zmq_sink import ZmqPublisher
from tests.brokers import small_engine, stop, until

BAD_NAMES = ["\ud800", "a\udfffb", "tab\there", "nl\n", "nul\x00", "zero\u200bwidth", "bidi\u202e", "x" * 257]


def _snapshot(names: tuple[str, ...], seq: int = 1) -> Snapshot:
    n = len(names)
    return Snapshot(seq, 10**9, time.time_ns(), names, np.full((n, n), 0.5), np.zeros((n, n)), np.ones((n, n)))


# -- class 1: names at the door ---------------------------------------------------------------------------
def test_names_that_are_not_printable_utf8_or_too_long_are_dropped_at_the_door():
    """Field and chunk channel names with lone surrogates, control or format characters, or over 256 bytes are
    counted as "name" drops, in JSON and msgpack alike; the good fields of the same message still decode."""
    rng = np.random.default_rng(10)
    dec = PayloadDecoder(channel_template="{key}")
    for bad in BAD_NAMES:
        out = dec.decode("dev", json.dumps({"t": 5.0, bad: 1.0, "ok": float(rng.normal())}).encode(), 0.0)
        assert [b.channel for b in out] == ["ok"]
    packable = [bad for bad in BAD_NAMES if not any("\ud800" <= c <= "\udfff" for c in bad)]
    chunk = {"t0": 1.0, "dt": 0.1, "channels": {bad: [1.0, 2.0] for bad in packable}}
    assert dec.decode("dev", msgpack.packb(chunk), 0.0) == []
    assert dec.counters.drops == {"name": len(BAD_NAMES) + 2 * len(packable)}
    # a name made bad by its topic (the template puts the topic in the name) is refused the same way
    dec2 = PayloadDecoder(channel_template="{topic}.{key}")
    assert dec2.decode("a\x1bb", b'{"x": 1.0}', 0.0) == [] and dec2.counters.drops == {"name": 1}


def test_engine_push_refuses_bad_names_and_counts_them():
    """Engine.push, the door for library users, refuses a bad name (counted as bad_name) without creating it."""
    np.random.default_rng(11)
    eng = small_engine(channels=["a", "b"])
    for bad in BAD_NAMES:
        assert eng.push(bad, np.array([1.0, 2.0]), np.array([0.0, 1.0])) == 0
    eng._sync_channels()
    assert eng.channels == ["a", "b"]
    assert eng.sample_drops()["bad_name"] == 2 * len(BAD_NAMES)


def test_config_refuses_unusable_names_and_more_names_than_the_channel_limit():
    """`channels.names` with a name that breaks the rule, or more names than max_channels, is a ConfigError naming
    the key (so `streamcorr check` catches it before a start)."""
    np.random.default_rng(14)
    base = {"version": 1, "sources": [{"type": "zmq", "endpoint": "tcp://127.0.0.1:5555"}]}
    for bad in BAD_NAMES:
        with pytest.raises(ConfigError, match="channels"):
            parse_config(base | {"channels": {"names": ["ok", bad]}})
    with pytest.raises(ConfigError, match="max_channels"):
        parse_config(base | {"channels": {"names": [f"c{k}" for k in range(300)]}})
    assert parse_config(base | {"channels": {"names": ["a", "b"], "max_channels": 2}}).channels.max_channels == 2


def test_zmq_publisher_counts_an_unencodable_snapshot_and_keeps_publishing():
    """A snapshot whose name cannot be encoded is refused (InputError), counted as dropped and logged; the next
    snapshot is sent."""
    np.random.default_rng(12)

    async def main() -> tuple[int, int, int]:
        async with ZmqPublisher(endpoint="tcp://127.0.0.1:*", snapshot_endpoint=None) as pub:
            with pytest.raises(InputError):
                await pub.publish_snapshot(_snapshot(("a", "\ud800")))
            await pub.publish_snapshot(_snapshot(("a", "b"), seq=2))
            return pub.counters.dropped["snapshot"], pub.counters.sent["snapshot"], pub._seq["snapshot"]

    assert asyncio.run(main()) == (1, 1, 1)


def test_mqtt_publisher_survives_an_unencodable_snapshot(mqtt_broker):
    """With a real Mosquitto: after a snapshot with an unencodable name the MQTT publisher is still running,
    counted the drop, and delivers the next snapshot."""
    np.random.default_rng(13)
    host, port = mqtt_broker
    prefix = f"hostile-{uuid.uuid4().hex[:8]}"

    async def main() -> tuple[bytes, int, bool]:
        async with aiomqtt.Client(host, port) as sub:
            await sub.subscribe(f"{prefix}/snapshot")
            async with MqttPublisher(settings=MqttConnection(host=host, port=port), prefix=prefix) as pub:
                assert await pub.wait_connected(10)
                with contextlib.suppress(InputError):
                    await pub.publish_snapshot(_snapshot(("a", "\ud800")))
                await asyncio.sleep(0.3)
                await pub.publish_snapshot(_snapshot(("a", "b"), seq=2))
                msg = await asyncio.wait_for(anext(aiomqtt_messages(sub)), 10)
                alive = pub.problem() is None
                dropped = pub.counters.dropped["snapshot"]
        async with aiomqtt.Client(host, port) as c:  # clear the retained messages of this test
            for stream in ("snapshot", "status"):
                await c.publish(f"{prefix}/{stream}", b"", retain=True)
        return bytes(msg.payload), dropped, alive  # type: ignore[arg-type]

    payload, dropped, alive = asyncio.run(main())
    assert decode_message(payload).body.channels == ("a", "b")  # type: ignore[union-attr]
    assert dropped == 1 and alive


async def aiomqtt_messages(client: aiomqtt.Client):  # type: ignore[no-untyped-def]
    async for message in client.messages:
        yield message


# -- class 2: samples from the future -------------------------------------------------------------------
def test_a_future_sample_neither_freezes_hops_nor_silences_its_channel():
    """A sample a year ahead and one an hour ahead are refused as "future"; hops go on at the stream's pace, and
    the channel that carried the hour-ahead sample keeps accepting its real samples."""
    rng = np.random.default_rng(20)
    eng = small_engine(channels=["a", "b"])
    now = float(int(time.time()))  # on the 10 Hz grid, so sample-and-hold sees every sample
    t = now - 30.0 + np.arange(300) / 10.0  # 30 s of live data at 10 Hz, ending now
    x = rng.standard_normal(300)
    y = x + 0.1 * rng.standard_normal(300)

    async def main() -> tuple[int, int]:
        async with eng:
            eng.push_frame(t[:100], {"a": x[:100], "b": y[:100]})
            await eng.flush()
            before = eng.counters.hops
            eng.push("a", now + 3600.0, 1.0)  # an hour ahead on a real channel
            eng.push("c", now + 31_536_000.0, 1.0)  # a year ahead on a new one
            for k in range(100, 300, 10):
                eng.push_frame(t[k : k + 10], {"a": x[k : k + 10], "b": y[k : k + 10]})
                await eng.flush()
            hops = eng.counters.hops
            assert eng.push("d", time.time() + 1.0, 0.0) == 1  # a little ahead: accepted, within the bound...
            assert (
                eng.intake.stream_ns is not None and eng.intake.stream_ns <= time.time_ns()
            )  # ...but stream time is capped
            return before, hops

    before, after = asyncio.run(main())
    drops = eng.sample_drops()
    assert drops["future"] == 2
    assert eng.channel_counters()["a"].late == 0 and eng.channel_counters()["a"].accepted == 300
    assert after - before >= 4  # 20 s of data after the attack at one hop per 3.2 s


# -- class 3: the channel limit -----------------------------------------------------------------------------
def test_a_flood_of_new_names_is_capped_and_the_configured_pair_is_still_evaluated(caplog):
    """1,000 new names fill the default channel limit (256, configured names included); the rest are counted as
    channel_limit, the log stays short (one burst of new-channel lines), and the configured pair is evaluated in
    the next hop."""
    rng = np.random.default_rng(30)
    eng = small_engine(channels=["a", "b"])
    now = float(int(time.time()))  # on the 10 Hz grid, so sample-and-hold sees every sample
    t = now - 10.0 + np.arange(100) / 10.0
    x = rng.standard_normal(100)

    async def main() -> None:
        async with eng:
            with caplog.at_level(logging.INFO, logger="streamcorr.engine.core"):
                for k in range(1000):
                    eng.push(f"flood{k}", now - 10.0, 1.0)
            eng.push_frame(t, {"a": x, "b": x + 0.1 * rng.standard_normal(100)})
            await eng.flush()

    asyncio.run(main())
    assert len(eng.channels) == 256 and eng.channels[:2] == ["a", "b"]
    assert eng.sample_drops()["channel_limit"] == 1000 - 254
    lines = [r.getMessage() for r in caplog.records if r.name == "streamcorr.engine.core"]
    named = [m for m in lines if m.startswith("new channel")]
    # each new name is a fact of its own, but a flood gets one burst of lines (the rest summarised), not 1,000
    assert 1 <= len(named) <= 20 and len(lines) - len(named) <= 4, lines
    assert eng.latest is not None and eng.latest.age_s[0, 1] == 0.0 and np.isfinite(eng.latest.mi[0, 1])


def test_auto_added_pairs_are_budgeted_per_hop_and_configured_pairs_come_first():
    """With many auto-added channels, each hop evaluates every configured pair plus at most auto_pairs_per_hop
    others, stalest first."""
    rng = np.random.default_rng(31)
    eng = small_engine(channels=["a", "b"], auto_pairs_per_hop=5)
    for k in range(10):
        eng.push(f"n{k}", 1.0, float(rng.normal()))
    eng._sync_channels()
    first = eng._next_pairs()
    eng._scheduler.mark_refreshed(first, 1)
    second = eng._next_pairs()
    pairs = eng._pairs
    assert tuple(pairs[first[0]]) == (0, 1) and tuple(pairs[second[0]]) == (0, 1)
    assert len(first) == len(second) == 6 and not set(first[1:]) & set(second[1:])


def test_auto_added_pairs_are_budgeted_with_screening_on():
    """With screening on, the network still takes every configured pair and at most auto_pairs_per_hop pairs
    with auto-added channels per hop; the screen assesses the others."""
    rng = np.random.default_rng(32)
    eng = small_engine(channels=["a", "b"], auto_pairs_per_hop=5, screening="on")
    names = ["a", "b", *(f"n{k}" for k in range(10))]
    t = 100.0 + np.arange(80) / 10
    x = rng.standard_normal(80)
    eng.push_frame(t, {n: (x if n in ("a", "b") else rng.standard_normal(80)) for n in names})
    eng.evaluate(round(t[-1] * 1e9))
    assert len(eng.channels) == 12 and len(eng._pairs) == 66
    network = eng.state.network_ns >= 0
    assert eng.counters.pairs_evaluated <= 6 and network[0, 1]  # the configured pair, and 5 others at most
    assert np.triu(network, 1).sum() - 1 <= 5


# -- class 5: byte bounds --------------------------------------------------------------------------------------
def test_decoder_caches_stay_within_their_byte_bound():
    """20,000 messages on distinct 1,000-byte topics (with seq numbers and 200-byte keys) leave the decoder
    holding about its cache bound, not every topic it ever saw."""
    np.random.default_rng(50)
    dec = PayloadDecoder(channel_template="{topic[0]}.{key}")
    key = "k" * 200
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.take_snapshot()
        for k in range(20_000):
            topic = f"{k:08d}" + "/" + "t" * 991
            dec.decode(topic, json.dumps({"seq": 1, "t": 1.0, key: 1.0}).encode(), 0.0)
        gc.collect()
        grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(base, "filename"))
    finally:
        tracemalloc.stop()
    assert dec.counters.samples_decoded == 20_000
    assert grown < 3 * CACHE_BYTES  # two caches of CACHE_BYTES each, plus slack for dict growth


def test_overlong_topics_are_dropped_whole():
    """A topic over max_topic_bytes (1024 by default) drops the whole message as "topic", before any caching."""
    np.random.default_rng(51)
    dec = PayloadDecoder()
    assert dec.decode("x" * 1025, b'{"a": 1.0, "b": 2.0}', 0.0) == []
    assert dec.decode("é" * 600, b"1.0", 0.0) == []  # 1,200 bytes in UTF-8
    assert dec.counters.drops == {"topic": 2} and not dec._names and not dec._last_seq


def test_mqtt_source_drops_long_topics_from_a_real_broker(mqtt_broker):
    """Messages on 20 KB topics, through Mosquitto, are counted as "topic" drops; a normal one still decodes."""
    np.random.default_rng(52)
    host, port = mqtt_broker
    prefix = f"hostile-{uuid.uuid4().hex[:8]}"
    got: list[str] = []

    def sink(channel: str, t: np.ndarray, v: np.ndarray) -> int:
        got.append(channel)
        return len(t)

    async def main() -> MqttSource:
        src = MqttSource(settings=MqttConnection(host=host, port=port), topics=[f"{prefix}/#"],
                         decoder=PayloadDecoder(), sink=sink)  # fmt: skip
        task = asyncio.create_task(src.run())
        await until(lambda: src.connected, 10, "connected")
        async with aiomqtt.Client(host, port) as c:
            for k in range(50):
                await c.publish(f"{prefix}/{k}/" + "z" * 20_000, b"1.0", qos=1)
            await c.publish(f"{prefix}/ok", b"2.0", qos=1)
        await until(lambda: src.counters.messages == 51, 10, "51 messages")
        await stop(task)
        return src

    src = asyncio.run(main())
    assert src.counters.drops == {"topic": 50} and got == [f"{prefix}/ok/value"]


def test_mqtt_batch_is_bounded_in_bytes_as_well_as_messages():
    """The MQTT source decodes a batch as soon as it holds queue_size messages or queue_bytes bytes, so no more
    waits undecoded, and it drops nothing itself."""
    np.random.default_rng(54)
    got: list[int] = []

    def sink(channel: str, t: np.ndarray, v: np.ndarray) -> int:
        got.append(len(t))
        return len(t)

    src = MqttSource(settings=MqttConnection(), topics=["x/#"], decoder=PayloadDecoder(), sink=sink,
                     queue_size=5, queue_bytes=100_000)  # fmt: skip
    for k in range(10):
        src._take("x/y", b"1" * 30_000)
        assert src.queue_depth <= 3 and sum(got) + src.queue_depth == k + 1  # 4 x 30 KB reach queue_bytes
    for _ in range(12):
        src._take("x/z", b"2")
        assert src.queue_depth < 5
    src._deliver()
    assert sum(got) == 22 and src.counters.queue_full == 0 and src.counters.messages == 22


def test_zmq_many_frame_message_is_read_a_frame_at_a_time():
    """A 40-frame message of 1 MB frames is dropped as "frames" without this process ever holding it whole, a
    two-frame message over max_message_bytes in all is "oversize", and a normal message still decodes."""
    np.random.default_rng(53)
    got: list[str] = []

    def sink(channel: str, t: np.ndarray, v: np.ndarray) -> int:
        got.append(channel)
        return len(t)

    async def main() -> tuple[ZmqSource, int]:
        ctx = zmq.asyncio.Context()
        src = ZmqSource(endpoint="tcp://127.0.0.1:*", mode="pull", bind=True, decoder=PayloadDecoder(),
                        sink=sink, context=ctx)  # fmt: skip
        task = asyncio.create_task(src.run())
        await src.ready.wait()
        push = ctx.socket(zmq.PUSH)
        assert src.bound_endpoint is not None
        push.connect(src.bound_endpoint)
        frame = b"\x00" * (1 << 20)
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            await push.send_multipart([frame] * 40, copy=False)
            await push.send_multipart([b"t" * 1000, b"1" * ((2 << 20) - 500)], copy=False)
            await push.send_multipart([b"dev", b"1.5"])
            await until(lambda: src.counters.messages == 3, 20, "3 messages")
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        push.close(linger=0)
        await stop(task)
        ctx.term()
        return src, peak

    src, peak = asyncio.run(main())
    assert src.counters.drops == {"frames": 1, "oversize": 1} and got == ["dev/value"]
    assert peak < 8 << 20  # one or two 1 MiB frames at a time, not 40


# -- class 6: snapshots within the envelope limit -------------------------------------------------------------
def test_a_snapshot_over_the_envelope_limit_is_refused_not_sent():
    """Names that would push a snapshot over MAX_ENVELOPE_BYTES make encoding raise InputError instead of producing
    a message every subscriber refuses; the ZeroMQ sink counts it and goes on."""
    np.random.default_rng(60)
    names = tuple(f"{k:02d}" + "n" * (2 << 20) for k in range(34))  # 68 MB of names
    with pytest.raises(InputError, match="exceed"):
        encode_snapshot(_snapshot(names))
    assert MAX_ENVELOPE_BYTES < 34 * (2 << 20)

    async def main() -> tuple[int, int]:
        async with ZmqPublisher(endpoint="tcp://127.0.0.1:*", snapshot_endpoint=None) as pub:
            with pytest.raises(InputError):
                await pub.publish_snapshot(_snapshot(names))
            await pub.publish_snapshot(_snapshot(("a", "b")))
            return pub.counters.dropped["snapshot"], pub.counters.sent["snapshot"]

    assert asyncio.run(main()) == (1, 1)


def test_megabyte_field_names_never_reach_a_snapshot():
    """A 1 MB field name is dropped at the door ("name"), so the engine's snapshot stays small."""
    rng = np.random.default_rng(61)
    dec = PayloadDecoder(channel_template="{key}")
    eng = small_engine()
    payload = json.dumps({"t": 5.0, "n" * 1_000_000: 1.0, "ok": float(rng.normal())}).encode()
    for batch in dec.decode("dev", payload, 0.0):
        eng.push(batch.channel, batch.t_s, batch.values)
    eng._sync_channels()
    assert dec.counters.drops == {"name": 1} and eng.channels == ["ok"]
    assert len(encode_snapshot(eng.state.snapshot(0, 0))) < 1024
