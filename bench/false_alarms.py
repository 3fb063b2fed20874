"""False alarms of the change detector on independent channels: per pair on smooth signals, per matrix-hour.

    python -m bench.false_alarms [--pairs 300] [--minutes 20] [--quick]

1. Smooth pairs: independent AR(1) pairs, phi 0.9 to 0.995, window 1024, each pair one window, judged as the
   engine judges it (effective sample size, the null table, the pair's own surrogate null) at a configured
   per-evaluation rate of 0.01: the measured rate beside the configured one.
2. The whole matrix: 24 independent white-noise channels at 20 Hz, window 256, 1-s hops, replayed hop by hop
   through the engine at the defaults (``false_alarms_per_hour: 1``): chance ``became-dependent`` events in
   ``--minutes`` of stream, for several matrix sizes.

Results go to bench/results/false_alarms.json and .md.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from scipy.signal import lfilter

from bench.common import environment, write_results
from streamcorr.engine.changes import ChangeDetector, cached_calibration
from streamcorr.engine.core import Engine, EngineConfig
from streamcorr.estimate.estimator import default_estimator
from streamcorr.estimate.significance import autocorrelation, pair_n_eff, rank_rows
from streamcorr.estimate.surrogates import SurrogateNulls

ALPHA = 0.01


def smooth_pairs(phi: float, pairs: int, window: int, seed: int) -> dict[str, float]:
    est = default_estimator()
    rng = np.random.default_rng(seed)
    e = rng.standard_normal((2 * pairs, window + 4000))
    x = lfilter([1.0], [1.0, -phi], e, axis=1)[:, 4000:]
    u = rank_rows(x, est.ties)
    i, j = np.arange(pairs), np.arange(pairs, 2 * pairs)
    n_eff = pair_n_eff(autocorrelation(u[i]), autocorrelation(u[j]), window)
    mi = est.estimate_ranks(u, i, j)
    table = cached_calibration(est.fingerprint, est.estimate_batch, window, est.ties)
    det = ChangeDetector(table, ALPHA, min_effect=0.0)
    hi, _ = det.thresholds(n_eff)
    names = [(f"x{k}", f"y{k}") for k in range(pairs)]
    # the engine's rule: a pair's own null where n_eff is below half the window and MI above the table's median
    smooth = (n_eff < 0.5 * window) & (mi > table.median_at(n_eff))
    sur = SurrogateNulls(20, refresh_ns=1)
    k = np.flatnonzero(smooth)
    sur.measure(est.estimate_histograms, est.grid, u, i[k], j[k], [names[m] for m in k], n_eff[k], 0)
    own, _ = sur.thresholds(names, ALPHA)
    bar = np.where(smooth & np.isfinite(own), own, hi)
    return {"phi": phi, "pairs": pairs, "n_eff_median": float(np.median(n_eff)), "configured": ALPHA,
            "measured": float((mi > bar).mean()), "table_only": float((mi > hi).mean())}  # fmt: skip


def matrix_hour(channels: int, minutes: float, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    names = [f"w{k:02d}" for k in range(channels)]
    eng = Engine(EngineConfig(channels=names, window_len=256, hop_samples=20, rate_hz=20.0, skip_stale_hops=False,
                              max_future_s=None, screening="off"))  # fmt: skip
    t0 = 1_732_700_000.0
    n = int(minutes * 60 * 20)
    events = hops = 0
    for lo in range(0, n, 200):  # ten seconds at a time, as a replay
        t = t0 + np.arange(lo, min(n, lo + 200)) / 20.0
        eng.push_frame(t, {c: rng.standard_normal(len(t)) for c in names})
        for end in eng.due_windows():
            _, evs = eng.evaluate(end)
            hops += 1
            events += sum(1 for ev in evs if ev.kind == "became-dependent")
    pairs = channels * (channels - 1) // 2
    return {"channels": channels, "pairs": pairs, "minutes": minutes, "hops": hops, "alpha": eng.detector.alpha,
            "chance_became_dependent": events, "per_hour": events / (minutes / 60)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--quick", action="store_true", help="60 pairs at window 256, 2 minutes (a smoke run)")
    args = ap.parse_args(argv)
    window, sizes = 1024, (8, 24)
    if args.quick:
        args.pairs, args.minutes, window, sizes = 60, 2.0, 256, (8,)
    smooth = [smooth_pairs(phi, args.pairs, window, seed=k) for k, phi in enumerate((0.9, 0.95, 0.98, 0.995))]
    matrix = [matrix_hour(c, args.minutes, seed=c) for c in sizes]
    for r in smooth + matrix:
        print(json.dumps(r), flush=True)
    table = f"Independent AR(1) pairs, window {window}, configured rate {ALPHA} per pair and evaluation:\n\n"
    table += "| phi | pairs | median n_eff | measured rate | with the table alone |\n|---|---|---|---|---|\n"
    table += "".join(f"| {r['phi']} | {r['pairs']} | {r['n_eff_median']:.0f} | {r['measured']:.4f} | "
                     f"{r['table_only']:.4f} |\n" for r in smooth)  # fmt: skip
    table += (f"\nIndependent white-noise channels at 20 Hz, window 256, 1-s hops, {args.minutes:g} min, defaults "
              "(`false_alarms_per_hour: 1`):\n\n| channels | pairs | per-pair rate | chance became-dependent | "
              "per hour |\n|---|---|---|---|---|\n")  # fmt: skip
    table += "".join(f"| {r['channels']} | {r['pairs']} | {r['alpha']:.2e} | {r['chance_became_dependent']} | "
                     f"{r['per_hour']:.2f} |\n" for r in matrix)  # fmt: skip
    if not args.quick:
        write_results("false_alarms", {"args": vars(args), "smooth": smooth, "matrix": matrix, "env": environment()},
                      table)  # fmt: skip
    else:
        print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
