"""Issue 29's slow ZeroMQ subscribers: three SUB clients that never read 256-channel snapshots, then leave.

    python -m bench.slow_clients [--quick] [--rate-hz 5] [--stuck-s 30] [--after-s 15]

Each variant runs in a process of its own, publishing one 256-channel snapshot (about 1.1 MiB on the wire)
every 1 / rate-hz seconds: first alone, then with three SUB clients that subscribe and never read (each client
holds one message itself, RCVHWM 1, and a few KiB in its kernel buffer: a client whose own queue is full),
then after they disconnect, while the publisher goes on. The publisher's RSS is sampled every 0.5 s from
/proc. Variants, in the same run on the same snapshots:

* ``before``: what the ZeroMQ output was until issue 29: a PUB socket, ``SNDHWM`` 1000 messages, each
  envelope copied into libzmq (the old sink's socket calls, without its wrapper);
* ``bounded``: the ZeroMQ output now (``ZmqPublisher``), ``max_queue_bytes`` at its default (8 MiB) and at
  64 MiB; with its counters (snapshots counted as missed, bytes libzmq holds, the high-water mark).

The table gives RSS before the clients came, its peak while they were stuck, at their leaving, and at the end;
the timeline of every sample is in the JSON file. Here, in a process with nothing else on its heap, even the
old path's memory comes back after the clients leave (glibc returns the freed buffers); in the daemon of
issue 29's report, whose heap the engine shares, it did not, which the trim on a subscriber's leaving covers
(``tests/publish/test_output_bounds.py`` checks it with zero-copy buffers, which glibc keeps).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import multiprocessing
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from streamcorr.engine.matrix import Snapshot
from streamcorr.publish.envelope import encode_snapshot

from .common import environment, write_results

N_CHANNELS = 256
CLIENTS = 3
MIB = 1 << 20
SAMPLE_S = 0.5


def _snapshot(n: int) -> Snapshot:
    rng = np.random.default_rng(29)
    mi = rng.random((n, n))
    mi = (mi + mi.T) / 2
    return Snapshot(1, 1_000_000_000, time.time_ns(), tuple(f"ch{k:03d}" for k in range(n)), mi,
                    rng.random((n, n)) * 10, np.ones((n, n)), source=np.ones((n, n), np.uint8),
                    dependent=mi > 0.9, n_eff=np.full((n, n), 200.0))  # fmt: skip


async def _run_bounded(conn: Connection, max_queue_bytes: int, period_s: float, total_s: float) -> dict[str, Any]:
    from streamcorr.publish.zmq_sink import ZmqPublisher

    snap = _snapshot(N_CHANNELS)
    async with ZmqPublisher(endpoint="tcp://127.0.0.1:*", snapshot_endpoint=None, prefix="bench",
                            max_queue_bytes=max_queue_bytes) as pub:  # fmt: skip
        conn.send(pub.endpoint)
        conn.recv()  # go
        t0 = time.monotonic()
        k = 0
        peak_queued = 0
        while time.monotonic() - t0 < total_s:
            k += 1
            await pub.publish_snapshot(dataclasses.replace(snap, seq=k, wall_ns=time.time_ns()))
            peak_queued = max(peak_queued, pub.counters.extra["queued_bytes"])
            await asyncio.sleep(max(0.0, t0 + k * period_s - time.monotonic()))
        return {"snapshots": k, "counted_missed": pub.counters.dropped["snapshot"], "hwm": pub.hwm,
                "peak_queued_mib": round(peak_queued / MIB, 1),
                "queued_mib_at_end": round(pub.counters.extra["queued_bytes"] / MIB, 1)}  # fmt: skip


def _run_before(conn: Connection, period_s: float, total_s: float) -> dict[str, Any]:
    snap = _snapshot(N_CHANNELS)
    ctx: zmq.Context[Any] = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.SNDHWM, 1000)
    pub.bind("tcp://127.0.0.1:*")
    conn.send(pub.getsockopt_string(zmq.LAST_ENDPOINT))
    conn.recv()  # go
    t0 = time.monotonic()
    k = 0
    latest = b""
    while time.monotonic() - t0 < total_s:
        k += 1
        latest = encode_snapshot(dataclasses.replace(snap, seq=k, wall_ns=time.time_ns()), seq=k)
        pub.send_multipart([b"bench/snapshot", latest], zmq.NOBLOCK)
        time.sleep(max(0.0, t0 + k * period_s - time.monotonic()))
    pub.close()
    ctx.term()
    return {"snapshots": k, "counted_missed": None, "hwm": 1000, "peak_queued_mib": None, "queued_mib_at_end": None}


def _child(conn: Connection, variant: str, max_queue_bytes: int, period_s: float, total_s: float) -> None:
    if variant == "before":
        result = _run_before(conn, period_s, total_s)
    else:
        result = asyncio.run(_run_bounded(conn, max_queue_bytes, period_s, total_s))
    conn.send(result)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_variant(name: str, variant: str, max_queue_bytes: int, args: argparse.Namespace) -> dict[str, Any]:
    spawn = multiprocessing.get_context("spawn")
    ours, theirs = spawn.Pipe()
    total_s = args.alone_s + args.stuck_s + args.after_s
    proc = spawn.Process(target=_child, args=(theirs, variant, max_queue_bytes, 1 / args.rate_hz, total_s))
    proc.start()
    endpoint = ours.recv()
    ctx: zmq.Context[Any] = zmq.Context()
    subs: list[zmq.Socket[Any]] = []
    timeline: list[tuple[float, str, float]] = []
    ours.send("go")
    t0 = time.monotonic()
    phase = "alone"
    marks: dict[str, float] = {}
    while proc.is_alive() and not ours.poll(0):
        t = time.monotonic() - t0
        if phase == "alone" and t >= args.alone_s:
            marks["clients came"] = _rss_mib(proc.pid)
            for _ in range(CLIENTS):
                sub = ctx.socket(zmq.SUB)
                sub.setsockopt(zmq.RCVHWM, 1)
                sub.setsockopt(zmq.RCVBUF, 4096)
                sub.setsockopt(zmq.LINGER, 0)
                sub.connect(endpoint)
                sub.setsockopt(zmq.SUBSCRIBE, b"bench/")
                subs.append(sub)
            phase = "stuck"
        elif phase == "stuck" and t >= args.alone_s + args.stuck_s:
            marks["clients left"] = _rss_mib(proc.pid)
            for sub in subs:
                sub.close()
            phase = "left"
        rss = _rss_mib(proc.pid)
        timeline.append((round(t, 1), phase, round(rss, 1)))
        print(f"{name:>16}  t={t:5.1f} s  {phase:>5}  RSS {rss:7.1f} MiB", flush=True)
        time.sleep(SAMPLE_S)
    result = ours.recv()
    proc.join(30)
    ctx.term()
    stuck = [rss for _, phase, rss in timeline if phase == "stuck"]
    left = [rss for _, phase, rss in timeline if phase == "left"]
    return {"name": name, "max_queue_bytes": max_queue_bytes if variant != "before" else None, **result,
            "rss_alone_mib": marks.get("clients came"), "rss_peak_stuck_mib": max(stuck, default=None),
            "rss_at_leave_mib": marks.get("clients left"), "rss_end_mib": left[-1] if left else None,
            "timeline": timeline}  # fmt: skip


def _markdown(res: dict[str, Any]) -> str:
    a = res["args"]
    lines = [
        "# Slow ZeroMQ subscribers (issue 29)",
        "",
        f"`python -m bench.slow_clients{' --quick' if a['quick'] else ''}`: one {N_CHANNELS}-channel snapshot "
        f"({res['snapshot_mib']:.2f} MiB on the wire) every {1 / a['rate_hz']:.2f} s; {CLIENTS} SUB clients that "
        f"never read (RCVHWM 1, 4 KiB receive buffer) from t = {a['alone_s']} s for {a['stuck_s']} s, then "
        f"disconnected, the publisher going on for {a['after_s']} s. RSS of the publisher's process (MiB).",
        "",
        "| variant | hwm (messages) | RSS alone | peak while stuck | at their leaving | end (after) | libzmq held, "
        "peak (MiB) | snapshots sent | counted as missed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["runs"]:
        missed = "-" if r["counted_missed"] is None else r["counted_missed"]
        lines.append(f"| {r['name']} | {r['hwm']} | {r['rss_alone_mib']:.0f} | {r['rss_peak_stuck_mib']:.0f} | "
                     f"{r['rss_at_leave_mib']:.0f} | {r['rss_end_mib']:.0f} | {r['peak_queued_mib'] or '-'} | "
                     f"{r['snapshots']} | {missed} |")  # fmt: skip
    lines += [
        "",
        "`before`: a PUB socket with SNDHWM 1000 and copying sends, as the output was until issue 29 (libzmq "
        "drops silently, nothing counted). `bounded`: `ZmqPublisher` with `max_queue_bytes`: the high-water mark "
        "is `max_queue_bytes // largest message - 1`; libzmq holds at most max(max_queue_bytes, 2 x the largest "
        "message) per subscriber (the same messages for all three here, held once); a subscriber leaving frees "
        "its queue and the heap is trimmed. `counted as missed`: the output's lower bound "
        '(`streamcorr_output_dropped{output="zmq",stream="snapshot"}`). Timelines in the JSON file.',
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short phases (a smoke test, not for the table)")
    ap.add_argument("--rate-hz", type=float, default=5.0, help="snapshots per second [5]")
    ap.add_argument("--alone-s", type=float, default=5.0, help="seconds before the clients come [5]")
    ap.add_argument("--stuck-s", type=float, default=30.0, help="seconds the clients stay without reading [30]")
    ap.add_argument("--after-s", type=float, default=15.0, help="seconds the publisher goes on after [15]")
    args = ap.parse_args(argv)
    if args.quick:
        args.alone_s, args.stuck_s, args.after_s = 2.0, 6.0, 4.0
    env = environment()
    snapshot_mib = len(encode_snapshot(_snapshot(N_CHANNELS), seq=1)) / MIB
    runs = [run_variant("before", "before", 0, args),
            run_variant("bounded 8 MiB", "bounded", 8 * MIB, args),
            run_variant("bounded 64 MiB", "bounded", 64 * MIB, args)]  # fmt: skip
    res = {"env": env, "args": vars(args), "snapshot_mib": snapshot_mib, "runs": runs}
    write_results("slow_clients" + ("_quick" if args.quick else ""), res, _markdown(res))


if __name__ == "__main__":
    main()
