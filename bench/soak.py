"""Soak: a real daemon fed over MQTT for a long run, with broker restarts, hostile messages, recording under a
disk cap and churning channel names.

    python -m bench.soak                 # 60 minutes, broker restarted every 5 minutes
    python -m bench.soak --minutes 20    # the operations bar: 20 minutes
    python -m bench.soak --quick         # 3 minutes, a restart every minute (a smoke run)

A private Mosquitto and one ``streamcorr run`` process (MQTT source, ZeroMQ output, Parquet recording under a
small ``max_bytes`` cap, HTTP /metrics) are started. Over MQTT, from their own clients:

* six devices of two fields each publish smooth signals (AR(1), phi 0.98) at 20 Hz in chunks on their own
  clocks (a fixed offset of up to 40 ms and 2 ms jitter per device); ``d1.y`` follows ``d0.x`` (a dependent pair);
* a hostile client sends a mix of bad messages every 20 s (undecodable bytes, oversize, wrong schema, absurd
  times, NaN values) and records how many of each reached the broker;
* a churning client publishes a few samples under a new name every 5 s, then never again.

The broker is stopped for ``--outage-s`` every ``--restart-every-s``. The run samples the daemon's RSS every
2 s and /metrics every 10 s, records every ZeroMQ snapshot's arrival, then sends SIGTERM and reads back every
Parquet file. Reported against the bars: RSS slope after warm-up (<= 20 MB/h), hops published outside outages
(>= 90%), the ledger (samples handed to the engine - accepted = the engine's drops, and each hostile reason's
drops equal to the messages the broker accepted), every Parquet file readable, SIGTERM exit code 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np

from .common import environment, write_results
from .hostile import Broker, Recorder, _free_port, _metrics, _proc_status, _start_daemon, _wait, _whole_ledger

RATE = 20.0
HOP_S = 1.0
DEVICES = 6
HOSTILE_EVERY_S = 20.0
CHURN_EVERY_S = 5.0
RSS_SLOPE_BAR = 20.0  # MB/h after warm-up
PUBLISHED_BAR = 0.90
OUTAGE_GRACE_S = 15.0  # after the broker is back: reconnect backoff plus one window of fresh samples
# (name, payload, the ledger reason its drop is counted under, how many items it drops)
HOSTILE: list[tuple[str, bytes, str, int]] = [
    ("bytes", b"\xc1\xc1\xc1 not a payload", "decode", 1),
    ("oversize", b"1" * (2 << 20), "oversize", 1),
    ("schema", b'{"channels": 5}', "schema", 1),
    ("absurd time", json.dumps({"t": 1e300, "h0": 1.0}).encode(), "time", 1),
]


def _config(broker_port: int, out: str, http_port: int, record_dir: Path) -> dict[str, Any]:
    return {
        "version": 1,
        "sources": [{"type": "mqtt", "port": broker_port, "topics": ["soak/in/#"],
                     "channel_template": "{topic[2]}.{key}", "reconnect_min_s": 0.2, "reconnect_max_s": 2.0}],
        "channels": {"rate_hz": RATE, "max_channels": 128},
        "window": {"samples": 256, "hop_s": HOP_S},
        "outputs": {"zmq": {"endpoint": out},
                    "record": {"directory": str(record_dir), "rotate_s": 30.0, "max_bytes": 2 << 20}},
        "http": {"port": http_port},
        "logging": {"format": "text", "level": "WARNING"},
    }  # fmt: skip


class Clients(threading.Thread):
    """The devices, the hostile client and the churning client, each its own MQTT connection that reconnects."""

    def __init__(self, port: int, seed: int) -> None:
        super().__init__(daemon=True, name="clients")
        self.port, self.rng = port, np.random.default_rng(seed)
        self.stop_event = threading.Event()
        self.samples_sent = 0
        self.hostile_sent: Counter[str] = Counter()
        self.churn_names = 0
        self.publish_failures = 0

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        await asyncio.gather(self._devices(), self._hostile(), self._churn())

    async def _loop(self, name: str, body: Any) -> None:
        """Runs body(client) on a fresh connection until stopped; a lost broker costs a retry after 0.5 s."""
        while not self.stop_event.is_set():
            try:
                async with aiomqtt.Client("127.0.0.1", self.port, identifier=f"soak-{name}") as client:
                    await body(client)
            except aiomqtt.MqttError:
                self.publish_failures += 1
                await asyncio.sleep(0.5)

    async def _devices(self) -> None:
        offsets = self.rng.uniform(0.0, 0.04, DEVICES)
        state = np.zeros((DEVICES, 2))
        last_tick = math.floor(time.time() * RATE)

        async def body(client: aiomqtt.Client) -> None:
            nonlocal last_tick
            while not self.stop_event.is_set():
                now_tick = math.floor(time.time() * RATE)
                ticks = np.arange(last_tick + 1, now_tick + 1)
                last_tick = now_tick  # samples of an outage are never sent (the device has no buffer)
                for d in range(DEVICES):
                    n = len(ticks)
                    if n == 0:
                        continue
                    xs = np.empty((n, 2))
                    for k in range(n):
                        state[d] = 0.98 * state[d] + 0.2 * self.rng.standard_normal(2)
                        xs[k] = state[d]
                    if d == 1:  # d1.y follows d0.x
                        xs[:, 1] = np.tanh(state_hist[-n:]) + 0.3 * self.rng.standard_normal(n)
                    t = ticks / RATE + offsets[d] + self.rng.normal(0.0, 0.002, n)
                    if d == 0:
                        state_hist.extend(xs[:, 0].tolist())
                        del state_hist[:-1000]
                    chunk = {"t": t.tolist(), "channels": {"x": xs[:, 0].tolist(), "y": xs[:, 1].tolist()}}
                    await client.publish(f"soak/in/d{d}", json.dumps(chunk), qos=1)
                    self.samples_sent += 2 * n
                await asyncio.sleep(0.25)

        state_hist: list[float] = [0.0] * 1000
        await self._loop("devices", body)

    async def _hostile(self) -> None:
        async def body(client: aiomqtt.Client) -> None:
            while not self.stop_event.is_set():
                await asyncio.sleep(HOSTILE_EVERY_S)
                for name, payload, _, _ in HOSTILE:
                    await client.publish("soak/in/h", payload, qos=1)  # returns once the broker has it
                    self.hostile_sent[name] += 1

        await self._loop("hostile", body)

    async def _churn(self) -> None:
        async def body(client: aiomqtt.Client) -> None:
            while not self.stop_event.is_set():
                t = time.time()
                chunk = {"t": [t + k / RATE for k in range(5)], "channels": {"v": self.rng.standard_normal(5).tolist()}}
                await client.publish(f"soak/in/churn{self.churn_names}", json.dumps(chunk), qos=1)
                self.churn_names += 1
                await asyncio.sleep(CHURN_EVERY_S)

        await self._loop("churn", body)


def _rss_slope(samples: list[tuple[float, float]], warmup_s: float) -> float:
    """Least-squares slope of RSS (MB/h) over the samples after warm-up."""
    if not samples:
        return math.nan
    t0 = samples[0][0]
    pts = [(t - t0, r) for t, r in samples if t - t0 >= warmup_s and math.isfinite(r)]
    if len(pts) < 10:
        return math.nan
    t, r = np.array(pts).T
    return float(np.polyfit(t / 3600.0, r, 1)[0])


def _published_share(arrivals: list[float], t0: float, t1: float, outages: list[tuple[float, float]]) -> float:
    """Share of the hop slots in [t0, t1], outside outages (plus grace), in which a snapshot arrived."""
    slots = np.arange(t0, t1 - HOP_S, HOP_S)
    keep = np.ones(len(slots), bool)
    for a, b in outages:
        keep &= ~((slots + HOP_S > a) & (slots < b + OUTAGE_GRACE_S))
    got = np.zeros(len(slots), bool)
    idx = np.floor((np.asarray(arrivals) - t0) / HOP_S).astype(int)
    got[idx[(idx >= 0) & (idx < len(slots))]] = True
    return float(got[keep].mean()) if keep.any() else math.nan


def _read_parquet(directory: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    files = sorted(directory.glob("*.parquet"))
    bad, rows = [], 0
    for f in files:
        try:
            rows += pq.read_table(f).num_rows
        except Exception as exc:  # a file that does not read is the finding, not a crash of the bench
            bad.append(f"{f.name}: {type(exc).__name__}")
    size = sum(f.stat().st_size for f in directory.iterdir() if f.is_file())
    return {"files": len(files), "unreadable": bad, "rows": rows, "bytes_on_disk": size}


def run(minutes: float, restart_every_s: float, outage_s: float, seed: int = 0) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="streamcorr-soak-"))
    broker = Broker(workdir)
    broker.start()
    http_port, out = _free_port(), f"tcp://127.0.0.1:{_free_port()}"
    record_dir = workdir / "record"
    record_dir.mkdir()
    proc = _start_daemon(workdir, _config(broker.port, out, http_port, record_dir), "daemon")
    rec, clients = Recorder(out), Clients(broker.port, seed)
    rss: list[tuple[float, float]] = []
    metrics_log: list[dict[str, Any]] = []
    outages: list[tuple[float, float]] = []
    try:
        _wait(lambda: _metrics(http_port).get('streamcorr_source_connected{source="mqtt0"}', 0) == 1, 180,
              "MQTT source connected", proc)  # fmt: skip
        rec.start()
        clients.start()
        t_start = time.time()
        t_end = t_start + minutes * 60
        next_restart, next_metrics = t_start + restart_every_s, t_start
        while time.time() < t_end and proc.poll() is None:
            now = time.time()
            rss.append((now, _proc_status(proc.pid)["VmRSS"]))
            if now >= next_metrics:
                m = _metrics(http_port)
                metrics_log.append({"t": round(now - t_start, 1), "rss_mb": rss[-1][1],
                                    "channels": rec.snaps[-1][2] if rec.snaps else 0,
                                    "snapshots": len(rec.snaps), "ledger": _whole_ledger(m)})  # fmt: skip
                next_metrics += 10.0
            if now >= next_restart and now + outage_s + 30 < t_end:
                a = time.time()
                broker.stop()
                time.sleep(outage_s)
                broker.start()
                outages.append((a, time.time()))
                print(f"{a - t_start:7.0f} s: broker restarted; RSS {rss[-1][1]:.0f} MB, "
                      f"{len(rec.snaps)} snapshots", flush=True)  # fmt: skip
                next_restart += restart_every_s
            time.sleep(2.0)
        clients.stop_event.set()
        time.sleep(3.0)  # the last messages drain through the decoder
        final = _metrics(http_port)
        t_stop = time.time()
        proc.send_signal(signal.SIGTERM)
        try:
            exit_code: int | None = proc.wait(timeout=30)
        except Exception:
            exit_code = None
        exit_s = time.time() - t_stop
    finally:
        clients.stop_event.set()
        rec.stop_event.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        broker.stop()
    drops = {
        k.split('reason="')[1].split('"')[0]: v
        for k, v in final.items()
        if k.startswith("streamcorr_samples_dropped_total{") and 'stage="decode:mqtt0"' in k
    }
    hostile_expected: Counter[str] = Counter()
    for name, _, reason, n in HOSTILE:
        hostile_expected[reason] += n * clients.hostile_sent[name]
    warmup_s = min(300.0, minutes * 60 / 4)
    ledger = _whole_ledger(final)
    res = {
        "minutes": minutes, "restart_every_s": restart_every_s, "outage_s": outage_s, "broker_restarts": len(outages),
        "rss_start_mb": rss[0][1] if rss else math.nan, "rss_end_mb": rss[-1][1] if rss else math.nan,
        "rss_peak_mb": max((r for _, r in rss if math.isfinite(r)), default=math.nan),
        "rss_slope_mb_per_h": _rss_slope(rss, warmup_s), "warmup_s": warmup_s,
        "rss_slope_second_half_mb_per_h": _rss_slope(rss, minutes * 30.0),
        "published_share": _published_share([s[0] for s in rec.snaps], t_start + warmup_s, t_stop, outages),
        "snapshots": len(rec.snaps), "undecodable_snapshots": rec.errors,
        "channels_last_snapshot": rec.snaps[-1][2] if rec.snaps else 0, "churn_names": clients.churn_names,
        "samples_sent": clients.samples_sent, "hostile_sent": dict(clients.hostile_sent),
        "hostile_expected_drops": dict(hostile_expected), "decode_drops": drops,
        "hostile_ledger_exact": all(drops.get(r, 0) == n for r, n in hostile_expected.items()),
        "engine_ledger": ledger, "parquet": _read_parquet(record_dir), "sigterm_exit_code": exit_code,
        "sigterm_exit_s": round(exit_s, 2), "timeline": metrics_log,
    }  # fmt: skip
    res["rss_samples"] = [(round(t - t_start, 1), round(r, 1)) for t, r in rss[:: max(1, len(rss) // 400)]]
    return res


def _markdown(r: dict[str, Any], cmd: str) -> str:
    def mark(ok: bool) -> str:
        return "ok" if ok else "MISSED"

    pq = r["parquet"]
    slope_ok = math.isfinite(r["rss_slope_mb_per_h"]) and r["rss_slope_mb_per_h"] <= RSS_SLOPE_BAR
    rows = [
        ("RSS slope after warm-up", f"{r['rss_slope_mb_per_h']:+.1f} MB/h (start {r['rss_start_mb']:.0f}, end "
         f"{r['rss_end_mb']:.0f}, peak {r['rss_peak_mb']:.0f} MB; warm-up {r['warmup_s']:.0f} s; over the second half "
         f"{r['rss_slope_second_half_mb_per_h']:+.1f} MB/h)",
         f"<= {RSS_SLOPE_BAR:.0f} MB/h", mark(slope_ok)),
        ("hops published outside outages", f"{100 * r['published_share']:.1f}% ({r['snapshots']} snapshots)",
         f">= {100 * PUBLISHED_BAR:.0f}%", mark(r["published_share"] >= PUBLISHED_BAR)),
        ("engine ledger (handed - accepted = engine drops)",
         "{handed:.0f} - {accepted} = {engine_drops:.0f}".format(**r["engine_ledger"]),
         "exact", mark(bool(r["engine_ledger"]["closes"]))),
        ("hostile drops by reason", f"expected {r['hostile_expected_drops']}, counted "
         f"{ {k: r['decode_drops'].get(k, 0) for k in r['hostile_expected_drops']} }", "exact",
         mark(r["hostile_ledger_exact"])),
        ("Parquet files readable", f"{pq['files'] - len(pq['unreadable'])} of {pq['files']} ({pq['rows']} rows, "
         f"{pq['bytes_on_disk'] / 1e6:.2f} MB on disk under a 2.10 MB cap)", "all", mark(not pq["unreadable"])),
        ("SIGTERM", f"exit code {r['sigterm_exit_code']} after {r['sigterm_exit_s']} s", "0",
         mark(r["sigterm_exit_code"] == 0)),
        ("channels in the last snapshot", f"{r['channels_last_snapshot']} (12 device channels; "
         f"{r['churn_names']} churning names seen)", "-", "-"),
    ]  # fmt: skip
    lines = [
        f"# Soak: {r['minutes']:g} minutes, broker restarted {r['broker_restarts']} times",
        "",
        f"`{cmd}`. A daemon fed over MQTT by six smooth 20 Hz devices on their own clocks, a hostile client every "
        f"{HOSTILE_EVERY_S:.0f} s and a new channel name every {CHURN_EVERY_S:.0f} s; Mosquitto stopped for "
        f"{r['outage_s']:g} s every {r['restart_every_s']:g} s; recording to Parquet under a 2 MiB cap.",
        "",
        "| measure | result | bar | |",
        "|---|---|---|---|",
        *[f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows],
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--restart-every-s", type=float, default=300.0)
    ap.add_argument("--outage-s", type=float, default=5.0)
    ap.add_argument("--quick", action="store_true", help="3 minutes, a restart every minute")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.quick:
        args.minutes, args.restart_every_s = 3.0, 60.0
    res = run(args.minutes, args.restart_every_s, args.outage_s, args.seed)
    res["env"] = environment()
    cmd = "python -m bench.soak" + (" --quick" if args.quick else f" --minutes {args.minutes:g}")
    name = "soak_quick" if args.quick else f"soak_{args.minutes:g}min"
    write_results(name, res, _markdown(res, cmd))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
