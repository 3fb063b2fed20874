"""Engine throughput: live 64-channel load, and a channels x window scaling table.

    python -m bench.engine_throughput live [--duration-s 300] [--channels 64] [--window 1024] [--all-dependent]
        [--screening auto|on|off] [--weights infonet-v1]
    python -m bench.engine_throughput scaling [--quick]

live: a producer pushes 100 Hz frames of C channels in real time (10 ms chunks)
into a live engine (hop = 1 s, all pairs each hop). Reports pairs refreshed per
second, hops skipped, hop-to-publish latency p50/p99 (from the moment a window is
due to its snapshot arriving at a subscriber) and the CPU time of each stage.

scaling: evaluate() on filled buffers for each size, screening off (all pairs per
hop) and on (the screen assesses every pair, the network runs on its budget): hop
time, pairs assessed per second, and the process memory (RSS) grown for the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import numpy as np

from streamcorr.engine.core import Engine, EngineConfig
from streamcorr.engine.matrix import SOURCE_NETWORK
from streamcorr.estimate.estimator import Estimator

from .common import environment, rss_mb, write_results


def _state_mb(eng: Engine) -> float:
    """Bytes held by the engine's per-channel state (ring buffers, sliding ranks) and matrices, in MB."""
    total = 0
    for ch in eng.intake.channels.values():
        total += ch.buffer._t.nbytes + ch.buffer._v.nbytes + ch.ranks._vals.nbytes + ch.ranks._ids.nbytes
    st = eng.state
    total += st.mi.nbytes + st.coverage.nbytes + st.refreshed_ns.nbytes
    return total / 2**20


def _group_starts(n_ch: int) -> range:  # the first channel of each coupled group of four
    return range(0, n_ch - 3, 8)


def _coupled_pairs(n_ch: int) -> np.ndarray:
    """(M, 2) channel pairs inside the coupled groups of _signals."""
    return np.array([(g + a, g + b) for g in _group_starts(n_ch) for a in range(4) for b in range(a + 1, 4)])


def _signals(n_ch: int, n: int, rng: np.random.Generator, all_dependent: bool = False) -> np.ndarray:
    """Channels in coupled groups of four (linear, quadratic, sine), the rest noise: (n_ch, n). all_dependent:
    every channel is one common source plus its own noise, so every pair is dependent (about 0.35 nats)."""
    x = rng.standard_normal((n_ch, n))
    if all_dependent:
        return x[0] + 0.9 * x
    for g in _group_starts(n_ch):
        x[g + 1] = 0.7 * x[g] + 0.5 * x[g + 1]
        x[g + 2] = x[g] ** 2 + 0.5 * x[g + 2]
        x[g + 3] = np.sin(2 * x[g]) + 0.3 * x[g + 3]
    return x


async def _live(
    n_ch: int,
    window: int,
    duration_s: float,
    chunk_ms: float,
    rate: float = 100.0,
    all_dependent: bool = False,
    screening: str = "auto",
    weights: str | None = None,
    max_lag_s: float = 0.0,
) -> dict[str, object]:
    names = [f"ch{k:03d}" for k in range(n_ch)]
    cfg = EngineConfig(channels=names, rate_hz=rate, window_len=window, hop_samples=int(rate), queue_size=1000,
                       screening=screening, max_lag_s=max_lag_s)  # fmt: skip
    eng = Engine(cfg, Estimator(**{**dict(cfg.estimator), "weights": weights}))
    aot = eng.est.aot
    network_at_start = "eager" if aot is None else aot.state  # "building": this run includes the one-time build
    rng = np.random.default_rng(0)
    data = _signals(n_ch, int(rate * (duration_s + 30)), rng, all_dependent)
    latencies: list[float] = []
    ingest_s = 0.0

    async def consume() -> None:
        async for snap in eng.snapshots():
            due_wall = t_start + (snap.t_ns / 1e9 + cfg.max_staleness_s)  # when the window became due
            latencies.append(time.time() - due_wall)

    async with eng:
        t_start = time.time()
        consumer = asyncio.create_task(consume())
        k = 0
        t_frame = np.arange(data.shape[1]) / rate
        while (now := time.time() - t_start) < duration_s:
            target = int(now * rate)
            t0 = time.perf_counter()
            if k < target:  # every sample due by now, all channels in one chunked frame
                eng.push_frame(t_frame[k:target], {name: data[c, k:target] for c, name in enumerate(names)})
                k = target
            ingest_s += time.perf_counter() - t0
            await asyncio.sleep(chunk_ms / 1e3)
        await asyncio.sleep(2 * window / rate / 10)
        consumer.cancel()
    n_pairs = n_ch * (n_ch - 1) // 2
    c = eng.counters
    lat = np.array(latencies[2:]) if len(latencies) > 4 else np.array(latencies)
    return {
        "channels": n_ch, "window_len": window, "rate_hz": rate, "duration_s": duration_s, "pairs": n_pairs,
        "chunk_ms": chunk_ms, "all_dependent": all_dependent, "screening": cfg.screening,
        "weights": eng.est.meta.get("run", str(weights)),
        "network": {"at_start": network_at_start, "at_end": "eager" if aot is None else aot.state},
        "pairs_screened": c.pairs_screened, "load_1min": os.getloadavg()[0],
        "hops": c.hops, "hops_skipped": c.hops_skipped,
        "pairs_refreshed_per_s": c.pairs_evaluated / duration_s,
        # the first window needs window/rate seconds of data before any hop can run
        "pairs_refreshed_per_s_after_first_window": c.pairs_evaluated / (duration_s - window / rate),
        "latency_p50_s": float(np.percentile(lat, 50)), "latency_p99_s": float(np.percentile(lat, 99)),
        "cpu_s": {"ingest (push)": ingest_s, **c.stage_s}, "rss_mb": rss_mb(), "max_lag_s": max_lag_s,
        "lag_counts": None if eng.lags is None else dict(eng.lags.counts),
        "lags_reported": None if eng.latest is None or eng.latest.lag_s is None
        else int(np.isfinite(eng.latest.lag_s).sum() // 2),
    }  # fmt: skip


def live(args: argparse.Namespace) -> None:
    res = asyncio.run(
        _live(
            args.channels,
            args.window,
            args.duration_s,
            args.chunk_ms,
            all_dependent=args.all_dependent,
            screening=args.screening,
            weights=args.weights,
            max_lag_s=args.max_lag_s,
        )
    )
    total = sum(res["cpu_s"].values())  # type: ignore[union-attr]
    md = [f"## Live engine: {res['channels']} channels at {res['rate_hz']:.0f} Hz, window {res['window_len']}, "
          f"hop 1 s, all {res['pairs']} pairs{' (every pair dependent)' if res['all_dependent'] else ''}, "
          f"{res['duration_s']:.0f} s, weights {args.weights or 'default'} ({res['weights']}), "
          f"samples arrive as one frame of all channels every {res['chunk_ms']:.0f} ms; "
          f"screening {res['screening']} ({res['pairs_screened']} cells given the screen's figure); machine load "
          f"average (1 min) at the end {res['load_1min']:.1f} (2 cores, shared)\n",
          f"- pairs refreshed per second once the first window is full: "
          f"**{res['pairs_refreshed_per_s_after_first_window']:.0f}** (target {res['pairs']}); "
          f"over the whole run including the {res['window_len'] / res['rate_hz']:.1f} s fill: "
          f"{res['pairs_refreshed_per_s']:.0f}",
          f"- hops evaluated {res['hops']}, skipped because compute was behind {res['hops_skipped']}",
          f"- network (streamcorr.estimate.aot): {res['network']['at_start']} at the start, "  # type: ignore[index]
          f"{res['network']['at_end']} at the end",  # type: ignore[index]
          f"- hop-to-publish latency p50 **{res['latency_p50_s'] * 1e3:.0f} ms**, p99 "
          f"**{res['latency_p99_s'] * 1e3:.0f} ms**", f"- process RSS {res['rss_mb']:.0f} MB",
          f"- lead and lag: max {res['max_lag_s']} s; search counts {res['lag_counts']}; pairs with a significant "
          f"lag in the last snapshot {res['lags_reported']}", "",
          "| stage | CPU s | share |", "|---|---|---|"]  # fmt: skip
    md += [f"| {k} | {v:.1f} | {100 * v / total:.0f}% |" for k, v in res["cpu_s"].items()]  # type: ignore[union-attr]
    name = f"engine_live_{res['channels']}ch_{res['window_len']}" + ("_all_dependent" if args.all_dependent else "")
    name += "" if args.screening == "auto" else f"_screening_{args.screening}"
    name += f"_{args.weights}" if args.weights else ""
    name += f"_lags{args.max_lag_s:g}s" if args.max_lag_s else ""
    name += "_first_start" if res["network"]["at_start"] == "building" else ""  # type: ignore[index]  # the one-time build
    write_results(name, {"env": environment(), **res}, "\n".join(md))


def _scaling_row(n_ch: int, window: int, screening: str, hops: int, cap: int | None = None) -> dict[str, object]:
    """One engine on filled buffers: the median of `hops` hops after the first (which ranks from scratch and,
    with screening, probes the model and loads the calibration). With `cap`, screening off evaluates only
    the stalest `cap` pairs per hop and the full hop is extrapolated from the per-pair stages."""
    rss0 = rss_mb()
    names = [f"ch{k:03d}" for k in range(n_ch)]
    cfg = EngineConfig(channels=names, rate_hz=100.0, window_len=window, hop_samples=100, max_channels=max(256, n_ch),
                       screening=screening, max_pairs_per_hop=cap)  # fmt: skip
    eng = Engine(cfg)
    data = _signals(n_ch, window + 100 * (hops + 1), np.random.default_rng(1))
    t = np.arange(data.shape[1]) / 100.0
    period = eng.resampler.period_ns
    end0 = round(t[window - 1] * 1e9) // period * period
    for c, name in enumerate(names):
        eng.push(name, t[:window], data[c, :window])
    eng.evaluate(end0)  # first window: full ranks (and the screen's one-time costs)
    times, stages, network = [], [], []
    for h in range(1, hops + 1):
        for c, name in enumerate(names):
            eng.push(
                name, t[window + (h - 1) * 100 : window + h * 100], data[c, window + (h - 1) * 100 : window + h * 100]
            )
        before, n_before = dict(eng.counters.stage_s), eng.counters.pairs_evaluated
        t0 = time.perf_counter()
        eng.evaluate(end0 + h * 100 * period)  # later hops: incremental ranks
        times.append(time.perf_counter() - t0)
        stages.append({k: v - before.get(k, 0.0) for k, v in eng.counters.stage_s.items()})
        network.append(eng.counters.pairs_evaluated - n_before)
    k = int(np.argsort(times)[len(times) // 2])  # the median hop, with its own stage split
    n_pairs = n_ch * (n_ch - 1) // 2
    dep = _coupled_pairs(n_ch)
    src = eng.state.source[dep[:, 0], dep[:, 1]]  # the coupled groups' pairs: do they hold network estimates?
    found = float(np.mean((src == SOURCE_NETWORK) & (eng.state.mi[dep[:, 0], dep[:, 1]] >= cfg.min_effect)))
    hop_s, st = times[k], stages[k]
    extrapolated = cap is not None and screening == "off" and network[k] < n_pairs
    if extrapolated:  # per-pair stages scale with the pair count, the rest does not
        per_pair = st.get("model", 0.0)  # the pair histograms and the network
        hop_s = hop_s - per_pair + per_pair * n_pairs / max(1, network[k])
    row = {"channels": n_ch, "window_len": window, "screening": screening, "pairs": n_pairs,
           "hop_s": hop_s, "extrapolated": extrapolated,
           "network_pairs_per_hop": n_pairs if extrapolated else network[k],
           "assessed_pairs_per_s": n_pairs / hop_s,
           "screen_s": st.get("screen", 0.0), "model_s": st.get("model", 0.0),
           "budget": eng.screener.budget(), "model_pairs_per_s": eng.screener.pairs_per_s,
           "dependent_found": found, "state_mb": _state_mb(eng), "rss_grown_mb": rss_mb() - rss0,
           "load_1min": os.getloadavg()[0]}  # fmt: skip
    print(row, flush=True)
    return row


def scaling(args: argparse.Namespace) -> None:
    rows = []
    if args.quick:
        sizes = [(16, 256, "off"), (64, 256, "on")]
    else:
        sizes = [(c, w, s) for s in ("off", "on") for c in (64, 256, 1024) for w in (256, 1024)]
    for n_ch, window, screening in sizes:
        cap = 8_160 if (screening == "off" and n_ch >= 256) else None  # a full hop there takes minutes
        rows.append(_scaling_row(n_ch, window, screening, hops=2 if n_ch >= 256 or args.quick else 4, cap=cap))
    md = [
        "## Engine scaling: one hop on filled buffers, screening off (every pair) and on (compute only; median "
        "of 4 hops, 2 at >= 256 channels)\n",
        "Screening on: every pair is assessed by the screen each hop and the network runs on the budget "
        "(0.8 x hop x the measured model pairs/s). Off at >= 256 channels: one hop of 8,160 pairs measured, the "
        "per-pair stage (model: the pair histograms and the network) scaled to all pairs (marked *). Coupled pairs "
        "found: the share of "
        "the pairs inside the coupled groups of four whose cell holds a network estimate >= min_effect after the "
        "hops (off at >= 256 channels: only 8,160 pairs a hop, so most are not reached). The machine is shared; "
        "the 1-min load average at each row is listed.\n",
        "| channels | window | screening | pairs | s per hop | network pairs per hop | pairs assessed/s | "
        "screen s | model pairs/s | coupled pairs found | engine state MB | RSS grown MB | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    md += [f"| {r['channels']} | {r['window_len']} | {r['screening']} | {r['pairs']} | {r['hop_s']:.2f}"
           f"{'*' if r['extrapolated'] else ''} | {r['network_pairs_per_hop']} | {r['assessed_pairs_per_s']:.0f} | "
           f"{r['screen_s']:.2f} | {r['model_pairs_per_s'] or float('nan'):.0f} | {r['dependent_found']:.0%} | "
           f"{r['state_mb']:.1f} | "
           f"{r['rss_grown_mb']:.0f} | {r['load_1min']:.1f} |" for r in rows]  # fmt: skip
    write_results("engine_scaling_quick" if args.quick else "engine_scaling", {"env": environment(), "rows": rows},
                  "\n".join(md))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    lv = sub.add_parser("live")
    lv.add_argument("--duration-s", type=float, default=300.0)
    lv.add_argument("--channels", type=int, default=64)
    lv.add_argument("--window", type=int, default=1024)
    lv.add_argument("--chunk-ms", type=float, default=100.0, help="producer sends all channels' samples this often")
    lv.add_argument("--all-dependent", action="store_true", help="every pair dependent: screening cannot help")
    lv.add_argument("--screening", choices=["auto", "on", "off"], default="auto", help="off: the baseline")
    lv.add_argument("--weights", default=None, help="a shipped model name (default: the engine's default)")
    lv.add_argument("--max-lag-s", type=float, default=0.0, help="lead and lag search range (0: off)")
    lv.set_defaults(func=live)
    sc = sub.add_parser("scaling")
    sc.add_argument("--quick", action="store_true")
    sc.set_defaults(func=scaling)
    args = ap.parse_args(argv)
    args.func(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
