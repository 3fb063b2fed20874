"""Sparse-graph live benchmark: a real daemon fed over ZeroMQ, read by a separate subscriber.

    python -m bench.live_sparse [--duration-s 150] [--onset-s 70] [--channels 256] [--quick]

`streamcorr run` with a plain configuration (ZeroMQ PULL source, 50 Hz clock, window 512, 1-s hop, the
ZeroMQ outputs; no screening or pair keys) ingests 256 channels that this process PUSHes in real time as
msgpack chunks every 100 ms (wall-clock timestamps). 60 groups of four channels share a source s: a hub
(s plus a little noise) and three spokes f(s) + noise with f linear, square, sine or abs, so every pair in
a group is dependent (360 pairs, 330 of them >= 0.2 nats: 1% of 32,640); 16 more channels form 8 pairs
that become dependent at ``onset_s`` (linear, square, sine, abs, twice); cross-group pairs are
independent. A SUB socket in a thread of this process decodes every snapshot and event envelope.

Ground truth for the in-group pairs is the model's mean estimate on long windows (4 x 4096 samples) of the
same generator: pairs at >= 0.2 nats are "dependent", weaker ones are left out of both the dependent and
the independent counts (reported). Reported, after the first window has filled:

- snapshots received per hop; publish latency (receipt minus the window's end time) p50 / p99;
- per dependent pair, the share of snapshots where its cell was refreshed within 1.5 s with a network
  estimate >= 0.1 nats (the worst pair and the mean);
- for each pair that becomes dependent: the delay from onset to its first became-dependent event and to
  its first network estimate >= 0.1 nats in a snapshot;
- the share of independent cells >= 0.1 nats; the share of cells assessed (any source) within 30 s;
- the daemon's CPU time and the machine's load average (the machine may be shared).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import environment, write_results

RATE_HZ, WINDOW, CHUNK_S = 50.0, 512, 0.1
KINDS = ("linear", "square", "sine", "abs")
NOISE = {"linear": 0.4, "square": 0.4, "sine": 0.2, "abs": 0.2}  # spoke noise: hub-spoke pairs 0.7-0.9 nats
N_GROUPS, GROUP = 60, 4  # 240 channels, 360 in-group pairs
N_LATE = 8


def _f(kind: str, s: np.ndarray) -> np.ndarray:
    return {"linear": s, "square": s**2, "sine": np.sin(2 * s), "abs": np.abs(s)}[kind]


def _group_kinds(g: int) -> list[str]:
    return [KINDS[(g + m) % 4] for m in range(GROUP - 1)]


class Generator:
    """The channels' values for samples k0..k0+n-1: (C, n); late pairs switch on at sample `onset_k`."""

    def __init__(self, n_ch: int, onset_k: int, seed: int = 0) -> None:
        self.n_ch, self.onset_k = n_ch, onset_k
        self.rng = np.random.default_rng(seed)
        self.late = [(N_GROUPS * GROUP + 2 * p, N_GROUPS * GROUP + 2 * p + 1) for p in range(N_LATE)]
        assert self.late[-1][1] < n_ch, "not enough channels for the graph"

    def chunk(self, k0: int, n: int) -> np.ndarray:
        x = self.rng.standard_normal((self.n_ch, n))
        for g in range(N_GROUPS):
            c = g * GROUP
            s = x[c].copy()
            x[c] = s + 0.2 * self.rng.standard_normal(n)
            for m, kind in enumerate(_group_kinds(g)):
                x[c + 1 + m] = _f(kind, s) + NOISE[kind] * x[c + 1 + m]
        on = np.arange(k0, k0 + n) >= self.onset_k
        for p, (a, b) in enumerate(self.late):
            kind = KINDS[p % 4]
            x[b, on] = _f(kind, x[a, on]) + NOISE[kind] * x[b, on]
        return x


def ground_truth() -> dict[tuple[Any, ...], float]:
    """Mean model MI of every in-group pair (local indices within a group type) on 4 windows of 4096."""
    from streamcorr.estimate.estimator import Estimator

    est = Estimator()
    out: dict[tuple[Any, ...], float] = {}
    gen = Generator(N_GROUPS * GROUP + 2 * N_LATE, onset_k=0, seed=99)
    x = gen.chunk(0, 4 * 4096)
    for g in range(4):  # four group types (kinds rotate with g % 4)
        for a in range(GROUP):
            for b in range(a + 1, GROUP):
                xa = x[g * GROUP + a].reshape(4, 4096)
                xb = x[g * GROUP + b].reshape(4, 4096)
                out[(g, a, b)] = float(est.estimate_batch(xa, xb).mean())
    for p, (a, b) in enumerate(gen.late[:4]):
        out[("late", KINDS[p % 4])] = float(est.estimate_batch(x[a].reshape(4, 4096), x[b].reshape(4, 4096)).mean())
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return float("nan")


def _subscribe(endpoint: str, stop: threading.Event, out: list[tuple[float, Any]]) -> None:
    import zmq

    from streamcorr.publish.envelope import decode_message

    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"streamcorr/snapshot")
    sub.setsockopt(zmq.SUBSCRIBE, b"streamcorr/event")
    sub.setsockopt(zmq.SUBSCRIBE, b"streamcorr/status")
    sub.setsockopt(zmq.RCVHWM, 10_000)
    sub.connect(endpoint)
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    while not stop.is_set():
        if poller.poll(100):
            _topic, payload = sub.recv_multipart()
            out.append((time.time(), decode_message(payload)))
    sub.close(linger=0)


def _produce(
    endpoint: str, n_ch: int, onset_k: int, t0: float, duration_s: float, names: list[str]
) -> dict[str, float]:
    import msgpack
    import zmq

    gen = Generator(n_ch, onset_k=onset_k, seed=1)
    ctx = zmq.Context.instance()
    push = ctx.socket(zmq.PUSH)
    push.connect(endpoint)
    per_chunk = round(CHUNK_S * RATE_HZ)
    k, sent, late_s = 0, 0, 0.0
    while (now := time.time()) < t0 + duration_s:
        due = int((now - t0) * RATE_HZ)  # samples whose time has come
        while k + per_chunk <= due:
            x = gen.chunk(k, per_chunk)
            body = {"t0": t0 + k / RATE_HZ, "dt": 1 / RATE_HZ,
                    "channels": {n: x[c].tolist() for c, n in enumerate(names)}}  # fmt: skip
            push.send_multipart([b"s", msgpack.packb(body)])
            late_s = max(late_s, now - (t0 + (k + per_chunk - 1) / RATE_HZ))
            k += per_chunk
            sent += 1
        time.sleep(max(0.0, t0 + (k + per_chunk) / RATE_HZ - time.time()))
    push.close(linger=2000)
    return {"chunks_sent": sent, "samples_per_channel": k, "producer_max_lag_s": late_s}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from streamcorr.engine.screen import ScreenCalibration

    n_ch = args.channels
    names = [f"ch{c:03d}" for c in range(n_ch)]
    chan_names = [f"s/{n}" for n in names]  # the default channel_template "{topic}/{key}"
    t_gt = time.perf_counter()
    truth = ground_truth()
    t_gt = time.perf_counter() - t_gt
    t_cal = time.perf_counter()  # what a first start at this window length pays once (then cached)
    cal = ScreenCalibration.cached(WINDOW, 0.1, Path(os.environ.get("STREAMCORR_CACHE_DIR") or
                                                    Path.home() / ".cache" / "streamcorr"))  # fmt: skip
    t_cal = time.perf_counter() - t_cal
    p_in, p_out, p_rep = _free_port(), _free_port(), _free_port()
    cfg = f"""version: 1
sources:
  - type: zmq
    endpoint: tcp://127.0.0.1:{p_in}
    mode: pull
    bind: true
channels:
  rate_hz: {RATE_HZ:g}
window:
  samples: {WINDOW}
  hop_s: 1
outputs:
  zmq:
    endpoint: tcp://127.0.0.1:{p_out}
    snapshot_endpoint: tcp://127.0.0.1:{p_rep}
http:
  port: 0
logging:
  level: WARNING
"""
    tmp = Path(tempfile.mkdtemp(prefix="live_sparse_"))
    (tmp / "config.yaml").write_text(cfg)
    load = [os.getloadavg()]
    daemon = subprocess.Popen(
        [sys.executable, "-c", "import sys; from streamcorr.cli.commands import main; sys.exit(main())", "run",
         str(tmp / "config.yaml")], stderr=open(tmp / "daemon.log", "wb"))  # noqa: SIM115  # fmt: skip
    time.sleep(args.startup_s)  # the daemon loads the model and its calibrations (cached) before it listens
    received: list[tuple[float, Any]] = []
    stop = threading.Event()
    sub = threading.Thread(target=_subscribe, args=(f"tcp://127.0.0.1:{p_out}", stop, received), daemon=True)
    sub.start()
    time.sleep(0.5)
    t0 = float(np.floor(time.time()))
    gen = Generator(n_ch, onset_k=round(args.onset_s * RATE_HZ), seed=1)
    loads: list[tuple[float, float, float]] = []
    sampler = threading.Thread(target=lambda: [loads.append(os.getloadavg()) or time.sleep(5)  # type: ignore[func-returns-value]
                                               for _ in range(int(args.duration_s / 5))], daemon=True)  # fmt: skip
    sampler.start()
    # the producer runs in its own process, so that decoding snapshots here cannot delay the samples
    with mp.get_context("spawn").Pool(1) as pool:
        prod = pool.apply(_produce, (f"tcp://127.0.0.1:{p_in}", n_ch, round(args.onset_s * RATE_HZ), t0,
                                     args.duration_s, names))  # fmt: skip
    time.sleep(3.0)  # the last hops publish
    cpu = _cpu_s(daemon.pid)
    daemon.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        daemon.wait(30)
    stop.set()
    sub.join(5)
    load.append(os.getloadavg())
    return analyse(received, truth, gen, chan_names, t0, args, cal, prod, cpu, load, loads, t_gt, t_cal, tmp)


def analyse(received, truth, gen, chan_names, t0, args, cal, prod, cpu, load, loads, t_gt, t_cal, tmp):  # type: ignore[no-untyped-def]
    window_s = WINDOW / RATE_HZ
    onset = t0 + args.onset_s
    snaps = [(w, m.body) for w, m in received if m.kind == "snapshot"]
    statuses = [m.body for _, m in received if m.kind == "status"]
    counters = dict(statuses[-1].counters) if statuses else {}
    events = [(w, m.body) for w, m in received if m.kind == "event"]
    if not snaps:
        return {"error": "no snapshot received", "daemon_log": (tmp / "daemon.log").read_text()[-2000:]}
    order = snaps[0][1].channels
    pos = {n: k for k, n in enumerate(order)}
    n_all = len(chan_names)
    # pair classes in matrix order
    dep, weak = [], []
    for g in range(N_GROUPS):
        for a in range(GROUP):
            for b in range(a + 1, GROUP):
                mi = truth[(g % 4, a, b)]
                pair = (chan_names[g * GROUP + a], chan_names[g * GROUP + b])
                (dep if mi >= 0.2 else weak).append(pair)
    late = [(chan_names[a], chan_names[b]) for a, b in gen.late]
    special = set(dep) | set(weak) | set(late)
    first: dict[int, tuple[float, Any]] = {}  # the first receipt of each window (shutdown re-sends the last one)
    for w, s in snaps:
        if s.t_ns / 1e9 >= t0 + window_s + 1 and len(s.channels) == n_all:
            first.setdefault(s.t_ns, (w, s))
    steady = sorted(first.values(), key=lambda ws: ws[1].t_ns)
    ts = sorted({s.t_ns for _, s in steady})
    hops_expected = round((ts[-1] - ts[0]) / 1e9) + 1 if ts else 0
    lat = np.array([w - s.t_ns / 1e9 for w, s in steady])
    iu = np.triu_indices(n_all, 1)
    dep_idx = np.array([(pos[a], pos[b]) for a, b in dep])
    ok_share = []
    indep_hi, assessed = [], []
    is_special = np.zeros((n_all, n_all), dtype=bool)
    for a, b in special:
        is_special[pos[a], pos[b]] = is_special[pos[b], pos[a]] = True
    indep_mask = ~is_special[iu]
    for _w, s in steady:
        mi, age = s.mi, s.age_s
        src = s.source if s.source is not None else np.ones_like(mi)
        ok = (age[dep_idx[:, 0], dep_idx[:, 1]] <= 1.5) & (mi[dep_idx[:, 0], dep_idx[:, 1]] >= 0.1)
        ok &= src[dep_idx[:, 0], dep_idx[:, 1]] == 1
        ok_share.append(ok)
        cells = mi[iu][indep_mask]
        indep_hi.append(float(np.mean(np.nan_to_num(cells) >= 0.1)))
        if s.t_ns / 1e9 >= t0 + 30:
            assessed.append(float(np.mean(age[iu] <= 30)))
    per_pair = np.mean(ok_share, axis=0) if ok_share else np.zeros(len(dep))
    delays = []
    for a, b in late:
        ev = [w for w, e in events if set(e.pair) == {a, b} and e.kind == "became-dependent" and w >= onset]
        seen = [w for w, s in snaps if w >= onset and s.source is not None and s.source[pos[a], pos[b]] == 1
                and s.mi[pos[a], pos[b]] >= 0.1 and s.t_ns / 1e9 >= onset]  # fmt: skip
        delays.append({"pair": [a, b], "event_delay_s": (ev[0] - onset) if ev else None,
                       "first_estimate_delay_s": (seen[0] - onset) if seen else None})  # fmt: skip
    ev_delays = [d["event_delay_s"] for d in delays]
    all_loads = [ld[0] for ld in loads] or [float("nan")]
    return {
        "channels": n_all, "window_len": WINDOW, "rate_hz": RATE_HZ, "duration_s": args.duration_s,
        "onset_s": args.onset_s, "pairs": n_all * (n_all - 1) // 2, "dependent_pairs": len(dep),
        "weak_pairs_left_out": len(weak), "late_pairs": len(late),
        "ground_truth_mi": {str(k): round(v, 3) for k, v in truth.items()}, "ground_truth_s": t_gt,
        "screen_calibration_s": t_cal, "screen_threshold": cal.threshold,
        "snapshots": len(steady), "hops_expected": hops_expected,
        "snapshot_per_hop": len(ts) / hops_expected if hops_expected else 0.0,
        "latency_p50_s": float(np.percentile(lat, 50)), "latency_p99_s": float(np.percentile(lat, 99)),
        "latency_p99_after_5_hops_s": float(np.percentile(lat[5:], 99)) if len(lat) > 10 else None,
        "first_published_s": round(ts[0] / 1e9 - t0, 2) if ts else None,
        "dependent_ok_min": float(per_pair.min()), "dependent_ok_mean": float(per_pair.mean()),
        "dependent_pairs_ok_90": float(np.mean(per_pair >= 0.9)),
        "late": delays,
        "event_delay_max_s": None if None in ev_delays else max(ev_delays),  # type: ignore[type-var]
        "independent_cells_ge_0.1": float(np.mean(indep_hi)) if indep_hi else None,
        "independent_cells_ge_0.1_max": float(np.max(indep_hi)) if indep_hi else None,
        "assessed_30s_mean": float(np.mean(assessed)) if assessed else None,
        "assessed_30s_min": float(np.min(assessed)) if assessed else None,
        "events": len(events), "daemon_cpu_s": cpu, "producer": prod, "daemon_counters": counters,
        "latency_by_hop": [[round(s.t_ns / 1e9 - t0, 2), round(w - s.t_ns / 1e9, 3)] for w, s in steady],
        "load_avg_1min": {"before": load[0][0], "during_mean": float(np.mean(all_loads)),
                          "during_max": float(np.max(all_loads)), "after": load[-1][0]},
    }  # fmt: skip


def _s(x: float | None) -> str:
    return "never" if x is None else f"{x:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-s", type=float, default=150.0)
    ap.add_argument("--onset-s", type=float, default=70.0, help="when the 8 late pairs become dependent")
    ap.add_argument("--channels", type=int, default=256)
    ap.add_argument("--startup-s", type=float, default=15.0, help="wait for the daemon before feeding it")
    ap.add_argument("--name", default="live_sparse_256ch")
    ap.add_argument("--quick", action="store_true", help="45 s, onset at 20 s (a smoke run, not for the targets)")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration_s, args.onset_s, args.name = 45.0, 20.0, f"{args.name}_quick"
    res = run(args)
    r = res
    if "error" in r:
        print(r)
        return 1
    late = "; ".join(f"{d['pair'][0]}-{d['pair'][1]}: event {_s(d['event_delay_s'])} s, "
                     f"first estimate >= 0.1 {_s(d['first_estimate_delay_s'])} s" for d in r["late"])  # fmt: skip
    md = [f"## Live, sparse graph: `streamcorr run` (plain config) fed over ZeroMQ, {r['channels']} channels at "
          f"{r['rate_hz']:.0f} Hz, window {r['window_len']}, 1-s hop, {r['duration_s']:.0f} s\n",
          f"{r['dependent_pairs']} dependent pairs ({100 * r['dependent_pairs'] / r['pairs']:.2f}% of {r['pairs']}; "
          f"{r['weak_pairs_left_out']} weak in-group pairs left out), {r['late_pairs']} more dependent from "
          f"{r['onset_s']:.0f} s. Machine load average (1 min): {r['load_avg_1min']['before']:.1f} before, "
          f"{r['load_avg_1min']['during_mean']:.1f} mean / {r['load_avg_1min']['during_max']:.1f} max during "
          "the run (2 cores, shared).\n",
          "| measure | target | measured |", "|---|---|---|",
          f"| snapshots per hop | >= 90% | {100 * r['snapshot_per_hop']:.0f}% ({r['snapshots']} of "
          f"{r['hops_expected']} hops) |",
          f"| publish latency p50 / p99 (window end -> SUB) | p99 <= 2 s | {r['latency_p50_s']:.2f} / "
          f"{r['latency_p99_s']:.2f} s (p99 without the first 5 published hops: {_s(r['latency_p99_after_5_hops_s'])} "
          f"s; first window published at {r['first_published_s']} s, the window fills at {WINDOW / RATE_HZ:.2f} s) |",
          f"| dependent pairs: share of snapshots refreshed <= 1.5 s with a network estimate >= 0.1 | >= 90% "
          f"each | worst pair {100 * r['dependent_ok_min']:.0f}%, mean {100 * r['dependent_ok_mean']:.1f}%, "
          f"{100 * r['dependent_pairs_ok_90']:.0f}% of pairs >= 90% |",
          f"| new dependence: onset -> became-dependent event (worst of {r['late_pairs']}) | <= window + 5 s "
          f"= {WINDOW / RATE_HZ + 5:.1f} s | {_s(r['event_delay_max_s'])} s |",
          f"| independent cells >= 0.1 nats | <= 1% | {100 * r['independent_cells_ge_0.1']:.3f}% (worst "
          f"snapshot {100 * r['independent_cells_ge_0.1_max']:.3f}%) |",
          f"| cells assessed within 30 s | >= 95% | mean {100 * r['assessed_30s_mean']:.1f}%, worst snapshot "
          f"{100 * r['assessed_30s_min']:.1f}% |", "",
          f"Per new pair: {late}.", "",
          f"Daemon CPU {r['daemon_cpu_s']:.0f} s over the run; {r['events']} change events; producer sent "
          f"{r['producer']['chunks_sent']} chunks (max lag {r['producer']['producer_max_lag_s']:.2f} s). "
          f"Screen threshold at window {WINDOW}: {r['screen_threshold']:.1f} (calibration "
          f"{r['screen_calibration_s']:.1f} s when not cached). Ground truth of the in-group pairs (model, 4 x 4096 "
          f"samples): {r['ground_truth_mi']}."]  # fmt: skip
    write_results(args.name, {"env": environment(), **res}, "\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
