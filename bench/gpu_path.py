"""The CUDA path end to end: host ranks -> device histograms -> InfoNet -> host MI.

    python -m bench.gpu_path [--channels 256 1024 4096] [--window 1024] [--budget-s 240]

Needs a CUDA device. For each channel count, all C (C - 1) / 2 pairs of one
window are estimated by ``TensorPath`` from copula values on the host (the
engine's shared ranks) to MI values on the host; pairs/s is the median of
repeats after a warm-up. First the variants (histogram dtype, bf16 autocast,
batch size) are compared at 1,024 channels and checked against the CPU path
(Numba histograms, fp32 model) on the same pairs; the fastest variant within
0.005 nats of it is then timed at every channel count, with the time split
between host ranking, upload, bin weights, histograms, model and download.
Results name the device.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import torch

from streamcorr.copula import marginal_histograms, pair_histograms, rank_transform
from streamcorr.estimator import Estimator
from streamcorr.tensor_path import TensorPath

from .common import environment, write_results

TOLERANCE = 0.005  # nats: the bar for an adopted faster path


def windows(c: int, t: int, seed: int) -> np.ndarray:
    """C channels of one window: independent noise plus a sparse set of dependent pairs (1 in 8 channels)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((c, t))
    for k in range(0, c - 1, 8):
        kind = (k // 8) % 4
        base = x[k]
        x[k + 1] = [base, base**2, np.sin(2 * base), np.abs(base)][kind] + 0.3 * rng.standard_normal(t)
    return x


def time_pairs(path: TensorPath, u: np.ndarray, iu: np.ndarray, iv: np.ndarray, repeats: int) -> float:
    path.estimate(u, iu[: min(len(iu), 4 * path.batch_size)], iv[: min(len(iv), 4 * path.batch_size)])  # warm-up
    times = []
    for _ in range(repeats):
        if path.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        path.estimate(u, iu, iv)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--channels", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop adding runs after this much wall time")
    ap.add_argument("--variant-channels", type=int, default=1024, help="channels at which the variants are timed")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script on CPU tensors")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: this benchmark needs one")
        return 2
    start = time.perf_counter()
    if args.device == "cuda":
        props = torch.cuda.get_device_properties(torch.device("cuda"))
        device_name = f"{props.name} ({props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs)"
        slug = props.name.lower().replace(" ", "-")
    else:
        device_name, slug = "cpu (dry run)", "cpu-dry-run"
    print("device:", device_name, flush=True)
    est = Estimator(device=args.device)
    cpu = Estimator(device="cpu")
    t = args.window

    # accuracy of each variant against the CPU path on the same pairs
    x = windows(256, t, seed=11)
    u = rank_transform(x)
    iu, iv = np.triu_indices(256, 1)
    sub = np.random.default_rng(3).choice(len(iu), 2000, replace=False)
    marg = marginal_histograms(u, cpu.grid)
    ref = cpu.estimate_histograms(pair_histograms(u, u, cpu.grid, iu[sub], iv[sub]), marg[iu[sub]], marg[iv[sub]])
    variants: list[dict[str, Any]] = []
    for hist_dtype in (torch.float32, torch.float16):
        for amp in (False, True):
            for batch in (4096, 16384):
                path = TensorPath(est.model, batch_size=batch, hist_dtype=hist_dtype, amp=amp)
                err = float(np.abs(path.estimate(u, iu[sub], iv[sub]) - ref).max())
                variants.append({"hist_dtype": str(hist_dtype).removeprefix("torch."), "amp_bf16": amp,
                                 "batch": batch, "max_abs_diff_vs_cpu": err, "_path": path})  # fmt: skip
    # speed of each variant at 1,024 channels
    nv = args.variant_channels
    xc = windows(nv, t, seed=12)
    uc = rank_transform(xc)
    iu, iv = np.triu_indices(nv, 1)
    for v in variants:
        v["pairs_per_s_1024"] = len(iu) / time_pairs(v["_path"], uc, iu, iv, args.repeats)
        print({k: val for k, val in v.items() if k != "_path"}, flush=True)
    ok = [v for v in variants if v["max_abs_diff_vs_cpu"] <= TOLERANCE]
    best = max(ok, key=lambda v: v["pairs_per_s_1024"])
    path: TensorPath = best["_path"]

    rows = []
    for c in args.channels:
        if time.perf_counter() - start > args.budget_s:
            print(f"budget spent: skipping {c} channels", flush=True)
            continue
        x = windows(c, t, seed=c)
        t0 = time.perf_counter()
        u = rank_transform(x)
        ranks_s = time.perf_counter() - t0
        iu, iv = np.triu_indices(c, 1)
        repeats = args.repeats if len(iu) < 2_000_000 else 2
        seconds = time_pairs(path, u, iu, iv, repeats)
        timed = TensorPath(est.model, batch_size=path.batch_size, hist_dtype=path.hist_dtype, amp=path.amp, timed=True)
        timed.estimate(u, iu[:1000], iv[:1000])
        timed.split = type(timed.split)()
        timed.estimate(u, iu, iv)
        split = timed.split.as_dict()
        row = {"channels": c, "pairs": len(iu), "seconds": seconds, "pairs_per_s": len(iu) / seconds,
               "host_ranks_s": ranks_s, "split_s": split}  # fmt: skip
        rows.append(row)
        print(row, flush=True)

    compiled: dict[str, Any] = {}
    if time.perf_counter() - start < args.budget_s:
        try:
            t0 = time.perf_counter()
            cmodel = torch.compile(est.model, dynamic=False)
            cpath = TensorPath(cmodel, batch_size=path.batch_size, hist_dtype=path.hist_dtype, amp=path.amp)  # type: ignore[arg-type]
            xs = windows(256, t, seed=11)
            us = rank_transform(xs)
            iu, iv = np.triu_indices(256, 1)
            cpath.estimate(us, iu[: path.batch_size], iv[: path.batch_size])
            compiled["compile_s"] = time.perf_counter() - t0
            iu, iv = np.triu_indices(nv, 1)
            compiled["pairs_per_s_1024"] = len(iu) / time_pairs(cpath, uc, iu, iv, args.repeats)
            iu2, iv2 = np.triu_indices(256, 1)
            compiled["max_abs_diff_vs_cpu"] = float(np.abs(cpath.estimate(us, iu2[sub], iv2[sub]) - ref).max())
        except Exception as exc:  # a compiler failure is a result to record, not a crash
            compiled["error"] = f"{type(exc).__name__}: {exc}"[:300]
        print("compiled:", compiled, flush=True)

    env = environment()
    env.update({"device": device_name, "cuda": torch.version.cuda, "cpu_threads_numba": env.get("numba_threads")})
    data = {"env": env, "window_len": t, "variants": [{k: v for k, v in d.items() if k != "_path"} for d in variants],
            "chosen": {k: v for k, v in best.items() if k != "_path"}, "rows": rows, "compiled": compiled}  # fmt: skip
    md = [
        f"## CUDA path on {device_name}, window {t}\n",
        "End to end from host ranks (C, T) to host MI (P,), all pairs of one window; median of repeats.\n",
        "| channels | pairs | pairs/s | seconds | host ranks s | upload s | bin weights s | histograms s | model s "
        "| download s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r["split_s"]
        md.append(
            f"| {r['channels']} | {r['pairs']:,} | {r['pairs_per_s']:,.0f} | {r['seconds']:.3f} | "
            f"{r['host_ranks_s']:.3f} | {s['upload_s']:.4f} | {s['weights_s']:.4f} | {s['histograms_s']:.3f} | "
            f"{s['model_s']:.3f} | {s['download_s']:.4f} |"
        )
    md += [
        "",
        f"Variants at {nv:,} channels (max |MI - CPU path| on 2,000 pairs at 256 channels):\n",
        "| histogram dtype | bf16 autocast | batch | pairs/s | max abs diff (nats) |",
        "|---|---|---|---|---|",
    ]
    md += [
        f"| {v['hist_dtype']} | {v['amp_bf16']} | {v['batch']} | {v['pairs_per_s_1024']:,.0f} | "
        f"{v['max_abs_diff_vs_cpu']:.5f} |"
        for v in data["variants"]
    ]
    md += ["", f"Chosen: the fastest variant within {TOLERANCE} nats: {data['chosen']}", "",
           f"torch.compile of the model (same variant): {compiled}"]  # fmt: skip
    write_results(f"gpu_path_{slug}", data, "\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
