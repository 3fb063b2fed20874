"""The daemon end to end: real Mosquitto, real ZeroMQ sockets, the Subscriber, and an in-process reference."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from typing import Any

import msgpack
import numpy as np
import pytest
import yaml
import zmq

from streamcorr.config import parse_config
from streamcorr.daemon.service import Daemon
from streamcorr.engine.core import Engine
from streamcorr.engine.settings import EngineConfig
from streamcorr.errors import ConfigError
from streamcorr.publish.subscriber import Subscriber
from tests.brokers import PrivateBroker, free_port, pearson_blind_rig
from tests.helpers import daemon_process, wait_for, zmq_fed_daemon

RATE = 10.0
CHANNELS = ["a", "b", "c"]


def _chunks(t: np.ndarray, v: np.ndarray, per: int = 10) -> list[dict[str, Any]]:
    return [
        {"t": t[k : k + per].tolist(), "channels": {ch: v[c, k : k + per].tolist() for c, ch in enumerate(CHANNELS)}}
        for k in range(0, len(t), per)
    ]


def _config(source: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": 1,
        "sources": [source],
        "channels": {"names": CHANNELS, "rate_hz": RATE, "max_staleness_s": 0.05},
        "window": {"samples": 64, "hop_samples": 16, "skip_stale_hops": False},
        "outputs": {**outputs, "status_interval_s": 0.5},
        "http": {"port": 0},
        "logging": {"format": "text"},
    }


async def _reference(cfg_dict: dict[str, Any], t: np.ndarray, v: np.ndarray) -> tuple[dict[int, Any], list[Any]]:
    """Snapshots by stream time and events of an in-process engine fed the same chunks."""
    eng = Engine(EngineConfig.from_config(parse_config(cfg_dict)))
    snaps: dict[int, Any] = {}
    events: list[Any] = []

    async def collect_snaps() -> None:
        async for s in eng.snapshots():
            snaps[s.t_ns] = s

    async def collect_events() -> None:
        async for e in eng.events():
            events.append(e)

    async with eng:
        tasks = [asyncio.create_task(collect_snaps()), asyncio.create_task(collect_events())]
        await asyncio.sleep(0)
        for ch in _chunks(t, v):
            eng.push_frame(np.array(ch["t"]), {k: np.array(x) for k, x in ch["channels"].items()})
            await eng.flush()
        await asyncio.sleep(0.05)
        for task in tasks:
            task.cancel()
    return snaps, events


async def _drain(sub: Subscriber, snaps: list[Any], events: list[Any], quiet_s: float = 3.0) -> None:
    async def take_snaps() -> None:
        async for s in sub.snapshots(quiet_s=quiet_s):
            snaps.append(s)

    async def take_events() -> None:
        async for e in sub.events(quiet_s=quiet_s):
            events.append(e)

    await asyncio.gather(take_snaps(), take_events())


def _assert_ledger_and_same(
    daemon: Daemon, received: list[Any], events: list[Any], ref_snaps: dict[int, Any], ref_events: list[Any]
) -> None:
    c = daemon.sources[0][1].counters
    assert c.messages == 60 and c.dropped == 0 and c.samples_accepted == 3 * 600
    _assert_same(received, events, ref_snaps, ref_events)


def _assert_same(received: list[Any], events: list[Any], ref_snaps: dict[int, Any], ref_events: list[Any]) -> None:
    assert len(received) >= 5
    for s in received:
        ref = ref_snaps[s.t_ns]
        assert s.channels == ref.channels
        np.testing.assert_allclose(s.mi, ref.mi.astype(np.float32), rtol=1e-6, atol=1e-7)  # float32 on the wire
    got = [(e.pair, e.kind, e.t_ns) for e in events]
    assert got == [(e.pair, e.kind, e.t_ns) for e in ref_events]
    assert ("a", "b") in {e.pair for e in events if e.kind == "became-dependent"}
    assert all("c" not in e.pair for e in events)


def test_mqtt_end_to_end_with_mosquitto_pub(mqtt_broker):
    """Chunks sent with the mosquitto_pub CLI reach the daemon; a Subscriber gets snapshots and events equal to
    those of an in-process engine fed the same data."""
    host, port = mqtt_broker
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    t, v = pearson_blind_rig(60)
    source = {"type": "mqtt", "host": host, "port": port, "topics": [f"{prefix}/in/#"], "channel_template": "{key}"}
    cfg_dict = _config(source, {"mqtt": {"host": host, "port": port, "prefix": f"{prefix}/out"}})
    ref_snaps, ref_events = asyncio.run(_reference(cfg_dict, t, v))

    async def main() -> tuple[list[Any], list[Any], Daemon]:
        daemon = Daemon(parse_config(cfg_dict))
        run = asyncio.create_task(daemon.run(install_signals=False))
        received: list[Any] = []
        events: list[Any] = []
        async with Subscriber(f"mqtt://{host}:{port}", prefix=f"{prefix}/out", late_join=False) as sub:
            while not daemon.sources[0][1].connected:
                await asyncio.sleep(0.05)
            drain = asyncio.create_task(_drain(sub, received, events))
            pub = await asyncio.create_subprocess_exec(
                "mosquitto_pub", "-h", host, "-p", str(port), "-q", "1", "-t", f"{prefix}/in/rig", "-l",
                stdin=asyncio.subprocess.PIPE,
            )  # fmt: skip
            assert pub.stdin is not None
            for chunk in _chunks(t, v):  # paced like a live sensor, so no window is overwritten before evaluation
                pub.stdin.write((json.dumps(chunk) + "\n").encode())
                await pub.stdin.drain()
                await asyncio.sleep(0.05)
            pub.stdin.close()
            await pub.wait()
            assert pub.returncode == 0
            await drain
        daemon.stop()
        await run
        return received, events, daemon

    received, events, daemon = asyncio.run(main())
    _assert_ledger_and_same(daemon, received, events, ref_snaps, ref_events)


def test_zmq_end_to_end_with_pyzmq_push():
    """msgpack chunks PUSHed with pyzmq reach the daemon; the ZeroMQ Subscriber sees the in-process results."""
    t, v = pearson_blind_rig(60, seed=1)
    p_in, p_out, p_last = free_port(), free_port(), free_port()
    source = {
        "type": "zmq",
        "endpoint": f"tcp://127.0.0.1:{p_in}",
        "mode": "pull",
        "bind": True,
        "channel_template": "{key}",
    }
    out = {"zmq": {"endpoint": f"tcp://127.0.0.1:{p_out}", "snapshot_endpoint": f"tcp://127.0.0.1:{p_last}"}}
    cfg_dict = _config(source, out)
    ref_snaps, ref_events = asyncio.run(_reference(cfg_dict, t, v))

    async def main() -> tuple[list[Any], list[Any], Daemon]:
        daemon = Daemon(parse_config(cfg_dict))
        run = asyncio.create_task(daemon.run(install_signals=False))
        await asyncio.sleep(0.5)
        received: list[Any] = []
        events: list[Any] = []
        async with Subscriber(f"tcp://127.0.0.1:{p_out}", late_join=False) as sub:
            await asyncio.sleep(0.3)  # PUB/SUB: let the subscription reach the publisher
            drain = asyncio.create_task(_drain(sub, received, events))
            ctx = zmq.Context.instance()
            push = ctx.socket(zmq.PUSH)
            push.connect(f"tcp://127.0.0.1:{p_in}")
            for ch in _chunks(t, v):
                push.send_multipart([b"rig", msgpack.packb(ch)])
                await asyncio.sleep(0.05)
            push.close(linger=2000)
            await drain
        daemon.stop()
        await run
        return received, events, daemon

    received, events, daemon = asyncio.run(main())
    _assert_ledger_and_same(daemon, received, events, ref_snaps, ref_events)


def test_broker_restart_daemon_reconnects_and_counts_the_gap(tmp_path):
    """A private Mosquitto stopped and restarted mid-run: the daemon reconnects source and sink, resumes
    publishing, counts the lost messages by their seq numbers, and never exits."""
    broker = PrivateBroker(tmp_path)
    broker.start()
    prefix = f"restart-{uuid.uuid4().hex[:8]}"
    t, v = pearson_blind_rig(120, seed=2)
    chunks = _chunks(t, v)
    source = {
        "type": "mqtt", "port": broker.port, "topics": [f"{prefix}/in"], "channel_template": "{key}",
        "reconnect_min_s": 0.1, "reconnect_max_s": 0.5,
    }  # fmt: skip
    # a publisher that was writing as the broker went away can miss the disconnect (aiomqtt adds a writer for the
    # closed socket) and learns of it only when a publish goes unacknowledged for timeout_s: keep that below the
    # subscriber's 3 s quiet window
    out = {"mqtt": {"port": broker.port, "prefix": f"{prefix}/out", "reconnect_min_s": 0.1, "reconnect_max_s": 0.5,
                    "timeout_s": 1.0}}  # fmt: skip
    cfg = parse_config(_config(source, out))

    async def publish(k0: int, k1: int) -> None:
        import aiomqtt

        async with aiomqtt.Client("127.0.0.1", broker.port) as client:
            for k in range(k0, k1):
                await client.publish(f"{prefix}/in", json.dumps({**chunks[k], "seq": k}), qos=1)
                await asyncio.sleep(0.01)

    async def main() -> tuple[Daemon, list[Any]]:
        daemon = Daemon(cfg)
        run = asyncio.create_task(daemon.run(install_signals=False))
        src = daemon.sources[0][1]
        while not src.connected:
            await asyncio.sleep(0.05)
        await publish(0, 40)
        await asyncio.sleep(1.0)
        seq_before = daemon.engine.counters.hops
        broker.stop()
        await asyncio.sleep(1.5)
        assert not run.done() and not src.connected
        broker.start()
        for _ in range(200):
            if src.connected:
                break
            await asyncio.sleep(0.05)
        # chunks 40..59 are never sent (lost while the broker was down); sending resumes at 60
        late: list[Any] = []
        async with Subscriber(f"mqtt://127.0.0.1:{broker.port}", prefix=f"{prefix}/out", late_join=False) as sub:
            collect = asyncio.create_task(_drain(sub, late, [], quiet_s=3.0))
            await asyncio.sleep(0.3)
            await publish(60, 120)
            await collect
        assert daemon.engine.counters.hops > seq_before
        daemon.stop()
        await run
        return daemon, late

    try:
        daemon, late = asyncio.run(main())
    finally:
        broker.stop()
    c = daemon.sources[0][1].counters
    assert c.connects >= 2 and c.disconnects >= 1
    assert c.seq_gaps == 20  # the chunks not sent while the broker was down
    assert late, "no snapshot published after the restart"
    sink = daemon.sinks[0].counters
    assert sink.connects >= 2


def test_run_command_serves_metrics_and_stops_cleanly_on_sigterm(mqtt_broker, tmp_path):
    """`streamcorr run` serves /healthz and /metrics (the process' resident memory among them) on loopback; SIGTERM
    publishes a last snapshot and a retained "offline" status, and the process exits 0."""
    host, port = mqtt_broker
    prefix = f"sigterm-{uuid.uuid4().hex[:8]}"
    http_port = free_port()
    cfg = _config(
        {"type": "mqtt", "host": host, "port": port, "topics": [f"{prefix}/in"], "channel_template": "{key}"},
        {"mqtt": {"host": host, "port": port, "prefix": f"{prefix}/out"}},
    )
    cfg["http"] = {"port": http_port}
    cfg["logging"] = {"format": "json"}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamcorr", "run", str(path)], stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        url = f"http://127.0.0.1:{http_port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                health = json.load(urllib.request.urlopen(f"{url}/healthz", timeout=1))
                if all(health["sources_connected"].values()):
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "daemon did not come up"
            time.sleep(0.2)
        t, v = pearson_blind_rig(20, seed=3)
        lines = "\n".join(json.dumps(c) for c in _chunks(t, v)) + "\n"
        subprocess.run(
            ["mosquitto_pub", "-h", host, "-p", str(port), "-q", "1", "-t", f"{prefix}/in", "-l"],
            input=lines, text=True, check=True,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while json.load(urllib.request.urlopen(f"{url}/healthz", timeout=1))["last_snapshot_seq"] is None:
            assert time.monotonic() < deadline, "no snapshot"
            time.sleep(0.2)
        metrics = urllib.request.urlopen(f"{url}/metrics", timeout=2).read().decode()
        assert 'streamcorr_samples_ingested_total{source="mqtt0"} 600.0' in metrics
        assert "streamcorr_hop_seconds_bucket" in metrics and "streamcorr_queue_depth" in metrics
        assert 'streamcorr_engine_path_total{count="fold_pairs",path="significance"}' in metrics
        rss = re.search(r"^process_resident_memory_bytes (\S+)$", metrics, re.M)  # the daemon's own memory
        assert rss is not None and float(rss.group(1)) > 50e6
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        stderr = proc.stderr.read() if proc.stderr else ""
    logs = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert any(rec["msg"] == "stopped" for rec in logs), stderr[-2000:]

    async def retained() -> tuple[Any, Any]:
        async with Subscriber(f"mqtt://{host}:{port}", prefix=f"{prefix}/out") as sub:
            snap = await anext(sub.snapshots(timeout_s=5))
            for _ in range(50):
                if sub.status() is not None:
                    break
                await asyncio.sleep(0.1)
            return snap, sub.status()

    snap, status = asyncio.run(retained())
    assert snap.channels == tuple(CHANNELS)
    assert status is not None and status.state == "offline"
    _clear_retained(host, port, f"{prefix}/out")


def _clear_retained(host: str, port: int, prefix: str) -> None:
    for stream in ("snapshot", "status", "pairs"):
        subprocess.run(
            ["mosquitto_pub", "-h", host, "-p", str(port), "-t", f"{prefix}/{stream}", "-r", "-n"], check=False
        )


def test_a_source_that_cannot_start_stops_the_daemon_with_its_error():
    """A ZeroMQ source whose port is taken is not left failing silently: run() logs it, shuts down, and raises."""
    ctx = zmq.Context.instance()
    taken = ctx.socket(zmq.PULL)
    port = taken.bind_to_random_port("tcp://127.0.0.1")
    try:
        source = {"type": "zmq", "endpoint": f"tcp://127.0.0.1:{port}", "mode": "pull", "bind": True}
        cfg = parse_config(_config(source, {}))

        async def main() -> None:
            await asyncio.wait_for(Daemon(cfg).run(install_signals=False), timeout=60)

        with pytest.raises(ConfigError):
            asyncio.run(main())
    finally:
        taken.close(linger=0)


def test_sigterm_sends_no_second_copy_of_the_last_snapshot(tmp_path):
    """A plain ZeroMQ SUB client that reads a daemon through SIGTERM gets each window once: the goodbye sends the
    newest snapshot only when the forwarder had not sent it yet."""
    rng = np.random.default_rng(8117)
    rate, n = 50.0, 50 * 15
    cfg, push, sub = zmq_fed_daemon(["a", "b"], rate)
    a = rng.standard_normal(n)
    b = a + rng.standard_normal(n)
    t_end = time.time()
    t = t_end - (n - np.arange(n)) / rate
    windows: list[int] = []
    with daemon_process(tmp_path, cfg) as proc:
        # a SUB socket hears a PUB only once its subscription has crossed: windows published in the daemon's first
        # moments are lost to it (a slow joiner), so the samples go in once the daemon runs
        wait_for(lambda: "running:" in proc.log_path.read_text(), "the daemon to run", proc)
        time.sleep(0.5)
        for k in range(0, n, 50):
            push.send_multipart([b"rig", msgpack.packb({"t": t[k : k + 50].tolist(),
                                 "channels": {"a": a[k : k + 50].tolist(), "b": b[k : k + 50].tolist()}})])  # fmt: skip
        deadline = time.monotonic() + 120
        while not windows or windows[-1] < int((t_end - 1.5) * 1e9):
            assert proc.poll() is None and time.monotonic() < deadline, proc.log_path.read_text()[-2000:]
            if sub.poll(1000):
                windows.append(msgpack.unpackb(sub.recv_multipart()[1], raw=False)["t_ns"])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.log_path.read_text()[-2000:]
        while sub.poll(1000):  # whatever the daemon sent on its way out
            windows.append(msgpack.unpackb(sub.recv_multipart()[1], raw=False)["t_ns"])
    sub.close()
    push.close()
    assert len(windows) >= 3 and len(set(windows)) == len(windows), windows
