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
    seconds = args.seconds or (60.0 if args.quick else 300.0)
    rate, window, hop = 100.0, 1024, 100

    from streamcorr.cli import main as cli_main
    from streamcorr.ingest.logs import open_log

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log.csv"
        write_log(log, args.channels, seconds, rate)
        t0 = time.perf_counter()
        open_log(log)
        read_s = time.perf_counter() - t0
        load_before = os.getloadavg()
        out = Path(tmp) / "out"
        argv_replay = ["replay", str(log), "--rate-hz", "100", "--window", str(window), "--hop", str(hop),
                       "-o", str(out), "--no-progress"]  # fmt: skip
        # warm-up on a short log: Numba kernels and the model's first calls, so the run below is the steady state
        warm = Path(tmp) / "warm.csv"
        write_log(warm, args.channels, 15.0, rate)
        cli_main(["replay", str(warm), "--window", str(window), "-o", str(Path(tmp) / "warm"), "--no-progress"])
        t0 = time.perf_counter()
        rc = cli_main(argv_replay)
        wall_s = time.perf_counter() - t0
        load_after = os.getloadavg()
        info = json.loads((out / "replay.json").read_text())
    pairs = args.channels * (args.channels - 1) // 2
    speed = seconds / wall_s
    data = {
        "env": environment(),
        "command": f"python -m bench.replay{' --quick' if args.quick else ''}",
        "channels": args.channels,
        "rate_hz": rate,
        "window_len": window,
        "hop_samples": hop,
        "stream_s": seconds,
        "rc": rc,
        "wall_s": round(wall_s, 2),
        "read_s": round(read_s, 2),
        "x_real_time": round(speed, 1),
        "hops": info["hops"],
        "hops_per_s": round(info["hops"] / wall_s, 2),
        "pairs_per_s": round(info["hops"] * pairs / wall_s),
        "events": info["events"],
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "meets_10x": speed >= 10.0,
    }
    md = (
        f"# Replay speed (issue 15)\n\n`{data['command']}`: {args.channels} channels at {rate:g} Hz, window {window},"
        f" hop {hop} (1 s), {seconds:g} s of stream from a wide CSV, through `streamcorr replay`.\n\n"
        "| x real time | wall s | read s | hops | hops/s | pairs/s | events | load avg (1 min) before / after |\n"
        "|---|---|---|---|---|---|---|---|\n"
        f"| **{speed:.1f}x** | {wall_s:.1f} | {read_s:.2f} | {info['hops']} | {data['hops_per_s']} |"
        f" {data['pairs_per_s']:,} | {info['events']} | {load_before[0]:.1f} / {load_after[0]:.1f} |\n\n"
        f"Bar: >= 10x real time: {'met' if data['meets_10x'] else 'NOT met'} on this machine"
        f" ({data['env']['cores']} cores, load as shown).\n"
    )
    write_results("replay_quick" if args.quick else "replay", data, md)
    print(md)


if __name__ == "__main__":
    main()
