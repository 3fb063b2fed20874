"""MQTT burst: how much of a burst the MqttSource takes beside ``mosquitto_sub`` on the same topics, in one run.

A publisher process (paho-mqtt, QoS 0) sends ``--messages`` JSON messages (three fields and a ``seq`` each, eight
device topics) as fast as it can to Mosquitto; ``mosquitto_sub`` and an MqttSource feeding ``Engine.push`` are
subscribed to them. Each topic then gets one last message after a pause, so that messages lost at the tail show as
``seq_gaps``. Reported: messages each subscriber took, as a share of those published, and the source's ledger
(taken + seq_gaps = published; ``queue_full``, the source's own drops, stays 0: it drops nothing by design).

With ``--daemon`` the subscriber beside ``mosquitto_sub`` is a ``streamcorr run`` process instead, its engine
evaluating MI every hop as in service, and its counts are read back from its /metrics.

    python -m bench.mqtt_burst [--messages 300000] [--repeats 3] [--broker 127.0.0.1:1883] [--daemon]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import environment, stop_process, write_results
from bench.hostile import _free_port, _metrics, _start_daemon, _wait

DEVICES = 8


def _publish(host: str, port: int, prefix: str, n: int, out: Any) -> None:
    import paho.mqtt.client as paho

    client = paho.Client(paho.CallbackAPIVersion.VERSION2)
    client.connect(host, port)
    client.loop_start()
    seqs = [0] * DEVICES
    t0 = time.perf_counter()
    for k in range(n):
        d = k % DEVICES
        seqs[d] += 1
        client.publish(f"{prefix}/dev{d}", json.dumps({"seq": seqs[d], "a": k * 0.1, "b": 1.0, "c": 2.0}), qos=0)
    sent_s = time.perf_counter() - t0
    time.sleep(5.0)  # the subscribers drain; then one last message per topic shows a lost tail as seq gaps
    for d in range(DEVICES):
        client.publish(f"{prefix}/dev{d}", json.dumps({"seq": seqs[d] + 1, "a": 0.0, "b": 0.0, "c": 0.0}), qos=0)
    time.sleep(1.0)
    client.loop_stop()
    client.disconnect()
    out.put(sent_s)


async def _run(host: str, port: int, n: int) -> dict[str, Any]:
    from streamcorr.config import MqttConnection
    from streamcorr.engine.core import Engine, EngineConfig
    from streamcorr.ingest.mqtt import MqttSource
    from streamcorr.ingest.payload import PayloadDecoder

    prefix = f"streamcorr-burst/{uuid.uuid4().hex[:12]}"
    eng = Engine(EngineConfig(auto_add_channels=True, rate_hz=100.0, window_len=256, max_channels=64))
    dec = PayloadDecoder(channel_template="{topic[2]}.{key}", seq_field="seq", format="json")
    src = MqttSource(settings=MqttConnection(host=host, port=port), topics=[f"{prefix}/+"], decoder=dec,
                     sink=eng.push)  # fmt: skip
    sink = tempfile.TemporaryFile()  # noqa: SIM115  # a file, not a pipe: a full pipe would stall mosquitto_sub
    sub = subprocess.Popen(["mosquitto_sub", "-h", host, "-p", str(port), "-t", f"{prefix}/+", "-q", "0"],
                           stdout=sink, stderr=subprocess.DEVNULL)  # fmt: skip
    task = asyncio.create_task(src.run())
    while not src.connected:
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # mosquitto_sub subscribed too
    out: Any = mp.get_context("spawn").Queue()
    pub = mp.get_context("spawn").Process(target=_publish, args=(host, port, prefix, n, out), daemon=True)
    cpu0 = os.times()
    pub.start()
    while pub.is_alive():
        await asyncio.sleep(0.2)
    await asyncio.sleep(2.0)
    cpu1 = os.times()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    sub.terminate()
    sub.wait()
    sink.seek(0)
    lines = sink.read().count(b"\n")
    sink.close()
    c = src.counters
    published = n + DEVICES
    return {"published": published, "sent_s": out.get(), "mosquitto_sub": lines, "source_messages": c.messages,
            "source_queue_full": c.queue_full, "source_seq_gaps": c.seq_gaps,
            "ledger_ok": c.messages + c.seq_gaps == published,
            "source_cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)}  # fmt: skip


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run_daemon(host: str, port: int, n: int) -> dict[str, Any]:
    """One burst with a ``streamcorr run`` process as the subscriber beside mosquitto_sub."""
    prefix = f"streamcorr-burst/{uuid.uuid4().hex[:12]}"
    http_port = _free_port()
    cfg = {"version": 1,
           "sources": [{"type": "mqtt", "host": host, "port": port, "topics": [f"{prefix}/+"],
                        "channel_template": "{topic[2]}.{key}", "format": "json"}],
           "channels": {"rate_hz": 100.0, "max_channels": 64},
           "window": {"samples": 256, "hop_s": 1.0},
           "outputs": {"zmq": {"endpoint": f"tcp://127.0.0.1:{_free_port()}", "snapshot_endpoint": None}},
           "http": {"port": http_port},
           "logging": {"format": "text", "level": "WARNING"}}  # fmt: skip
    messages = 'streamcorr_messages_received_total{source="mqtt0"}'
    gaps = 'streamcorr_source_seq_gaps_total{source="mqtt0"}'
    with tempfile.TemporaryDirectory() as work, tempfile.TemporaryFile() as sink:
        daemon = _start_daemon(Path(work), cfg, "burst")
        sub: subprocess.Popen[bytes] | None = None
        pub: Any = None
        try:
            _wait(lambda: _metrics(http_port).get('streamcorr_source_connected{source="mqtt0"}', 0) == 1, 180,
                  "the daemon subscribed", daemon)  # fmt: skip
            sub = subprocess.Popen(["mosquitto_sub", "-h", host, "-p", str(port), "-t", f"{prefix}/+", "-q", "0"],
                                   stdout=sink, stderr=subprocess.DEVNULL)  # fmt: skip
            time.sleep(1.0)
            hops0, cpu0 = _metrics(http_port).get("streamcorr_hops_total", 0.0), _cpu_s(daemon.pid)
            out: Any = mp.get_context("spawn").Queue()
            pub = mp.get_context("spawn").Process(target=_publish, args=(host, port, prefix, n, out), daemon=True)
            pub.start()
            sent_s = out.get(timeout=600)  # raises queue.Empty if the publisher died
            pub.join()
            time.sleep(2.0)
            if daemon.poll() is not None:
                raise RuntimeError(f"the daemon exited with code {daemon.returncode} during the burst ({work})")
            m = _metrics(http_port)
            cpu1 = _cpu_s(daemon.pid)  # the burst and the 8 s after it (the publisher's pauses, the drain)
        finally:
            for proc in (sub, daemon):
                stop_process(proc, 60.0)
            if pub is not None and pub.is_alive():
                pub.kill()
        sink.seek(0)
        lines = sink.read().count(b"\n")
    published = n + DEVICES
    taken, seq_gaps = int(m.get(messages, 0)), int(m.get(gaps, 0))
    return {"published": published, "sent_s": sent_s, "mosquitto_sub": lines, "source_messages": taken,
            "source_queue_full": 0, "source_seq_gaps": seq_gaps, "ledger_ok": taken + seq_gaps == published,
            "source_cpu_s": cpu1 - cpu0, "hops": m.get("streamcorr_hops_total", 0.0) - hops0}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--repeats", type=int, default=3, help="bursts, one after the other; the median is reported")
    ap.add_argument("--broker", default="127.0.0.1:1883")
    ap.add_argument("--daemon", action="store_true", help="a streamcorr run process beside mosquitto_sub")
    args = ap.parse_args(argv)
    host, port = args.broker.rsplit(":", 1)
    if args.daemon:
        runs = [_run_daemon(host, int(port), args.messages) for _ in range(args.repeats)]
    else:
        runs = [asyncio.run(_run(host, int(port), args.messages)) for _ in range(args.repeats)]
    for r in runs:
        r["share_of_mosquitto_sub"] = r["source_messages"] / max(1, r["mosquitto_sub"])
    med = sorted(runs, key=lambda r: r["share_of_mosquitto_sub"])[len(runs) // 2]
    pub = med["published"]
    who = "daemon" if args.daemon else "source"
    feeds = (
        "a `streamcorr run` process (24 channels at 100 Hz, window 256, 1-s hops: its engine evaluates every "
        "hop), counts from its /metrics"
        if args.daemon
        else "an MqttSource feeding `Engine.push`"
    )
    md = [f"## MQTT burst: {pub:,} JSON messages (8 topics, QoS 0) as fast as a paho publisher sends them, "
          f"{len(runs)} bursts, taken by the {who}", "",
          f"Sent to Mosquitto at {args.broker}; both subscribers on the same topics in the same run. The {who} is "
          f"{feeds}; its receive buffer is the default (`receive_buffer_bytes`).", "",
          f"| burst | sent in s | msg/s sent | mosquitto_sub took | {who} took | {who} / mosquitto_sub | seq_gaps | "
          f"queue_full | ledger | {who} CPU s | CPU us per message taken |",
          "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]  # fmt: skip
    for k, r in enumerate(runs, 1):
        us = 1e6 * r["source_cpu_s"] / max(1, r["source_messages"])
        md.append(f"| {k} | {r['sent_s']:.1f} | {args.messages / r['sent_s']:,.0f} | {r['mosquitto_sub']:,} | "
                  f"{r['source_messages']:,} | {r['share_of_mosquitto_sub']:.1%} | {r['source_seq_gaps']:,} | "
                  f"{r['source_queue_full']:,} | {'closes' if r['ledger_ok'] else 'does not close'} | "
                  f"{r['source_cpu_s']:.1f} | {us:.1f} |")  # fmt: skip
    shares = sorted(r["share_of_mosquitto_sub"] for r in runs)
    md += ["", f"- median burst: the {who} took {med['share_of_mosquitto_sub']:.1%} of what mosquitto_sub took "
           f"(lowest {shares[0]:.1%}; target >= 90%); ledger: taken + seq_gaps = published in every burst: "
           f"{all(r['ledger_ok'] for r in runs)}",
           "- seq_gaps beyond queue_full are messages the broker dropped for a slow client (QoS 0)",
           f"- CPU: the {who}'s process from the burst's start to 8 s after its last message (the publisher's "
           "pauses before the tail messages, and the drain), its hops included"]  # fmt: skip
    if args.daemon:
        md.append(f"- hops the daemon evaluated during the bursts: {', '.join(str(int(r['hops'])) for r in runs)}")
    write_results("mqtt_burst_daemon" if args.daemon else "mqtt_burst",
                  {"env": environment(), "messages": args.messages, "subscriber": who, "runs": runs,
                   "median_share": med["share_of_mosquitto_sub"]}, "\n".join(md))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
