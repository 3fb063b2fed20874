"""CPU model path A/B: eager vs the AOT package vs torch.compile, fp32 vs bf16, batch and thread settings.

    python -m bench.cpu_path [--quick]

All variants read the same precomputed rank histograms (paper-protocol mixtures,
window 1024) through ``Estimator.estimate_histograms``, the engine's hot path,
in one process with interleaved repeats (the machine is shared: ratios to the
baseline of the same round are what count). Accuracy: the largest |MI - baseline|
on Table 2 windows (T = 2000 mixtures). Start-up: a fresh process's import plus
first estimate with each setting, compile cache warm (for "aot": the package built, as at every start after
the first on a machine; the build itself, once, is timed as the AOT rows' first call).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np
import torch

from streamcorr.estimate.aot import AotForward
from streamcorr.estimate.copula import marginal_histograms, pair_histograms, rank_transform
from streamcorr.estimate.estimator import Estimator
from training.tasks import random_mixture

from .common import environment, write_results

BASELINE = "eager fp32, batch 128 (the default before aot)"
VARIANTS: dict[str, dict[str, Any]] = {
    BASELINE: {"compile": False},
    "aot package, batch 128 (the default)": {"compile": "aot"},
    "aot package, batch 512": {"compile": "aot", "batch_size": 512},
    "eager fp32, 1 thread": {"compile": False, "threads": 1},
    "eager bf16": {"compile": False, "amp": True},
    "eager fp32, batch 512": {"compile": False, "batch_size": 512},
    "compiled fp32": {"compile": True},
    "compiled bf16": {"compile": True, "amp": True},
    "compiled fp32, batch 512": {"compile": True, "batch_size": 512},
}

STARTUP = (
    "import time; t0 = time.perf_counter(); import numpy as np; from streamcorr.estimate.estimator import Estimator; "
    "est = Estimator(**{kw}); rng = np.random.default_rng(0); x = rng.standard_normal(1024); "
    "est.estimate(x, x + rng.standard_normal(1024)); print(time.perf_counter() - t0)"
)


def histograms(n: int, t: int, seed: int, grid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = np.stack([random_mixture(rng).sample(t, rng).T for _ in range(n)])  # (n, 2, T)
    u = rank_transform(z.reshape(2 * n, t))
    i, j = np.arange(0, 2 * n, 2), np.arange(1, 2 * n, 2)
    marg = marginal_histograms(u, grid)
    return pair_histograms(u, u, grid, i, j), marg[i], marg[j]


def startup_s(kw: dict[str, Any]) -> float:
    cmd = [sys.executable, "-c", STARTUP.format(kw=repr(kw))]
    subprocess.run(cmd, check=True, capture_output=True)  # fills the compile cache
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    n = 512 if args.quick else 2048
    rounds = 3 if args.quick else args.rounds
    base = Estimator(compile=False)
    speed_in = histograms(n, 1024, seed=101, grid=base.grid)
    table2_in = histograms(256 if args.quick else 1000, 2000, seed=202, grid=base.grid)
    ests = {name: Estimator(**kw) for name, kw in VARIANTS.items()}
    reference = base.estimate_histograms(*table2_in)
    rows: dict[str, dict[str, Any]] = {}
    for name, est in ests.items():
        t0 = time.perf_counter()
        if isinstance(est._forward, AotForward) and not est._forward.wait(900):  # built once per machine
            raise SystemExit(f"{name}: the AOT package did not build ({est._forward.state})")
        est.estimate_histograms(*(a[: est.batch_size + 1] for a in speed_in))  # warm-up (and compile)
        rows[name] = {
            "config": VARIANTS[name],
            "first_call_s": time.perf_counter() - t0,
            "max_abs_diff_table2": float(np.abs(est.estimate_histograms(*table2_in) - reference).max()),
            "times": [],
        }
    for _ in range(rounds):  # interleaved: each round times every variant once
        for name, est in ests.items():
            torch.set_num_threads(VARIANTS[name].get("threads") or base_threads)
            t0 = time.perf_counter()
            est.estimate_histograms(*speed_in)
            rows[name]["times"].append(time.perf_counter() - t0)
    today = statistics.median(rows[BASELINE]["times"])
    for name, r in rows.items():
        r["pairs_per_s"] = n / statistics.median(r["times"])
        r["speedup"] = today / statistics.median(r["times"])
        r["startup_s"] = (
            startup_s(VARIANTS[name]) if not args.quick or name.startswith(("eager fp32, batch 128", "aot")) else None
        )
        print(name, {k: v for k, v in r.items() if k != "times"}, flush=True)
    data = {"env": environment(), "pairs": n, "window_len": 1024, "rounds": rounds, "rows": rows}
    md = [
        f"## CPU model path, window 1024, {n} pairs, median of {rounds} interleaved rounds\n",
        "| variant | pairs/s | vs eager | max abs diff on Table 2 windows (nats) | first call s | start-up s |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        st = f"{r['startup_s']:.2f}" if r["startup_s"] is not None else "-"
        md.append(
            f"| {name} | {r['pairs_per_s']:,.0f} | {r['speedup']:.2f}x | {r['max_abs_diff_table2']:.5f} | "
            f"{r['first_call_s']:.1f} | {st} |"
        )
    md += [
        "",
        "Start-up: a fresh process, import + first estimate, compile cache warm (one run before; for aot: the "
        "package built). An aot row's first call is the one-time build of the package for this machine (in a "
        "background process; the eager network serves meanwhile).",
    ]
    write_results("cpu_path_quick" if args.quick else "cpu_path", data, "\n".join(md))
    return 0


base_threads = torch.get_num_threads()

if __name__ == "__main__":
    raise SystemExit(main())
