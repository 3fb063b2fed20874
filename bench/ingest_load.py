"""Ingest load: ZeroMQ chunks and MQTT messages through the real sources into a real Engine, with an exact ledger.

    python -m bench.ingest_load zmq|mqtt|all [--seconds 120] [--evaluate-pairs 0]
    python -m bench.ingest_load mqtt --ceiling [--daemon]

``--ceiling``: MQTT as fast as the publisher can send, beside ``mosquitto_sub`` in the same run
(:mod:`bench.mqtt_burst`; with ``--daemon`` the subscriber is a ``streamcorr run`` process).

zmq: a publisher process PUSHes msgpack chunks (64 channels x 100 samples, t0/dt form, float lists) at 20
messages/s (128k samples/s) to a ZmqSource (PULL, bound on 127.0.0.1), whose sink is Engine.push.
mqtt: a publisher process (paho-mqtt) publishes 5,200 JSON field messages/s (3 channels each, 8 device
topics, QoS 0) to Mosquitto; an MqttSource subscribed to them feeds Engine.push.

Each payload carries a ``seq`` per topic; after the run the publisher waits until the source has drained,
then sends one last message per topic, so messages lost anywhere in transport (QoS 0 gives no guarantee)
show up as ``seq_gaps`` instead of vanishing at the tail.
Rates and CPU are measured from the first message received to the last one before that tail. The ledger
must close exactly:

    published messages = handled + queue_full + seq_gaps
    published samples  = accepted + engine rejects + decode drops + samples in lost messages

By default the engine is not started (push only: ring buffers, no MI evaluation) because InfoNet evaluation
of many pairs saturates a 2-core machine and the benchmark would measure the model, not ingest;
``--evaluate-pairs N`` starts the engine and evaluates N pairs per 1 s hop alongside. The publisher runs in
its own process; CPU is reported per process as a percentage of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import resource
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from streamcorr.counters import flat_counters

from .common import environment, rss_mb, write_results

ZMQ_CHANNELS, ZMQ_SAMPLES_PER_MSG, ZMQ_MSG_RATE = 64, 100, 20.0
MQTT_DEVICES, MQTT_KEYS, MQTT_MSG_RATE = 8, ("ax", "ay", "az"), 5200.0
TAIL_WAIT_S = 60.0  # longest the publisher waits for the consumer to drain before the tail messages


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / float(os.sysconf("SC_CLK_TCK"))  # utime + stime


def _mosquitto_pids() -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if (p / "comm").read_text().strip() == "mosquitto":
                    pids.append(int(p.name))
            except OSError:
                continue
    return pids


# -- publishers (child processes) ------------------------------------------------------------------------
def _pace(rate: float, seconds: float, send: Any) -> tuple[int, float]:
    """Call send(k) at `rate` per second for `seconds`, in 10 ms bursts; returns (count, elapsed)."""
    t_start = time.perf_counter()
    k = 0
    while (now := time.perf_counter() - t_start) < seconds:
        due = int(now * rate) + 1
        while k < due:
            send(k)
            k += 1
        time.sleep(max(0.0, min(0.01, (k / rate) - (time.perf_counter() - t_start))))
    return k, time.perf_counter() - t_start


def publish_zmq(endpoint: str, seconds: float, rate: float, encoding: str, link: tuple[Any, Any, Any]) -> None:
    import msgpack
    import zmq

    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.connect(endpoint)
    rng = np.random.default_rng(0)
    names = [f"ch{c:03d}" for c in range(ZMQ_CHANNELS)]
    pool = rng.standard_normal((8, ZMQ_CHANNELS, ZMQ_SAMPLES_PER_MSG))  # cycled, so the publisher stays light
    dt = 1.0 / (rate * ZMQ_SAMPLES_PER_MSG)
    t0 = time.time()
    cpu0 = _cpu_s()

    def body(k: int) -> dict[str, Any]:
        block = pool[k % len(pool)]
        chans = {n: (block[c].tobytes() if encoding == "bytes" else block[c].tolist()) for c, n in enumerate(names)}
        return {"t0": t0 + k * ZMQ_SAMPLES_PER_MSG * dt, "dt": dt, "channels": chans, "seq": k}

    n, elapsed = _pace(rate, seconds, lambda k: push.send_multipart([b"bench/zmq", msgpack.packb(body(k))]))
    out, body_done, drained = link
    body_done.set()
    drained.wait(TAIL_WAIT_S)
    push.send_multipart([b"bench/zmq", msgpack.packb(body(n))])
    n += 1
    cpu = _cpu_s() - cpu0
    push.close(linger=-1)  # deliver everything before reporting
    ctx.term()
    out.put({"messages": n, "samples": n * ZMQ_CHANNELS * ZMQ_SAMPLES_PER_MSG, "elapsed_s": elapsed, "cpu_s": cpu})


def publish_mqtt(
    host: str, port: int, prefix: str, seconds: float, rate: float, qos: int, link: tuple[Any, Any, Any]
) -> None:
    import paho.mqtt.client as mqtt

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.max_queued_messages_set(0)
    client.connect(host, port)
    client.loop_start()
    rng = np.random.default_rng(1)
    pool = rng.standard_normal((1024, len(MQTT_KEYS))).round(6).tolist()
    dt = MQTT_DEVICES / rate  # per device topic
    topics = [f"{prefix}/imu{d}" for d in range(MQTT_DEVICES)]
    t0 = time.time()
    cpu0 = _cpu_s()
    last: list[Any] = [None]

    def send(k: int) -> None:
        dev, j = k % MQTT_DEVICES, k // MQTT_DEVICES
        fields = dict(zip(MQTT_KEYS, pool[k % len(pool)], strict=True))
        payload = json.dumps({"t": round(t0 + j * dt, 6), "seq": j, **fields})
        last[0] = client.publish(topics[dev], payload, qos=qos)

    n, elapsed = _pace(rate, seconds, send)
    out, body_done, drained = link
    body_done.set()
    drained.wait(TAIL_WAIT_S)  # a backlog at the broker could drop the tail too, hiding the gaps
    for k in range(n, n + MQTT_DEVICES):  # one last message per topic (k covers every residue): tail losses
        send(k)  # become seq gaps
    n += MQTT_DEVICES
    last[0].wait_for_publish(timeout=30)
    cpu = _cpu_s() - cpu0
    client.disconnect()
    client.loop_stop()
    out.put({"messages": n, "samples": n * len(MQTT_KEYS), "elapsed_s": elapsed, "cpu_s": cpu})


# -- consumer (this process) ------------------------------------------------------------------------------
_ESTIMATOR: list[Any] = []


def _engine(names: list[str], rate_hz: float, evaluate_pairs: int) -> Any:
    from streamcorr.engine.core import Engine, EngineConfig
    from streamcorr.estimate.estimator import Estimator

    if not _ESTIMATOR:
        _ESTIMATOR.append(Estimator())
    cfg = EngineConfig(
        channels=names,
        auto_add_channels=False,
        rate_hz=rate_hz,
        window_len=1024,
        hop_samples=int(rate_hz),  # 1 s
        max_pairs_per_hop=evaluate_pairs or None,
        false_alarm_rate=0.005,  # change detection is not measured here
    )
    return Engine(cfg, estimator=_ESTIMATOR[0])


async def _drive(
    eng: Any, src: Any, evaluate: bool, spawn: Any, samples_per_msg: int, tail_msgs: int
) -> dict[str, Any]:
    """Run the source (and the engine, if evaluating) while a publisher process runs; close the ledger."""
    c = src.counters
    task = asyncio.create_task(src.run())
    while not src.connected and not getattr(src, "ready", asyncio.Event()).is_set():
        await asyncio.sleep(0.01)
    if evaluate:
        await eng.start()

    brokers = _mosquitto_pids()

    def broker_cpu_s() -> float:
        return sum(_proc_cpu_s(p) for p in brokers if Path(f"/proc/{p}").exists())

    trace: list[tuple[float, int, int, float, float]] = []  # (t, messages, accepted, own CPU s, broker CPU s)
    rss: list[float] = [rss_mb()]

    async def sample() -> None:
        while True:
            trace.append((time.perf_counter(), c.messages, c.samples_accepted, _cpu_s(), broker_cpu_s()))
            rss.append(rss_mb())
            await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample())
    spawn_ctx = mp.get_context("spawn")
    q, body_done, drained = spawn_ctx.Queue(), spawn_ctx.Event(), spawn_ctx.Event()
    proc = spawn((q, body_done, drained))
    await asyncio.to_thread(body_done.wait)
    t_body_done = time.perf_counter()
    seen, t_change = -1, time.perf_counter()
    while time.perf_counter() - t_change < 0.5:  # drained: nothing new for 0.5 s
        if c.messages + c.queue_full != seen:
            seen, t_change = c.messages + c.queue_full, time.perf_counter()
        await asyncio.sleep(0.02)
    catch_up_s = max(0.0, t_change - t_body_done)
    drained.set()
    pub = await asyncio.to_thread(q.get)
    await asyncio.to_thread(proc.join)

    def lost() -> int:
        return c.queue_full + c.seq_gaps

    deadline = time.perf_counter() + 30
    while c.messages + lost() < pub["messages"] and time.perf_counter() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # nothing more may arrive
    sampler.cancel()
    task.cancel()
    for t in (sampler, task):
        with contextlib.suppress(asyncio.CancelledError):
            await t
    if evaluate:
        await eng.stop()

    # the steady window: from the first message to the last one before the tail; rates and CPU over it
    body = pub["messages"] - tail_msgs
    first = next((row for row in trace if row[1] > 0), None)
    last = next((row for row in trace if row[1] >= body - lost()), None)
    if first is None or last is None or last[0] <= first[0]:
        first = last = (0.0, 0, 0, 0.0, 0.0)
    span = last[0] - first[0] or float("nan")
    bufs = [ch.buffer.counters for ch in eng.intake.channels.values()]
    engine_rejects = {
        "late": sum(b.late for b in bufs),
        "duplicate": sum(b.duplicate for b in bufs),
        "nonfinite": sum(b.nonfinite for b in bufs),
        "unknown_channel": eng.counters.unknown_channel,
        "bad_sample": eng.counters.bad_sample,
    }
    lost_samples = samples_per_msg * lost()
    ledger_msgs = pub["messages"] == c.messages + lost()
    ledger_samples = pub["samples"] == c.samples_accepted + c.samples_rejected + c.dropped + lost_samples
    return {
        "published": {"messages": pub["messages"], "samples": pub["samples"]},
        "publisher": {
            "elapsed_s": pub["elapsed_s"],
            "msg_per_s": (pub["messages"] - tail_msgs) / pub["elapsed_s"],
            "samples_per_s": (pub["samples"] - tail_msgs * samples_per_msg) / pub["elapsed_s"],
            "cpu_pct": 100 * pub["cpu_s"] / pub["elapsed_s"],
        },
        "ingest": {
            **flat_counters(c),
            "drops": dict(c.drops),
            "dropped": c.dropped,
            "samples_rejected": c.samples_rejected,
        },
        "engine_rejects": engine_rejects,
        "lost_messages": lost(),
        "ledger_messages_ok": ledger_msgs,
        "ledger_samples_ok": ledger_samples,
        "steady_window_s": span,
        "steady_msg_per_s": (last[1] - first[1]) / span,
        "steady_samples_per_s": (last[2] - first[2]) / span,
        "catch_up_s": catch_up_s,
        "consumer_cpu_pct": 100 * (last[3] - first[3]) / span,
        "broker_cpu_pct": 100 * (last[4] - first[4]) / span if brokers else None,
        "broker_processes": len(brokers),
        "rss_mb": {"start": rss[0], "peak": max(rss), "end": rss[-1]},
        "engine": {"hops": eng.counters.hops, "pairs_evaluated": eng.counters.pairs_evaluated, "evaluating": evaluate},
    }


async def run_zmq(seconds: float, evaluate_pairs: int, encoding: str) -> dict[str, Any]:
    from streamcorr.ingest.payload import PayloadDecoder
    from streamcorr.ingest.zmq import ZmqSource

    names = [f"ch{c:03d}" for c in range(ZMQ_CHANNELS)]
    eng = _engine(names, ZMQ_MSG_RATE * ZMQ_SAMPLES_PER_MSG, evaluate_pairs)
    dec = PayloadDecoder(channel_template="{key}")
    src = ZmqSource(endpoint="tcp://127.0.0.1:*", mode="pull", bind=True, decoder=dec, sink=eng.push)

    def spawn(link: Any) -> Any:
        args = (src.bound_endpoint, seconds, ZMQ_MSG_RATE, encoding, link)
        proc = mp.get_context("spawn").Process(target=publish_zmq, args=args, daemon=True)
        proc.start()
        return proc

    res = await _drive(eng, src, evaluate_pairs > 0, spawn, ZMQ_CHANNELS * ZMQ_SAMPLES_PER_MSG, 1)
    return {"transport": "zmq", "seconds": seconds, "encoding": encoding, "channels": ZMQ_CHANNELS,
            "samples_per_msg": ZMQ_SAMPLES_PER_MSG, "target_msg_per_s": ZMQ_MSG_RATE,
            "evaluate_pairs": evaluate_pairs, **res}  # fmt: skip


async def run_mqtt(seconds: float, evaluate_pairs: int, host: str, port: int, qos: int) -> dict[str, Any]:
    from streamcorr.config import MqttConnection
    from streamcorr.ingest.mqtt import MqttSource
    from streamcorr.ingest.payload import PayloadDecoder

    prefix = f"streamcorr-bench/{uuid.uuid4().hex[:12]}"
    names = [f"imu{d}.{k}" for d in range(MQTT_DEVICES) for k in MQTT_KEYS]
    eng = _engine(names, MQTT_MSG_RATE / MQTT_DEVICES, evaluate_pairs)
    dec = PayloadDecoder(channel_template="{topic[2]}.{key}", format="json")
    settings = MqttConnection(host=host, port=port, qos=qos)
    src = MqttSource(settings=settings, topics=[f"{prefix}/+"], decoder=dec, sink=eng.push)

    def spawn(link: Any) -> Any:
        args = (host, port, prefix, seconds, MQTT_MSG_RATE, qos, link)
        proc = mp.get_context("spawn").Process(target=publish_mqtt, args=args, daemon=True)
        proc.start()
        return proc

    res = await _drive(eng, src, evaluate_pairs > 0, spawn, len(MQTT_KEYS), MQTT_DEVICES)
    return {"transport": "mqtt", "seconds": seconds, "qos": qos, "devices": MQTT_DEVICES,
            "samples_per_msg": len(MQTT_KEYS), "target_msg_per_s": MQTT_MSG_RATE,
            "evaluate_pairs": evaluate_pairs, **res}  # fmt: skip


def _markdown(rows: list[dict[str, Any]]) -> str:
    md = ["## Ingest load: publisher process -> transport -> source -> Engine.push\n"]
    for r in rows:
        i = r["ingest"]
        sink = (
            f"engine evaluating {r['evaluate_pairs']} pairs per 1 s hop"
            if r["evaluate_pairs"]
            else "Engine.push only (engine not started: no MI evaluation)"
        )
        if r["transport"] == "zmq":
            what = (f"ZeroMQ PUSH -> PULL, msgpack chunks of {r['channels']} channels x {r['samples_per_msg']} "
                    f"samples ({r['encoding']}), target {r['target_msg_per_s']:.0f} msg/s")  # fmt: skip
            target = ("samples/s", 100_000, r["steady_samples_per_s"])
        else:
            what = (f"MQTT via Mosquitto, QoS {r['qos']}, JSON fields ({r['samples_per_msg']} channels) on "
                    f"{r['devices']} topics, target {r['target_msg_per_s']:.0f} msg/s")  # fmt: skip
            target = ("msg/s", 5_000, r["steady_msg_per_s"])
        ok = "met" if target[2] >= target[1] else "NOT met"
        drops = ", ".join(f"{k} {v}" for k, v in sorted(i["drops"].items())) or "none"
        rej = ", ".join(f"{k} {v}" for k, v in r["engine_rejects"].items() if v) or "none"
        ledger = "closes exactly" if r["ledger_messages_ok"] and r["ledger_samples_ok"] else "**DOES NOT CLOSE**"
        broker = ""
        if r["transport"] == "mqtt" and r["broker_cpu_pct"] is not None:
            broker = f", mosquitto ({r['broker_processes']} process(es) on the host) {r['broker_cpu_pct']:.0f}%"
        md += [
            f"### {r['transport']}: {what}; {r['seconds']:.0f} s; sink: {sink}\n",
            "| | messages | samples |",
            "|---|---|---|",
            f"| published | {r['published']['messages']:,} | {r['published']['samples']:,} |",
            f"| handled by the source | {i['messages']:,} | {i['samples_handed']:,} handed |",
            f"| accepted by the engine | | {i['samples_accepted']:,} |",
            f"| lost before the source (queue_full + seq_gaps) | {r['lost_messages']:,} | |",
            "",
            f"- sustained ingest: **{r['steady_msg_per_s']:,.0f} msg/s, {r['steady_samples_per_s']:,.0f} samples/s** "
            f"over {r['steady_window_s']:.1f} s (target >= {target[1]:,} {target[0]}: {ok}); publisher achieved "
            f"{r['publisher']['msg_per_s']:,.0f} msg/s; the source caught up {r['catch_up_s']:.2f} s after the last "
            "message was sent",
            f"- decode drops: {drops}; engine rejects: {rej}; ledger {ledger} "
            f"(published = handled + lost; samples = accepted + rejected + dropped + in lost messages)",
            f"- CPU (% of one core): source + engine {r['consumer_cpu_pct']:.0f}%, "
            f"publisher {r['publisher']['cpu_pct']:.0f}%{broker}",
            f"- RSS of the source + engine process: start {r['rss_mb']['start']:.0f} MB, peak "
            f"{r['rss_mb']['peak']:.0f} MB, end {r['rss_mb']['end']:.0f} MB",
            f"- engine: {r['engine']['hops']} hops, {r['engine']['pairs_evaluated']} pair estimates",
            "",
        ]
    return "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("transport", choices=["zmq", "mqtt", "all"])
    ap.add_argument("--seconds", type=float, default=120.0, help="publishing time per transport")
    ap.add_argument("--evaluate-pairs", type=int, default=0, help="0: push only; N: evaluate N pairs per hop")
    ap.add_argument("--encoding", choices=["list", "bytes"], default="list", help="zmq chunk arrays")
    ap.add_argument("--broker", default="127.0.0.1:1883", help="MQTT host:port")
    ap.add_argument("--qos", type=int, choices=[0, 1, 2], default=0)
    ap.add_argument("--name", default=None, help="results file stem (default ingest_load, _quick under 120 s)")
    ap.add_argument("--ceiling", action="store_true",
                    help="mqtt: bursts at the publisher's pace, bench.mqtt_burst with its defaults (300,000 messages, "
                         "3 bursts; run bench.mqtt_burst itself for its options)")  # fmt: skip
    ap.add_argument("--daemon", action="store_true", help="with --ceiling: a streamcorr run process subscribes")
    args = ap.parse_args(argv)
    if args.daemon and not args.ceiling:
        ap.error("--daemon goes with --ceiling: python -m bench.ingest_load mqtt --ceiling --daemon")
    if args.ceiling:
        if args.transport != "mqtt":
            ap.error("--ceiling is an MQTT mode: python -m bench.ingest_load mqtt --ceiling")
        from bench import mqtt_burst

        return mqtt_burst.main(["--broker", args.broker] + (["--daemon"] if args.daemon else []))
    host, port = args.broker.rsplit(":", 1)
    rows = []
    if args.transport in ("zmq", "all"):
        rows.append(asyncio.run(run_zmq(args.seconds, args.evaluate_pairs, args.encoding)))
    if args.transport in ("mqtt", "all"):
        rows.append(asyncio.run(run_mqtt(args.seconds, args.evaluate_pairs, host, int(port), args.qos)))
    name = args.name or ("ingest_load" if args.seconds >= 120 else "ingest_load_quick")
    write_results(name, {"env": environment(), "runs": rows}, _markdown(rows))
    return 0 if all(r["ledger_messages_ok"] and r["ledger_samples_ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
