"""Replay speed: `streamcorr replay` on a synthetic 24-channel, 100 Hz log, window 1024, hop 1 s (issue 15).

The log is written as CSV (wide, like a user's file), then replayed through the public command path
(``cli.main(["replay", ...])``): reading, every hop through the engine, the Parquet timeline and events.
Reported: stream seconds per wall second (x real time; the bar is >= 10x), hops/s, pairs/s, the time of the
read alone, and the machine's load average before and after (the speed depends on the other work on it).

    python -m bench.replay            # 300 s of stream
    python -m bench.replay --quick    # 60 s (smoke)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import environment, write_results


def write_log(path: Path, channels: int, seconds: float, rate_hz: float, seed: int = 0) -> None:
    """Wide CSV: t, then channels with a few dependent pairs (linear, quadratic) among independent noise."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate_hz)
    t = np.arange(n) / rate_hz
    v = rng.standard_normal((channels, n))
    v[1] = 0.8 * v[0] + 0.6 * v[1]
    v[3] = v[2] ** 2 + 0.3 * v[3]
    half = n // 2
    v[5, half:] = np.sin(3 * v[4, half:]) + 0.2 * v[5, half:]  # appears half way: change events
    cols = np.vstack([t, v]).T
    header = "t," + ",".join(f"ch{k:02d}" for k in range(channels))
    np.savetxt(path, cols, delimiter=",", header=header, comments="", fmt="%.9g")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--channels", type=int, default=24)
    args = ap.parse_args(argv)
    seconds = args.seconds or (60.0 if args.quick else 120.0)
    rate, window, hop = 100.0, 1024, 100
    pairs = args.channels * (args.channels - 1) // 2

    from streamcorr.cli.commands import main as cli_main
    from streamcorr.offline.logs import open_log

    rows = []
    env = environment()  # before the runs: a --threads run sets torch's threads for the rest of the process
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log.csv"
        write_log(log, args.channels, seconds, rate)
        t0 = time.perf_counter()
        open_log(log)
        read_s = time.perf_counter() - t0
        # warm-up on a short log: Numba kernels and the model's first calls, so the runs below are the steady state
        warm = Path(tmp) / "warm.csv"
        write_log(warm, args.channels, 15.0, rate)
        cli_main(["replay", str(warm), "--window", str(window), "-o", str(Path(tmp) / "warm"), "--no-progress"])
        # the default (screening off: the network on every pair every hop; torch's threads), then 1 torch thread,
        # then the screen picking the network's pairs
        for screening, threads in (("off", None), ("off", 1), ("on", 1)):
            out = Path(tmp) / f"out-{screening}-{threads}"
            load_before = os.getloadavg()
            t0 = time.perf_counter()
            flags = ["--screening", screening, *(["--threads", str(threads)] if threads else [])]
            rc = cli_main(["replay", str(log), "--rate-hz", str(rate), "--window", str(window), "--hop", str(hop),
                           *flags, "-o", str(out), "--no-progress"])  # fmt: skip
            wall_s = time.perf_counter() - t0
            info = json.loads((out / "replay.json").read_text())
            rows.append({
                "screening": screening,
                "torch_threads": threads or "default",
                "rc": rc,
                "wall_s": round(wall_s, 2),
                "x_real_time": round(seconds / wall_s, 1),
                "hops": info["hops"],
                "hops_per_s": round(info["hops"] / wall_s, 2),
                "pairs_per_s": round(info["hops"] * pairs / wall_s),
                "events": info["events"],
                "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                "meets_10x": seconds / wall_s >= 10.0,
            })  # fmt: skip
    data = {
        "env": env,
        "command": f"python -m bench.replay{' --quick' if args.quick else ''}",
        "channels": args.channels,
        "rate_hz": rate,
        "window_len": window,
        "hop_samples": hop,
        "stream_s": seconds,
        "read_s": round(read_s, 2),
        "runs": rows,
    }
    md = (
        f"# Replay speed (issue 15)\n\n`{data['command']}`: {args.channels} channels at {rate:g} Hz, window {window},"
        f" hop {hop} (1 s), {seconds:g} s of stream from a wide CSV (read in {read_s:.2f} s), through"
        " `streamcorr replay` (every hop; pairs assessed per hop: all by the network with screening off, the"
        " screen's pick with it on).\n\n"
        "| screening | torch threads | x real time | wall s | hops | hops/s | pairs assessed/s | events |"
        " load 1 min before / after |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    for r in rows:
        load = f"{r['loadavg_before'][0]:.1f} / {r['loadavg_after'][0]:.1f}"
        md += (f"| {r['screening']} | {r['torch_threads']} | **{r['x_real_time']}x** | {r['wall_s']} | {r['hops']} |"
               f" {r['hops_per_s']} |"
               f" {r['pairs_per_s']:,} | {r['events']} | {load} |\n")  # fmt: skip
    best = max(r["x_real_time"] for r in rows if r["screening"] == "off")
    md += (f"\nBar: >= 10x real time with every pair by the network (screening off), best {best}x: "
           f"{'met' if best >= 10 else 'NOT met'} on this machine ({data['env']['cores']} cores shared with"
           " other work, load as shown).\n")  # fmt: skip
    write_results("replay_quick" if args.quick else "replay", data, md)


if __name__ == "__main__":
    main()
