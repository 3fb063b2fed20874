"""The demo rig live over MQTT: a real daemon, fed in real time by an MQTT publisher, read by a Subscriber.

    python -m bench.live_mqtt [--seed 0] [--broker 127.0.0.1:1883] [--startup-s 15]

`streamcorr run` with an MQTT source (one JSON message per device and tick, fields of that device, stamped
with the wall clock) and the MQTT output runs the demo rig's script (20 channels at 50 Hz: a joint seizes at
40 s, the cooling fan fails at 80 s, a loose cable couples a spare input at 120 s) with the demo's engine
settings (window 512), with the fast change path on at hops of 25 and 50 samples (0.5 and 1 s; the demo runs 1-s
hops) and off at 1-s hops. A Subscriber in this
process decodes every event. Reported per setting: each expected event's delay after its scripted change, in
stream time (the event's ``t_ns``) and as received here (wall clock), misses, events on pairs the script holds
stable, and how many events the fast path made. Results go to bench/results/live_mqtt.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np

from bench.common import environment, stop_process, write_results
from streamcorr.demo import DEMO_DELTA
from streamcorr.demo.rig import Rig
from streamcorr.publish.subscriber import Subscriber

RATE_HZ = 50.0
TAIL_S = 40.0  # after the last scripted change


def config(prefix: str, host: str, port: int, channels: tuple[str, ...], fast: bool, hop: int = 50) -> str:
    """The daemon's YAML: the demo's engine settings, MQTT in and out."""
    return f"""version: 1
sources:
  - type: mqtt
    host: {host}
    port: {port}
    topics: ["{prefix}/in/#"]
    channel_template: "{{topic[2]}}.{{key}}"
channels:
  names: {json.dumps(list(channels))}
  rate_hz: {RATE_HZ}
  max_staleness_s: {1.5 / RATE_HZ}
window:
  samples: 512
  hop_samples: {hop}
changes:
  delta: {DEMO_DELTA}
  fast: {"true" if fast else "false"}
outputs:
  mqtt:
    host: {host}
    port: {port}
    prefix: {prefix}/out
http:
  port: 0
logging:
  level: WARNING
"""


async def publish(host: str, port: int, prefix: str, rig: Rig, t0: float, duration_s: float) -> int:
    """The rig's frames in real time from wall-clock t0: one message per device per tick. Returns messages sent."""
    n = int(duration_s * RATE_HZ)
    t, values = rig.arrays(n)
    devices: dict[str, list[str]] = {}
    for ch in rig.channels:
        devices.setdefault(ch.split(".")[0], []).append(ch)
    sent = 0
    async with aiomqtt.Client(host, port) as client:
        for k in range(n):
            wait = t0 + t[k] - time.time()
            if wait > 0:
                await asyncio.sleep(wait)
            for dev, chans in devices.items():
                body = {"t": round(t0 + t[k], 6)} | {ch.split(".", 1)[1]: float(values[ch][k]) for ch in chans}
                await client.publish(f"{prefix}/in/{dev}", json.dumps(body))
                sent += 1
    return sent


async def run_once(host: str, port: int, seed: int, fast: bool, hop: int, startup_s: float) -> dict[str, Any]:
    rig = Rig(seed, RATE_HZ)
    prefix = f"live-{uuid.uuid4().hex[:8]}"
    tmp = Path(tempfile.mkdtemp(prefix="live_mqtt_"))
    (tmp / "config.yaml").write_text(config(prefix, host, port, rig.channels, fast, hop))
    log = open(tmp / "daemon.log", "wb")  # noqa: SIM115  (closed below, after the daemon)
    daemon = subprocess.Popen(
        [sys.executable, "-c", "import sys; from streamcorr.cli.commands import main; sys.exit(main())", "run",
         str(tmp / "config.yaml")], stderr=log)  # fmt: skip
    received: list[tuple[float, Any]] = []
    duration = rig.script[-1].t_s + TAIL_S
    try:
        await asyncio.sleep(startup_s)  # the daemon loads the model and its (cached) calibrations
        async with Subscriber(
            f"mqtt://{host}:{port}", prefix=f"{prefix}/out", late_join=False, streams=("event",)
        ) as sub:

            async def drain() -> None:
                async for ev in sub.events():
                    received.append((time.time(), ev))

            reader = asyncio.create_task(drain())
            await asyncio.sleep(1.0)
            t0 = float(np.ceil(time.time())) + 1.0
            sent = await publish(host, port, prefix, rig, t0, duration)
            await asyncio.sleep(3.0)  # the last hops publish
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
    finally:
        stop_process(daemon, 30.0)  # it must not run on beside the next setting's daemon
        log.close()
    return score(rig, received, t0) | {"messages_sent": sent, "daemon_exit": daemon.returncode}


def score(rig: Rig, received: list[tuple[float, Any]], t0: float) -> dict[str, Any]:
    """Each expected event's first match after its scripted change (stream and wall delay), misses, and events
    on stable pairs (not counting a pair's initial verdict)."""
    stable = {frozenset(p) for p in rig.stable_pairs()}
    rows = []
    ends = [c.t_s for c in rig.script[1:]] + [float("inf")]
    for change, end in zip(rig.script, ends, strict=True):
        at = t0 + change.t_s
        for pair, kind in change.expected:  # a match before the next scripted change
            hits = [(e.t_ns / 1e9 - at, wall - at, e.path) for wall, e in received
                    if frozenset(e.pair) == frozenset(pair) and e.kind == kind
                    and at <= e.t_ns / 1e9 < t0 + end]  # fmt: skip
            first = min(hits, default=None)
            rows.append({"change": change.name, "pair": list(pair), "kind": kind,
                         "stream_delay_s": None if first is None else first[0],
                         "wall_delay_s": None if first is None else first[1],
                         "path": None if first is None else first[2]})  # fmt: skip
    false = [e for _, e in received if frozenset(e.pair) in stable and not e.initial]
    return {"expected": rows, "missing": sum(r["stream_delay_s"] is None for r in rows),
            "false_on_stable": len(false), "events": len(received),
            "fast_events": sum(e.path == "fast" for _, e in received)}  # fmt: skip


def _median(rows: list[dict[str, Any]], key: str) -> str:
    d = [r[key] for r in rows if r[key] is not None]
    return f"{np.median(d):.1f} s" if d else "-"


def markdown(results: dict[str, Any]) -> str:
    lines = ["# The demo rig live over MQTT (a real daemon; 20 channels at 50 Hz, window 512)", "",
             "| setting | change | kind | expected | missed | median delay (stream) | p90 (stream) |"
             " median delay (received) | max (received) |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for label, r in results["settings"].items():
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for row in r["expected"]:
            groups.setdefault((row["change"], row["kind"]), []).append(row)
        for (change, kind), rows in groups.items():
            walls = [x["wall_delay_s"] for x in rows if x["wall_delay_s"] is not None]
            missed = sum(x["stream_delay_s"] is None for x in rows)
            worst = f"{max(walls):.1f} s" if walls else "-"
            stream = [x["stream_delay_s"] for x in rows if x["stream_delay_s"] is not None]
            p90 = f"{np.percentile(stream, 90):.1f} s" if stream else "-"
            lines.append(f"| {label} | {change} | {kind} | {len(rows)} | {missed} | {_median(rows, 'stream_delay_s')} "
                         f"| {p90} | {_median(rows, 'wall_delay_s')} | {worst} |")  # fmt: skip
    lines += ["", "| setting | events | by the fast path | events on stable pairs | messages published |",
              "|---|---:|---:|---:|---:|"]  # fmt: skip
    for label, r in results["settings"].items():
        lines.append(f"| {label} | {r['events']} | {r['fast_events']} | {r['false_on_stable']} | "
                     f"{r['messages_sent']:,} |")  # fmt: skip
    lines += ["", f"Broker: {results['broker']}. Command: `python -m bench.live_mqtt --seed {results['seed']}`"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--broker", default="127.0.0.1:1883", help="MQTT host:port")
    ap.add_argument("--startup-s", type=float, default=15.0, help="wait for the daemon to load before publishing")
    args = ap.parse_args(argv)
    host, port = args.broker.rsplit(":", 1)
    results: dict[str, Any] = {"env": environment(), "seed": args.seed, "broker": args.broker, "settings": {}}
    for label, fast, hop in (("fast on, hop 0.5 s", True, 25), ("fast on, hop 1 s", True, 50),
                             ("fast off (window only), hop 1 s", False, 50)):  # fmt: skip
        results["settings"][label] = asyncio.run(run_once(host, int(port), args.seed, fast, hop, args.startup_s))
        print(label, json.dumps({k: v for k, v in results["settings"][label].items() if k != "expected"}), flush=True)
    text = markdown(results)
    write_results("live_mqtt", results, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
