"""Estimator throughput vs scikit-learn's KSG (paper Table 1 layout), and cold start-up.

    python -m bench.speed [--quick]

Both estimators see the same pairs (random paper-generator mixtures) in the same
run. KSG is `mutual_info_regression(k=3)`, one pair per call as a user would run
it, timed in a child process that never imports torch (so torch's worker threads
cannot slow it). InfoNet is `estimate_mi_batch` over all pairs at once (its hot
path) and `estimate_mi` one pair at a time. Reported: median of repeats, pairs/s.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import subprocess
import sys
import time

import numpy as np

from training.tasks import random_mixture

from .common import environment, median_time, write_results

LENGTHS = (200, 500, 1000, 2000, 5000)

STARTUP_SNIPPET = (
    "import time; t0 = time.perf_counter(); import numpy as np; import streamcorr; "
    "rng = np.random.default_rng(0); x = rng.standard_normal(2000); "
    "streamcorr.estimate_mi(x, x + rng.standard_normal(2000)); print(time.perf_counter() - t0)"
)


def pairs(n: int, t: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = np.stack([random_mixture(rng).sample(t, rng).T for _ in range(n)])  # (n, 2, T)
    return z[:, 0], z[:, 1]


def ksg_seconds(x: np.ndarray, y: np.ndarray, repeats: int) -> float:
    """Median seconds for KSG (k = 3) over all rows, one call per pair."""
    from sklearn.feature_selection import mutual_info_regression

    def run() -> None:
        for a, b in zip(x, y, strict=True):
            mutual_info_regression(a[:, None], b, n_neighbors=3, random_state=0)

    return median_time(run, repeats)


def startup(repeats: int) -> dict[str, float]:
    """Fresh-process import + first estimate_mi, with Numba's on-disk cache warm (one untimed run first)."""
    cmd = [sys.executable, "-c", STARTUP_SNIPPET]
    subprocess.run(cmd, check=True, capture_output=True)
    inner, outer = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        outer.append(time.perf_counter() - t0)
        inner.append(float(out.strip().splitlines()[-1]))
    return {"in_process_s": statistics.median(inner), "whole_process_s": statistics.median(outer), "repeats": repeats}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    n_batch = 64 if args.quick else 512
    n_ksg = 8 if args.quick else 64
    n_single = 16 if args.quick else 64
    lengths = (200, 2000) if args.quick else LENGTHS
    data_by_t = {t: pairs(n_batch, t, seed=t) for t in lengths}

    with mp.get_context("spawn").Pool(1) as pool:  # KSG first, in a process without torch
        ksg_s = {t: pool.apply(ksg_seconds, (x[:n_ksg], y[:n_ksg], args.repeats)) for t, (x, y) in data_by_t.items()}

    from streamcorr import Estimator

    est = Estimator()
    rows = []
    for t, (x, y) in data_by_t.items():
        batch_s = median_time(lambda x=x, y=y: est.estimate_batch(x, y), args.repeats)
        single_s = median_time(
            lambda x=x, y=y: [est.estimate(a, b) for a, b in zip(x[:n_single], y[:n_single], strict=True)],
            args.repeats,
        )
        row = {
            "window_len": t,
            "infonet_batch_pairs_per_s": n_batch / batch_s,
            "infonet_single_pairs_per_s": n_single / single_s,
            "ksg3_pairs_per_s": n_ksg / ksg_s[t],
        }
        row["batch_over_ksg"] = row["infonet_batch_pairs_per_s"] / row["ksg3_pairs_per_s"]
        rows.append(row)
        print(row, flush=True)
    start = startup(3 if args.quick else args.repeats)
    data = {"env": environment(), "batch_pairs": n_batch, "ksg_pairs": n_ksg, "repeats": args.repeats,
            "rows": rows, "startup": start}  # fmt: skip
    md = [
        f"## Throughput (pairs/s; median of {args.repeats} repeats; same pairs for both)\n",
        "| T | InfoNet batch | InfoNet one-by-one | KSG k=3 (1 core) | batch / KSG |",
        "|---|---|---|---|---|",
    ]
    md += [
        f"| {r['window_len']} | {r['infonet_batch_pairs_per_s']:.0f} | {r['infonet_single_pairs_per_s']:.0f} | "
        f"{r['ksg3_pairs_per_s']:.0f} | {r['batch_over_ksg']:.1f}x |"
        for r in rows
    ]
    md += [
        "",
        f"Cold start (fresh process, import + first `estimate_mi`, Numba cache warm): "
        f"{start['in_process_s']:.2f} s in-process, {start['whole_process_s']:.2f} s whole process "
        f"(median of {start['repeats']}).",
    ]
    write_results("speed_quick" if args.quick else "speed", data, "\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
