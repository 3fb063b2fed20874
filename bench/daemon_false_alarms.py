"""Chance change events of a live daemon over MQTT on independent white-noise channels.

    python -m bench.daemon_false_alarms [--minutes 20] [--channels 24] [--quick]

A real `streamcorr run` at its default change settings (window 256 at 20 Hz, 1-s hops) subscribed to the
local Mosquitto (127.0.0.1:1883); four simulated devices publish their fields as JSON at 20 Hz, each on its
own clock phase with stamp jitter; a paho subscriber decodes the daemon's published envelopes (msgpack) on
its own and counts ``became-dependent`` events (every pair is independent by construction) and snapshots.
Results go to bench/results/daemon_false_alarms.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import paho.mqtt.client as mqtt

from bench.common import environment, write_results


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(minutes: float, channels: int, seed: int = 0) -> dict[str, float]:
    tag = f"fa{os.getpid()}"
    cfg = {
        "version": 1,
        "sources": [{"type": "mqtt", "host": "127.0.0.1", "port": 1883, "topics": [f"{tag}/in/#"],
                     "channel_template": "{topic[2]}.{key}"}],
        "channels": {"rate_hz": 20, "max_staleness_s": 0.2},
        "window": {"samples": 256, "hop_s": 1.0},
        "outputs": {"mqtt": {"host": "127.0.0.1", "port": 1883, "prefix": f"{tag}/out"}},
        "http": {"port": _free_port()},
        "logging": {"format": "text", "level": "WARNING"},
    }  # fmt: skip
    work = Path(tempfile.mkdtemp())
    (work / "cfg.yaml").write_text(json.dumps(cfg))  # JSON is YAML
    exe = shutil.which("streamcorr") or "streamcorr"
    log = (work / "daemon.log").open("w")
    daemon = subprocess.Popen([exe, "run", str(work / "cfg.yaml")], stdout=subprocess.DEVNULL, stderr=log)
    counts = {"snapshots": 0, "became_dependent": 0, "other_events": 0}
    lock = threading.Lock()

    def on_message(_c: object, _u: object, msg: mqtt.MQTTMessage) -> None:
        m = msgpack.unpackb(msg.payload, raw=False)
        with lock:
            if m.get("kind") == "snapshot":
                counts["snapshots"] += 1
            elif m.get("kind") == "event":
                counts["became_dependent" if m["change"] == "became-dependent" else "other_events"] += 1

    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    sub.on_message = on_message
    sub.connect("127.0.0.1", 1883)
    sub.subscribe(f"{tag}/out/#")
    sub.loop_start()
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    pub.connect("127.0.0.1", 1883)
    pub.loop_start()
    rng = np.random.default_rng(seed)
    devices = 4
    per = channels // devices
    phase = rng.uniform(0, 0.05, devices)
    time.sleep(8)  # the daemon loads its model and subscribes
    t_start = time.time()
    k = 0
    try:
        while time.time() < t_start + minutes * 60:
            tick = t_start + k / 20.0
            time.sleep(max(0.0, tick - time.time()))
            for d in range(devices):
                stamp = tick + phase[d] + rng.normal(0, 0.002)
                fields = {f"f{c}": float(rng.standard_normal()) for c in range(per)}
                pub.publish(f"{tag}/in/dev{d}", json.dumps({"t": stamp, **fields}))
            k += 1
    finally:
        time.sleep(3)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
        log.close()
        pub.loop_stop()
        sub.loop_stop()
    hours = minutes / 60
    pairs = channels * (channels - 1) // 2
    return {"minutes": minutes, "channels": channels, "pairs": pairs, **counts,
            "became_dependent_per_hour": counts["became_dependent"] / hours,
            "daemon_exit": daemon.returncode}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--channels", type=int, default=24)
    ap.add_argument("--quick", action="store_true", help="1 minute (a smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.minutes = 1.0
    r = run(args.minutes, args.channels)
    print(json.dumps(r), flush=True)
    table = (
        "| minutes | channels | pairs | snapshots received | chance became-dependent | other events | per hour |\n"
        "|---|---|---|---|---|---|---|\n"
        f"| {r['minutes']:g} | {r['channels']} | {r['pairs']} | {r['snapshots']} | {r['became_dependent']} | "
        f"{r['other_events']} | {r['became_dependent_per_hour']:.2f} |\n"
    )
    if not args.quick:
        write_results("daemon_false_alarms", {"args": vars(args), "result": r, "env": environment()}, table)
    else:
        print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
