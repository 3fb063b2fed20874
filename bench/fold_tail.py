"""The fast path's folded-innovation test on independent channels: how often its z-score exceeds a bar.

    python -m bench.fold_tail [--windows 120] [--channels 40] [--seed 7] [--quick]

A smooth pair's sentinel also correlates each channel's innovations with the other's within each quartile of the
channel's level (:func:`streamcorr.engine.short_windows.local_slopes`); the bins' correlations make a chi-square,
read as the normal quantile of the same two-sided tail (a z-score), and judged against a normal tail. Here every
pair of ``--channels`` independent channels from the null calibration's families (white, AR(1) with time constants
of 1-1,000 samples, oscillating AR(2), moving averages, random walks; some with measurement noise or quantised) is
scored on the newest 128, 256 and 512 rows of a 1,024-sample window (the sentinel's lengths) and on the whole
window (the window's test of smooth pairs, :mod:`streamcorr.engine.smooth_folds`), ``--windows`` times. Reported
per length: pairs scored, the share of z-scores above 3, 4, 4.5 and 5 beside the two-sided normal tail, the
largest, and the bar the engine sets at the reaction bench's size (16 channels at 100 Hz, window 1024, hop 50)
and at 256 channels.
Results go to bench/results/fold_tail.json and .md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.stats import norm

from bench.common import environment, write_results
from streamcorr.engine.core import Engine, EngineConfig
from streamcorr.engine.short_windows import innovation_estimates
from streamcorr.engine.smooth_folds import fold_bar
from streamcorr.estimate.estimator import default_estimator
from streamcorr.estimate.significance import null_processes

LENGTHS = (128, 256, 512, 1024)
BARS = (3.0, 4.0, 4.5, 5.0)
WINDOW = 1024


def engine_bars(channels: int) -> dict[int, float]:
    """The folds' z bar per length for an engine of this many channels (100 Hz, window 1024, hop 50): the
    sentinel's, and the window's for a smooth pair (each fold at half its share)."""
    names = [f"c{k:03d}" for k in range(channels)]
    eng = Engine(EngineConfig(channels=names, rate_hz=100.0, window_len=WINDOW, hop_samples=50, fast=True))
    assert eng.fast is not None
    bars = {m: eng.fast.sentinel.fold_z(m) for m in eng.fast.sentinel.innovation_lengths}
    return bars | {WINDOW: fold_bar(eng.detector.alpha / 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=120)
    ap.add_argument("--channels", type=int, default=40)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="3 windows of 12 channels (a smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.windows, args.channels = 3, 12
    est = default_estimator()
    rng = np.random.default_rng(args.seed)
    t0 = time.monotonic()
    i, j = np.triu_indices(args.channels, 1)
    pairs = np.stack([i, j], axis=1)
    z: dict[int, list[np.ndarray]] = {m: [] for m in LENGTHS}
    for _ in range(args.windows):
        # held channels are left out: the sentinel leaves a pair whose channels repeat different rows to the window
        window, _held = null_processes(rng, args.channels, WINDOW, no_hold=np.ones(args.channels, dtype=bool))
        fresh = np.ones_like(window, dtype=bool)
        for m in LENGTHS:
            z[m].append(innovation_estimates(est, window, fresh, pairs, m)[2].reshape(-1))
    bars = {16: engine_bars(16), 256: engine_bars(256)}
    rows = []
    for m in LENGTHS:
        v = np.concatenate(z[m])
        v = v[np.isfinite(v)]
        rows.append({"rows": m, "scores": len(v), "max": float(v.max()), "mean": float(v.mean()),
                     **{f"above {b:g}": float((v > b).mean()) for b in BARS},
                     "bar at 16 channels": bars[16].get(m), "bar at 256 channels": bars[256].get(m)})  # fmt: skip
    cols = [f"above {b:g}" for b in BARS]
    normal = " | ".join(f"{2 * norm.sf(b):.1e}" for b in BARS)
    names = ["rows", "z-scores", "mean", *(f"share {c}" for c in cols), "largest", "bar at 16 channels",
             "bar at 256 channels"]  # fmt: skip
    header = "| " + " | ".join(names) + " |\n|" + "---|" * len(names) + "\n"
    body = f"| normal, two-sided | | 0.80 | {normal} | | | |\n" + "".join(
        f"| {r['rows']} | {r['scores']} | {r['mean']:.2f} | "
        + " | ".join(f"{r[c]:.1e}" for c in cols)
        + f" | {r['max']:.2f} | {_fmt(r['bar at 16 channels'])} | {_fmt(r['bar at 256 channels'])} |\n"
        for r in rows
    )
    text = (
        f"Folded-innovation z-scores of independent pairs ({args.channels} channels of the null calibration's "
        f"families, {args.windows} windows of {WINDOW} samples, every pair both ways folded).\n\n"
        + header
        + body
        + f"\nCommand: `python -m bench.fold_tail`; {time.monotonic() - t0:.0f} s.\n"
    )
    if not args.quick:
        write_results("fold_tail", {"args": vars(args), "rows": rows, "env": environment()}, text)
    else:
        print(text)
    return 0


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


if __name__ == "__main__":
    raise SystemExit(main())
