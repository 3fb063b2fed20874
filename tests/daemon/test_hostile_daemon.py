"""Issue 10, classes 1-4 against a real `streamcorr run` process: one hostile message (an invalid Unicode name, a
sample a year ahead, a thousand new names) does not stop the output, and SIGTERM during a long hop exits soon."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import aiomqtt
import msgpack
import numpy as np
import zmq

from streamcorr.publish.subscriber import Subscriber
from tests.brokers import free_port, http_metrics, metric_sum
from tests.helpers import daemon_process

RATE = 10.0
EXIT_BOUND_S = 40.0  # a liveness bound for shutdown, far above its design (~6 s), far below a long hop


def _dropped(text: str, stage: str, reason: str) -> float:
    """streamcorr_samples_dropped_total for one stage and reason (labels in any order)."""
    for line in text.splitlines():
        labels = (f'stage="{stage}"', f'reason="{reason}"')
        if line.startswith("streamcorr_samples_dropped_total{") and all(x in line for x in labels):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _wait_metrics(proc: subprocess.Popen[bytes], port: int, log: Path, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while "streamcorr_hops_total" not in http_metrics(port):  # /metrics answers, and the engine exists: running
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the daemon's /metrics never showed a running engine"
        time.sleep(0.2)


def _exit_within(proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running {timeout_s:.0f} s after SIGTERM: {log.read_text()[-2000:]}") from None


def test_one_hostile_message_does_not_stop_the_output(mqtt_broker, tmp_path):
    """Through Mosquitto into a real daemon: a field named with a lone surrogate, a sample a year ahead, an hour
    ahead on a real channel and 1,000 new names in one message are each counted in /metrics, while ZeroMQ
    snapshots of the configured pair keep coming; SIGTERM then leaves a retained "offline" status."""
    rng = np.random.default_rng(40)
    host, port = mqtt_broker
    prefix = f"hostile-{uuid.uuid4().hex[:8]}"
    http_port, p_out, p_last = free_port(), free_port(), free_port()
    cfg = {
        "version": 1,
        "sources": [{"type": "mqtt", "host": host, "port": port, "topics": [f"{prefix}/in/#"],
                     "channel_template": "{key}"}],
        "channels": {"names": ["a", "b"], "rate_hz": RATE, "max_staleness_s": 0.2},
        "window": {"samples": 64, "hop_samples": 10},
        "outputs": {"zmq": {"endpoint": f"tcp://127.0.0.1:{p_out}", "snapshot_endpoint": f"tcp://127.0.0.1:{p_last}"},
                    "mqtt": {"host": host, "port": port, "prefix": f"{prefix}/out"}, "status_interval_s": 1.0},
        "http": {"port": http_port},
        "logging": {"format": "text"},
    }  # fmt: skip
    log = tmp_path / "daemon.log"

    async def feed(client: aiomqtt.Client, seconds: float) -> None:
        """Live 10 Hz samples of a dependent pair, sent every 0.5 s, stamped on the clock grid."""
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            now = np.floor(time.time() * RATE) / RATE
            t = now - np.arange(4, -1, -1) / RATE
            a = rng.standard_normal(5)
            chunk = {"t": t.tolist(), "channels": {"a": a.tolist(), "b": (a + 0.1 * rng.standard_normal(5)).tolist()}}
            await client.publish(f"{prefix}/in/pair", json.dumps(chunk), qos=1)
            await asyncio.sleep(0.5)

    async def scenario(proc: subprocess.Popen[bytes]) -> tuple[list[Any], list[Any], str]:
        before: list[Any] = []
        after: list[Any] = []
        async with Subscriber(f"tcp://127.0.0.1:{p_out}", late_join=False) as sub, aiomqtt.Client(host, port) as pub:
            target = before

            async def take() -> None:
                async for snap in sub.snapshots(timeout_s=120):
                    target.append(snap)

            taker = asyncio.create_task(take())
            deadline = time.monotonic() + 90
            while len(before) < 2:  # the first window (6.4 s) fills, then one hop per second
                assert time.monotonic() < deadline, "no snapshot before the attack: " + log.read_text()[-2000:]
                await feed(pub, 1.0)
            target = after
            now = time.time()
            attack = f"{prefix}/in/evil"
            await pub.publish(attack, json.dumps({"t": now, "\ud800": 1.0, "tab\there": 2.0}), qos=1)
            await pub.publish(attack, json.dumps({"t": now + 31_536_000, "x": 1.0}), qos=1)
            await pub.publish(attack, json.dumps({"t": now + 3600, "a": 1.0}), qos=1)
            names = {f"n{k}": [1.0] for k in range(1000)}
            await pub.publish(attack, msgpack.packb({"t0": now - 1, "dt": 0.1, "channels": names}), qos=1)
            await feed(pub, 8.0)
            taker.cancel()
            metrics = await asyncio.to_thread(http_metrics, http_port)
        return before, after, metrics

    with daemon_process(tmp_path, cfg) as proc:
        _wait_metrics(proc, http_port, log)
        deadline = time.monotonic() + 60
        while metric_sum(http_metrics(http_port), "streamcorr_source_connected") < 1:
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.2)
        _, after, metrics = asyncio.run(scenario(proc))
        proc.send_signal(signal.SIGTERM)
        assert _exit_within(proc, EXIT_BOUND_S, log) == 0
    assert len(after) >= 4, f"{len(after)} snapshots in the 8 s after the attack"
    assert all(s.channels[:2] == ("a", "b") and len(s.channels) <= 256 for s in after)
    assert np.isfinite(after[-1].mi[0, 1]) and after[-1].mi[0, 1] > 0.5  # the pair is still evaluated, dependent
    assert _dropped(metrics, "decode:mqtt0", "name") == 2
    assert _dropped(metrics, "engine", "future") == 2
    assert _dropped(metrics, "engine", "channel_limit") == 1000 - 254

    async def retained_status() -> Any:
        async with Subscriber(f"mqtt://{host}:{port}", prefix=f"{prefix}/out") as sub:
            for _ in range(50):
                if sub.status() is not None:
                    break
                await asyncio.sleep(0.1)
            return sub.status()

    status = asyncio.run(retained_status())
    for stream in ("snapshot", "status", "pairs"):
        subprocess.run(["mosquitto_pub", "-h", host, "-p", str(port), "-t", f"{prefix}/out/{stream}", "-r", "-n"],
                       check=False)  # fmt: skip
    assert status is not None and status.state == "offline"


def test_sigterm_during_a_long_hop_exits_within_a_bound(tmp_path):
    """250 configured channels with gapped data make one hop of 31,125 pair-by-pair estimates (several seconds, warm
    caches included); SIGTERM while it runs still ends the process cleanly, with exit code 0, well within a bound."""
    rng = np.random.default_rng(41)
    http_port, p_in = free_port(), free_port()
    names = [f"c{k:03d}" for k in range(250)]
    cfg = {
        "version": 1,
        "sources": [{"type": "zmq", "endpoint": f"tcp://127.0.0.1:{p_in}", "mode": "pull", "bind": True,
                     "channel_template": "{key}"}],
        "channels": {"names": names, "rate_hz": RATE, "max_staleness_s": 0.05},
        "window": {"samples": 64, "hop_samples": 16},
        "screening": {"mode": "off"},  # every pair by the network: the hop stays long on a fast, idle machine
        "http": {"port": http_port},
        "logging": {"format": "text"},
    }  # fmt: skip
    log = tmp_path / "daemon.log"
    now = np.floor(time.time())
    t = now - 10.0 + np.arange(100) / RATE
    gaps = np.arange(100) % 20 == 7  # the same 5% of instants missing on every channel: coverage 0.95 < 1
    values = {n: [None if g else float(v) for g, v in zip(gaps, rng.standard_normal(100), strict=True)]
              for n in names}  # fmt: skip
    with daemon_process(tmp_path, cfg) as proc:
        _wait_metrics(proc, http_port, log)
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.connect(f"tcp://127.0.0.1:{p_in}")
        push.send_multipart([b"rig", msgpack.packb({"t": t.tolist(), "channels": values})])
        push.close(linger=2000)
        deadline = time.monotonic() + 60
        while metric_sum(http_metrics(http_port), "streamcorr_samples_ingested_total") < len(names) * 100:
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.2)
        time.sleep(1.5)  # the hop is under way (it is due as soon as the data is in)
        assert metric_sum(http_metrics(http_port), "streamcorr_hops_total") == 0, "the hop ended before SIGTERM"
        proc.send_signal(signal.SIGTERM)
        assert _exit_within(proc, EXIT_BOUND_S, log) == 0
    assert "stopped" in log.read_text()
