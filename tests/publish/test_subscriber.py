"""The Subscriber against real publishers: ZeroMQ on loopback, the Mosquitto broker, and a tiny real Engine."""

import asyncio
import dataclasses
import logging
import subprocess
import threading
import time

import numpy as np
import pytest
import zmq
import zmq.asyncio

from streamcorr.config import MqttConnection
from streamcorr.engine.changes import ChangeEvent
from streamcorr.engine.matrix import Snapshot
from streamcorr.errors import ConfigError, PublisherOffline, StreamcorrError, SubscriberTimeout
from streamcorr.publish.envelope import Status, encode_event, encode_status
from streamcorr.publish.mqtt_sink import MqttPublisher
from streamcorr.publish.sinks import forward
from streamcorr.publish.subscriber import Subscriber
from streamcorr.publish.zmq_sink import ZmqPublisher
from tests.helpers import ANY_PORT, connection, make_event, make_snapshot, until


def assert_same_snapshot(got: Snapshot, sent: Snapshot) -> None:
    """Equal up to the float32 of the wire."""
    assert (got.seq, got.t_ns, got.wall_ns, got.channels) == (sent.seq, sent.t_ns, sent.wall_ns, sent.channels)
    for name in ("mi", "age_s", "coverage"):
        np.testing.assert_array_equal(getattr(got, name), np.asarray(getattr(sent, name), dtype=np.float32))
    assert (got.dependent is None) == (sent.dependent is None) and (got.n_eff is None) == (sent.n_eff is None)
    if sent.dependent is not None:
        np.testing.assert_array_equal(got.dependent, sent.dependent)
    if sent.n_eff is not None:
        np.testing.assert_array_equal(got.n_eff, np.asarray(sent.n_eff, dtype=np.float32))


async def joined(pub: ZmqPublisher, sub: Subscriber) -> None:
    """Publish statuses until the subscriber hears one live (a fresh SUB misses what is sent before it joins)."""
    start = sub.counters.received["status"]
    for _ in range(300):
        await pub.publish_status("online", {})
        await asyncio.sleep(0.01)
        if sub.counters.received["status"] > start:
            return
    raise AssertionError("the subscriber never joined")


# -- ZeroMQ -----------------------------------------------------------------------------------------
def test_zmq_subscriber_receives_the_snapshots_and_events_that_were_published():
    """Snapshots (NaN and inf cells included) and events come out of the Subscriber equal to what went in."""
    rng = np.random.default_rng(20)

    async def main():
        async with (
            ZmqPublisher(endpoint=ANY_PORT, snapshot_endpoint=ANY_PORT) as pub,
            Subscriber(pub.endpoint, snapshot_url=pub.snapshot_endpoint) as sub,
        ):
            await joined(pub, sub)
            snaps = [make_snapshot(rng, n=5, seq=k) for k in range(1, 4)]
            events = [make_event(rng, k) for k in range(3)]
            for snap, ev in zip(snaps, events, strict=True):
                await pub.publish_snapshot(snap)
                await pub.publish_event(ev)
            got_snaps = [s async for s in sub.snapshots(quiet_s=1)]
            got_events = [e async for e in sub.events(quiet_s=0.2)]
            status = sub.status()
            return snaps, events, got_snaps, got_events, status, sub.counters

    snaps, events, got_snaps, got_events, status, counters = asyncio.run(main())
    assert len(got_snaps) == 3 and got_events == events
    for got, sent in zip(got_snaps, snaps, strict=True):
        assert_same_snapshot(got, sent)
    assert np.isnan(got_snaps[0].mi[0, 0]) and np.isinf(got_snaps[0].age_s[0, -1])
    assert isinstance(status, Status) and status.state == "online"
    assert counters.gaps["snapshot"] == counters.gaps["event"] == 0 and counters.bad == 0


def test_zmq_late_joiner_gets_the_latest_snapshot_from_the_cache_once():
    """A subscriber that starts after three snapshots gets the third at once, then the live ones, no repeats."""
    rng = np.random.default_rng(21)

    async def main():
        async with ZmqPublisher(endpoint=ANY_PORT, snapshot_endpoint=ANY_PORT) as pub:
            snaps = [make_snapshot(rng, seq=k) for k in range(1, 5)]
            for snap in snaps[:3]:
                await pub.publish_snapshot(snap)
            async with Subscriber(pub.endpoint, snapshot_url=pub.snapshot_endpoint) as sub:
                first = await anext(sub.snapshots(timeout_s=2))
                await joined(pub, sub)
                await pub.publish_snapshot(snaps[3])
                rest = [s async for s in sub.snapshots(quiet_s=0.5)]
                return snaps, first, rest, sub.counters

    snaps, first, rest, counters = asyncio.run(main())
    assert_same_snapshot(first, snaps[2])
    assert [s.seq for s in rest] == [4]
    assert counters.late_joins == 1 and counters.gaps["snapshot"] == 0 and counters.received["snapshot"] == 2


def test_zmq_subscriber_keeps_significance_and_initial_live_and_from_the_cache():
    """The detector's verdict and n_eff reach a late joiner's cached snapshot (origin "retained") and the live
    ones, and an initial became-dependent event arrives marked initial."""
    rng = np.random.default_rng(30)

    def judged(seq: int) -> Snapshot:
        snap = make_snapshot(rng, n=4, seq=seq)
        dependent = np.triu(rng.random((4, 4)) < 0.5, 1)
        n_eff = rng.uniform(20, 1024, (4, 4))
        return dataclasses.replace(snap, dependent=dependent | dependent.T, n_eff=(n_eff + n_eff.T) / 2)

    async def main():
        async with ZmqPublisher(endpoint=ANY_PORT, snapshot_endpoint=ANY_PORT) as pub:
            snaps = [judged(1), judged(2)]
            await pub.publish_snapshot(snaps[0])
            async with Subscriber(pub.endpoint, snapshot_url=pub.snapshot_endpoint) as sub:
                first = await anext(sub.snapshots(timeout_s=2))
                await joined(pub, sub)
                await pub.publish_snapshot(snaps[1])
                await pub.publish_event(ChangeEvent(("ch0", "ch1"), 0.0, 0.7, 2, "became-dependent", initial=True))
                live = await anext(sub.snapshots(timeout_s=2))
                ev = await anext(sub.events(timeout_s=2))
                return snaps, first, live, ev

    snaps, first, live, ev = asyncio.run(main())
    assert first.origin == "retained" and live.origin == "live"
    assert_same_snapshot(first, snaps[0])
    assert_same_snapshot(live, snaps[1])
    assert first.dependent is not None and first.dependent.dtype == bool
    assert ev.kind == "became-dependent" and ev.initial is True


def test_zmq_late_join_without_a_cache_times_out_and_carries_on():
    """When nothing answers on snapshot_url the subscriber logs, counts, and still receives live messages."""
    rng = np.random.default_rng(22)

    async def main():
        async with ZmqPublisher(endpoint=ANY_PORT, snapshot_endpoint=None) as pub:
            silent = "tcp://127.0.0.1:9"  # discard port: nothing listens there
            async with Subscriber(pub.endpoint, snapshot_url=silent, request_timeout_s=0.2) as sub:
                await joined(pub, sub)
                await pub.publish_event(make_event(rng))
                got = [e async for e in sub.events(quiet_s=1)]
                return got, sub.counters

    got, counters = asyncio.run(main())
    assert len(got) == 1 and counters.late_join_failures == 1 and counters.late_joins == 0


def test_zmq_gaps_restarts_and_bad_payloads_are_counted_not_fatal():
    """Skipped seqs count as gaps, a seq that goes back as a restart; garbage and odd frames are counted and skipped."""
    rng = np.random.default_rng(23)

    async def main():
        ctx = zmq.asyncio.Context()
        pub = ctx.socket(zmq.PUB)
        pub.bind(ANY_PORT)
        endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
        async with Subscriber(endpoint, late_join=False, context=ctx) as sub:
            for k in range(300):  # join: until a status is heard
                await pub.send_multipart([b"streamcorr/status", encode_status("online", {}, seq=k + 1)])
                await asyncio.sleep(0.01)
                if sub.status() is not None:
                    break
            sent = []
            for seq in (1, 2, 5, 6, 1):
                ev = make_event(rng, seq)
                sent.append(ev)
                await pub.send_multipart([b"streamcorr/event", encode_event(ev, seq=seq)])
            await pub.send_multipart([b"streamcorr/event", b"\xc1 not msgpack"])
            await pub.send_multipart([b"streamcorr/event", encode_status("online", {}, seq=9)])  # wrong kind
            await pub.send_multipart([b"streamcorr/event", b"x", b"three frames"])
            await pub.send_multipart([b"streamcorr/eventual", encode_event(sent[0], seq=99)])  # other topic
            await pub.send_multipart([b"streamcorr/event", encode_event(sent[0], seq=2)])
            got = [e async for e in sub.events(quiet_s=1)]
            counters = sub.counters
        pub.close(0)
        ctx.term()
        return sent, got, counters

    sent, got, counters = asyncio.run(main())
    assert got == [*sent, sent[0]]
    assert counters.gaps["event"] == 2  # 3 and 4
    assert counters.restarts == 1  # 6 -> 1
    assert counters.bad == 3


def test_zmq_a_slow_subscriber_loses_messages_to_the_hwm_and_counts_every_one():
    """With small high-water marks and a busy consumer, every snapshot seq is either received or counted in gaps,
    and every received one is either consumed or counted as dropped from the queue."""
    rng = np.random.default_rng(24)
    big = make_snapshot(rng, n=256)  # ~0.8 MB per message: socket buffers fill after a few

    async def main():
        async with (
            ZmqPublisher(endpoint=ANY_PORT, snapshot_endpoint=None, sndhwm=2) as pub,
            Subscriber(pub.endpoint, late_join=False, queue_size=2) as sub,
        ):
            await joined(pub, sub)
            for _ in range(40):  # no yield to the loop in between: the subscriber cannot keep up
                await pub.publish_snapshot(big)
            # losses after the last snapshot received are invisible until a later one arrives: once the burst
            # has drained, one more makes every lost seq a counted gap
            await asyncio.sleep(0.5)
            await pub.publish_snapshot(make_snapshot(rng, n=4))
            consumed = [len(s.channels) async for s in sub.snapshots(quiet_s=1)]
            return consumed, sub.counters

    consumed, counters = asyncio.run(main())
    received, gaps = counters.received["snapshot"], counters.gaps["snapshot"]
    assert len(consumed) + counters.dropped["snapshot"] == received
    assert consumed[-1] == 4  # the last one, the small snapshot sent after the burst drained
    assert received + gaps == 41  # every seq accounted for


def test_pairs_subscriber_gets_sparse_snapshots_from_the_pairs_topic():
    """Subscribing to "pairs" yields snapshots with only the top-k cells set."""
    rng = np.random.default_rng(25)

    async def main():
        async with ZmqPublisher(endpoint=ANY_PORT, snapshot_endpoint=ANY_PORT, top_k=2) as pub:
            snap = make_snapshot(rng, n=5)
            await pub.publish_snapshot(snap)
            async with Subscriber(pub.endpoint, snapshot_url=pub.snapshot_endpoint, streams=("pairs",)) as sub:
                got = await anext(sub.snapshots(timeout_s=2))
            return snap, got

    snap, got = asyncio.run(main())
    mi32 = snap.mi.astype(np.float32)
    top = np.sort(mi32[np.triu_indices(5, 1)])[-2:]
    assert np.array_equal(np.sort(got.mi[np.triu_indices(5, 1)][np.isfinite(got.mi[np.triu_indices(5, 1)])]), top)


def test_consumer_queue_keeps_the_newest_and_counts_what_it_drops(caplog):
    """A consumer that does not read keeps the newest queue_size events; the older ones are counted as dropped,
    and logged only once the stream is being iterated (a stream nobody reads fills up quietly)."""
    rng = np.random.default_rng(26)
    caplog.set_level(logging.WARNING, logger="streamcorr.subscriber")

    async def main():
        async with (
            ZmqPublisher(endpoint=ANY_PORT, snapshot_endpoint=None) as pub,
            Subscriber(pub.endpoint, late_join=False, queue_size=3) as sub,
        ):
            await joined(pub, sub)
            events = [make_event(rng, k) for k in range(10)]
            for ev in events:
                await pub.publish_event(ev)
            await until(lambda: sub.counters.received["event"] == 10)
            quiet = [r for r in caplog.records if "queue full" in r.getMessage()]
            got = [e async for e in sub.events(quiet_s=0.1)]
            for ev in events:  # now iterated: an overflow is logged
                await pub.publish_event(ev)
            await until(lambda: sub.counters.received["event"] == 20)
            return events, got, sub.counters, quiet

    events, got, counters, quiet = asyncio.run(main())
    assert got == events[-3:] and counters.dropped["event"] == 14
    assert quiet == [] and any("event queue full" in r.getMessage() for r in caplog.records)


@pytest.mark.slow  # the Engine's null calibration (2,000 windows): 8-32 s measured on the shared 2-core machine
def test_engine_to_zmq_sink_to_subscriber_gives_the_engines_own_snapshots():
    """A tiny real Engine, forwarded to a ZmqPublisher, reaches the Subscriber with the engine's values."""
    from streamcorr.engine.core import Engine, EngineConfig

    rng = np.random.default_rng(27)
    n = 400
    a = rng.standard_normal(n)
    b = np.where(np.arange(n) < 120, rng.standard_normal(n), a + 0.1 * rng.standard_normal(n))
    c = rng.standard_normal(n)

    async def main():
        eng = Engine(EngineConfig(channels=["a", "b", "c"], window_len=64, hop_samples=32, rate_hz=10,
                                  skip_stale_hops=False, queue_size=100, false_alarm_rate=0.05))  # fmt: skip
        async with (
            eng,
            ZmqPublisher(endpoint=ANY_PORT, snapshot_endpoint=ANY_PORT) as pub,
            Subscriber(pub.endpoint, snapshot_url=pub.snapshot_endpoint, queue_size=100) as sub,
        ):
            await joined(pub, sub)
            mine: list = []
            theirs: list = []

            async def collect(it, out):
                async for item in it:
                    out.append(item)

            tasks = [
                asyncio.create_task(forward(eng, pub, status_interval_s=None)),
                asyncio.create_task(collect(eng.snapshots(), mine)),
                asyncio.create_task(collect(eng.events(), theirs)),
            ]
            await asyncio.sleep(0.05)  # let the subscriptions to the engine start
            for k in range(n):
                eng.push_frame(k / 10, {"a": a[k], "b": b[k], "c": c[k]})
                if k % 50 == 0:
                    await eng.flush()
            await eng.flush()
            got = [s async for s in sub.snapshots(quiet_s=1)]
            got_events = [e async for e in sub.events(quiet_s=0.2)]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return mine, theirs, got, got_events, sub.counters

    mine, theirs, got, got_events, counters = asyncio.run(main())
    assert len(mine) >= 8 and [s.seq for s in got] == [s.seq for s in mine]
    for g, m in zip(got, mine, strict=True):
        assert_same_snapshot(g, m)
    assert got[-1].mi[0, 1] > 0.5 and got[-1].channels == ("a", "b", "c")
    # every event the engine raised reaches the subscriber; the a-b onset is among them. At this test's loose
    # false-alarm rate (0.05) on 64-sample windows an independent pair may raise a chance event too: their
    # rate is bench.chance_events' measure, not this transport test's
    assert [e.kind for e in theirs if e.pair == ("a", "b")] == ["became-dependent"] and got_events == theirs
    assert counters.gaps["snapshot"] == 0


# -- MQTT -------------------------------------------------------------------------------------------
def test_mqtt_late_subscriber_gets_the_retained_snapshot_then_live_ones(mqtt_broker, prefix):
    """A subscriber arriving after two snapshots gets the second (retained) at once, then the next live one."""
    rng = np.random.default_rng(28)
    url = f"mqtt://{mqtt_broker[0]}:{mqtt_broker[1]}"

    async def main():
        snaps = [make_snapshot(rng, seq=k) for k in range(1, 4)]
        qos1 = connection(mqtt_broker, qos=1)  # publish() returns once the broker has the message
        async with MqttPublisher(settings=qos1, prefix=prefix) as pub:
            assert await pub.wait_connected(5)
            for snap in snaps[:2]:
                await pub.publish_snapshot(snap)
                await until(lambda s=snap: pub.counters.sent["snapshot"] == s.seq)
            async with Subscriber(url, prefix=prefix) as sub:
                first = await anext(sub.snapshots(timeout_s=3))
                await pub.publish_snapshot(snaps[2])
                second = await anext(sub.snapshots(timeout_s=3))
                await until(lambda: sub.status() is not None)
                return snaps, first, second, sub.status(), sub.counters

    snaps, first, second, status, counters = asyncio.run(main())
    assert_same_snapshot(first, snaps[1])
    assert_same_snapshot(second, snaps[2])
    assert status.state == "online"
    assert counters.connects == 1 and counters.gaps["snapshot"] == 0


def test_a_publisher_going_offline_ends_timeout_and_quiet_iterators_at_once_and_others_wait(mqtt_broker, prefix):
    """A clean stop's "offline" status: an iterator with timeout_s yields what came before it, then raises
    PublisherOffline at once (not after the timeout); one with quiet_s ends; one with neither waits and gets the
    snapshots of the publisher that comes back."""
    rng = np.random.default_rng(41)
    url = f"mqtt://{mqtt_broker[0]}:{mqtt_broker[1]}"
    qos1 = connection(mqtt_broker, qos=1)
    timed, quiet, waiting = [], [], []

    async def drain(it, into):
        async for item in it:
            into.append(item)

    async def main():
        async with (
            Subscriber(url, prefix=prefix) as sub_t,
            Subscriber(url, prefix=prefix) as sub_q,
            Subscriber(url, prefix=prefix) as sub_w,
        ):
            tasks = [asyncio.create_task(drain(it, into)) for it, into in (
                (sub_t.snapshots(timeout_s=60), timed), (sub_q.events(quiet_s=60), quiet), (sub_w.snapshots(), waiting),
            )]  # fmt: skip
            pub = MqttPublisher(settings=qos1, prefix=prefix)
            await pub.start()
            assert await pub.wait_connected(5)
            for k in (1, 2):
                await pub.publish_snapshot(make_snapshot(rng, seq=k))
                await until(lambda k=k: pub.counters.sent["snapshot"] == k)
            await pub.publish_event(make_event(rng))
            await until(lambda: pub.counters.sent["event"] == 1)
            await pub.stop()
            stopped = time.monotonic()
            with pytest.raises(PublisherOffline) as exc:
                await tasks[0]
            await tasks[1]
            ended_s = time.monotonic() - stopped
            assert not tasks[2].done()
            async with MqttPublisher(settings=qos1, prefix=prefix) as back:
                assert await back.wait_connected(5)
                await back.publish_snapshot(make_snapshot(rng, seq=7))
                await until(lambda: any(s.seq == 7 for s in waiting), timeout_s=10)
            tasks[2].cancel()
            return exc.value, ended_s

    exc, ended_s = asyncio.run(main())
    assert ended_s < 10, ended_s  # not the 60 s timeout
    assert isinstance(exc, SubscriberTimeout) and exc.stream == "snapshot" and "went offline" in str(exc)
    assert [s.seq for s in timed] == [1, 2] and len(quiet) == 1
    assert [s.seq for s in waiting][:2] == [1, 2]


def write_envelopes(tmp_path, items) -> list[str]:
    paths = []
    for k, payload in enumerate(items):
        path = tmp_path / f"m{k}.bin"
        path.write_bytes(payload)
        paths.append(str(path))
    return paths


def test_blocking_iterator_in_a_plain_script_sees_cli_published_events_and_their_gaps(mqtt_broker, prefix, tmp_path):
    """No asyncio in sight: `with Subscriber(...)` + iter_events() gets what mosquitto_pub sends, gaps counted."""
    rng = np.random.default_rng(29)
    events = [ChangeEvent(("x", "y"), float(rng.random()), float(rng.random()), k, "fall") for k in range(4)]
    payloads = [encode_event(ev, seq=s) for ev, s in zip(events, (1, 2, 6, 7), strict=True)]
    files = write_envelopes(tmp_path, [payloads[0], b"garbage", *payloads[1:]])
    with Subscriber(f"mqtt://{mqtt_broker[0]}:{mqtt_broker[1]}", prefix=prefix, streams=("event",)) as sub:
        assert sub.ready
        for path in files:
            subprocess.run(["mosquitto_pub", "-h", mqtt_broker[0], "-p", str(mqtt_broker[1]),
                            "-t", f"{prefix}/event", "-f", path], check=True, timeout=10)  # fmt: skip
        got = list(sub.iter_events(quiet_s=2))
    assert got == events
    assert sub.gaps["event"] == 3 and sub.counters.bad == 1


def test_close_ends_a_blocking_iterator_waiting_in_another_thread(mqtt_broker, prefix):
    """close() from the main thread ends an iter_snapshots() loop blocked in a worker thread."""
    np.random.default_rng(30)
    sub = Subscriber(f"mqtt://{mqtt_broker[0]}:{mqtt_broker[1]}", prefix=prefix)
    sub.start_background()
    done = threading.Event()

    def consume() -> None:
        for _ in sub.iter_snapshots():  # no timeout: only close() ends it
            pass
        done.set()

    worker = threading.Thread(target=consume)
    worker.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    sub.close()
    assert done.wait(3) and time.monotonic() - t0 < 3
    worker.join()
    with pytest.raises(ConfigError, match="already used through"):
        asyncio.run(sub.start())


def test_mqtt_subscriber_reconnects_after_a_broker_restart_and_skips_the_repeated_retained(private_broker):
    """After the broker returns the subscriber resubscribes; the retained snapshot it already had is not repeated."""
    rng = np.random.default_rng(31)
    port, start, stop = private_broker
    fast = MqttConnection(reconnect_min_s=0.05, reconnect_max_s=0.2)

    async def main():
        sub = Subscriber(f"mqtt://127.0.0.1:{port}", settings=fast, prefix="plant", streams=("snapshot",))
        pub_settings = MqttConnection(host="127.0.0.1", port=port, reconnect_min_s=0.05)
        async with MqttPublisher(settings=pub_settings, prefix="plant") as pub, sub:
            await pub.publish_snapshot(make_snapshot(rng, seq=1))
            first = await anext(sub.snapshots(timeout_s=3))
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, stop)
            await until(lambda: not sub.ready)
            await loop.run_in_executor(None, start)  # no persistence: the broker forgets the retained one
            await until(lambda: sub.ready and pub.connected)
            await pub.publish_snapshot(make_snapshot(rng, seq=2))
            second = await anext(sub.snapshots(timeout_s=3))
        return first, second, sub.counters

    first, second, counters = asyncio.run(main())
    assert (first.seq, second.seq) == (1, 2)
    assert counters.connects == 2 and counters.disconnects == 1 and counters.gaps["snapshot"] == 0


def test_a_timeout_raises_subscriber_timeout_and_quiet_s_or_close_end_the_stream():
    """timeout_s without a message raises SubscriberTimeout (a TimeoutError naming the stream and the wait), in
    plain scripts and under asyncio; quiet_s ends the iteration quietly; close() ends it without an error."""
    rng = np.random.default_rng(33)

    async def main():
        async with (
            ZmqPublisher(endpoint=ANY_PORT, snapshot_endpoint=None) as pub,
            Subscriber(pub.endpoint, late_join=False) as sub,
        ):
            await joined(pub, sub)
            await pub.publish_event(make_event(rng))
            first = await anext(sub.events(timeout_s=2))
            with pytest.raises(SubscriberTimeout) as exc:
                await anext(sub.events(timeout_s=0.2))
            quiet = [s async for s in sub.snapshots(quiet_s=0.2)]
            return first, exc.value, quiet

    first, timeout, quiet = asyncio.run(main())
    assert first is not None and quiet == []
    assert isinstance(timeout, TimeoutError) and (timeout.stream, timeout.timeout_s) == ("event", 0.2)
    assert "no event from tcp://" in str(timeout) and "1 received so far" in str(timeout), timeout

    with Subscriber("tcp://127.0.0.1:9", late_join=False) as sub:  # discard port: nothing publishes there
        with pytest.raises(SubscriberTimeout, match=r"no snapshot .* within timeout_s=0\.3 s"):
            for _ in sub.iter_snapshots(timeout_s=0.3):
                pass
        assert list(sub.iter_events(quiet_s=0.2)) == []
        ended = threading.Event()

        def consume() -> None:
            for _ in sub.iter_snapshots(timeout_s=30):  # close() ends it long before the timeout
                pass
            ended.set()

        worker = threading.Thread(target=consume)
        worker.start()
        time.sleep(0.1)
    assert ended.wait(3)  # __exit__ closed it: StopIteration, not SubscriberTimeout
    worker.join()


def test_an_iterator_raises_what_stopped_the_client(monkeypatch):
    """A client that stops on an unexpected error ends each iterator with a StreamcorrError from that error, not
    with the silent end that close() gives."""
    np.random.default_rng(34)
    import streamcorr.publish.subscriber as subscriber_module

    async def broken(*args, **kwargs):
        args[3].set()  # ready, then a bug in the receive loop
        await asyncio.sleep(0.1)
        raise RuntimeError("decoder bug")

    monkeypatch.setattr(subscriber_module, "receive_zmq", broken)
    sub = Subscriber("tcp://127.0.0.1:9", late_join=False)
    with sub, pytest.raises(StreamcorrError, match="stopped: decoder bug") as exc:
        list(sub.iter_snapshots(timeout_s=5))
    assert isinstance(exc.value.__cause__, RuntimeError)


def test_timeout_s_and_quiet_s_are_checked_when_the_iterator_is_made():
    """Both at once, zero, negative or non-numeric waits are ConfigErrors naming the fix, before any wait."""
    np.random.default_rng(35)
    sub = Subscriber("tcp://127.0.0.1:9", late_join=False)
    for kwargs, message in [
        ({"timeout_s": 1, "quiet_s": 1}, "not both"),
        ({"timeout_s": 0}, "timeout_s must be a positive"),
        ({"quiet_s": -1.0}, "quiet_s must be a positive"),
        ({"timeout_s": "5"}, "timeout_s must be a positive"),
    ]:
        with pytest.raises(ConfigError, match=message):
            sub.iter_snapshots(**kwargs)
        with pytest.raises(ConfigError, match=message):
            sub.events(**kwargs)
    assert sub._mode is None  # nothing was started


def test_subscriber_rejects_bad_configuration_and_unstarted_use():
    """Unknown schemes, ports, streams and mixed settings are refused; iterating before start says what to do."""
    np.random.default_rng(32)
    for kwargs, message in [
        ({"url": "http://x:1"}, "url must start with"),
        ({"url": "tcp://127.0.0.1"}, "needs a port"),
        ({"url": "mqtt://host:notaport"}, "bad port"),
        ({"url": "tcp://h:1", "settings": MqttConnection()}, "MQTT options"),
        ({"url": "tcp://h:1", "streams": ("snapshot", "pairs")}, "not both"),
        ({"url": "tcp://h:1", "streams": ("matrix",)}, "streams must be"),
        ({"url": "tcp://h:1", "queue_size": 0}, "queue_size"),
        ({"url": "tcp://h:1", "prefix": "a/+/b"}, "prefix"),
    ]:
        with pytest.raises(ConfigError, match=message):
            Subscriber(**kwargs)
    sub = Subscriber("mqtts://user:pw@broker.example", settings=MqttConnection(qos=1))
    assert sub.settings is not None and sub.settings.port == 8883 and sub.settings.tls is not None
    assert (sub.settings.username, sub.settings.password, sub.settings.qos) == ("user", "pw", 1)

    async def iterate_unstarted():
        async for _ in sub.snapshots():
            pass

    with pytest.raises(StreamcorrError, match="start the subscriber first"):
        asyncio.run(iterate_unstarted())

    async def start_bad_endpoint():
        async with Subscriber("tcp://*:5556", late_join=False):
            pass

    with pytest.raises(ConfigError, match="cannot connect to tcp://"):
        asyncio.run(start_bad_endpoint())
