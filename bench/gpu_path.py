"""The CUDA path end to end: host ranks -> device histograms -> InfoNet -> host MI.

    python -m bench.gpu_path [--channels 256 1024 4096] [--window 1024] [--budget-s 240]

Needs a CUDA device. For each channel count, all C (C - 1) / 2 pairs of one
window are estimated by ``Estimator.estimate_ranks`` (``TensorPath`` on CUDA)
from copula values on the host (the engine's shared ranks) to MI values on the
host; pairs/s is the median of repeats after a warm-up. First the variants
(eager or compiled, fp32 or bf16 autocast, TF32) are compared at 1,024
channels and checked against the CPU path
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

from streamcorr.estimate.copula import rank_transform
from streamcorr.estimate.estimator import Estimator
from streamcorr.estimate.tensor_path import TensorPath, TimeSplit

from .common import environment, write_results

TOLERANCE = 0.005  # nats: the bar for an adopted faster path

# name, Estimator keywords, TF32 for the fp32 matrix products (the histograms use fp16 on tensor cores)
VARIANTS: list[tuple[str, dict[str, Any], bool]] = [
    ("eager fp32", {"amp": False, "compile": False}, False),
    ("eager bf16", {"amp": True, "compile": False}, False),
    ("compiled bf16", {"amp": True, "compile": True}, False),
    ("compiled bf16 + TF32", {"amp": True, "compile": True}, True),
]


def windows(c: int, t: int, seed: int) -> np.ndarray:
    """C channels of one window: independent noise plus a sparse set of dependent pairs (1 in 8 channels)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((c, t))
    for k in range(0, c - 1, 8):
        kind = (k // 8) % 4
        base = x[k]
        x[k + 1] = [base, base**2, np.sin(2 * base), np.abs(base)][kind] + 0.3 * rng.standard_normal(t)
    return x


def time_pairs(est: Estimator, u: np.ndarray, iu: np.ndarray, iv: np.ndarray, repeats: int) -> float:
    """Median seconds of ``est.estimate_ranks`` over all the pairs, after a warm-up on a slice."""
    est.estimate_ranks(u, iu[:20000], iv[:20000])
    times = []
    for _ in range(repeats):
        if est.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        est.estimate_ranks(u, iu, iv)
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
    cpu = Estimator(device="cpu")
    t = args.window

    # accuracy against the CPU path (Numba histograms, fp32 eager model) on the same pairs
    x = windows(256, t, seed=11)
    u = rank_transform(x)
    iu, iv = np.triu_indices(256, 1)
    sub = np.random.default_rng(3).choice(len(iu), 2000, replace=False)
    ref = cpu.estimate_ranks(u, iu[sub], iv[sub])
    nv = args.variant_channels
    uc = rank_transform(windows(nv, t, seed=12))
    ivu, ivv = np.triu_indices(nv, 1)
    variants: list[dict[str, Any]] = []
    chosen: Estimator | None = None
    best = 0.0
    for name, kw, tf32 in VARIANTS:
        if time.perf_counter() - start > args.budget_s / 2:
            print(f"budget: skipping variant {name}", flush=True)
            continue
        torch.backends.cuda.matmul.allow_tf32 = tf32
        t0 = time.perf_counter()
        try:
            est = Estimator(device=args.device, batch_size=16384, **kw)
            diff = float(np.abs(est.estimate_ranks(u, iu[sub], iv[sub]) - ref).max())  # also compiles
            first_s = time.perf_counter() - t0
            rate = len(ivu) / time_pairs(est, uc, ivu, ivv, args.repeats)
        except Exception as exc:  # a variant that fails (e.g. no compiler) is a result, not a crash
            variants.append({"variant": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
            print(variants[-1], flush=True)
            continue
        v = {"variant": name, "first_call_s": first_s, "max_abs_diff_vs_cpu": diff, "pairs_per_s": rate}
        variants.append(v)
        print(v, flush=True)
        if diff <= TOLERANCE and rate > best:
            best, chosen, chosen_tf32, chosen_name = rate, est, tf32, name
    assert chosen is not None
    torch.backends.cuda.matmul.allow_tf32 = chosen_tf32

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
        seconds = time_pairs(chosen, u, iu, iv, args.repeats if len(iu) < 2_000_000 else 2)
        timed = TensorPath(
            chosen._forward, grid=chosen.grid, device=chosen.device, batch_size=16384,
            hist_dtype=torch.float16, amp=chosen.amp, timed=True,
        )  # fmt: skip
        timed.estimate(u, iu[:1000], iv[:1000])
        timed.split = TimeSplit()
        timed.estimate(u, iu, iv)
        row = {"channels": c, "pairs": len(iu), "seconds": seconds, "pairs_per_s": len(iu) / seconds,
               "host_ranks_s": ranks_s, "split_s": timed.split.as_dict()}  # fmt: skip
        rows.append(row)
        print(row, flush=True)

    env = environment()
    env.update({"device": device_name, "cuda": torch.version.cuda})
    data = {"env": env, "window_len": t, "variants": variants, "chosen": chosen_name, "rows": rows}
    md = [
        f"## CUDA path on {device_name}, window {t}\n",
        f"`Estimator.estimate_ranks` end to end, from host ranks (C, T) to host MI (P,), all pairs of one window; "
        f"median of repeats. Variant: {chosen_name} (the fastest within {TOLERANCE} nats of the CPU path).\n",
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
        "The split comes from a separate run that synchronises the device around each stage (so stages do not "
        "overlap); host ranks: `rank_transform` of all channels from raw values (the engine ranks incrementally).",
        "",
        f"Variants at {nv:,} channels (max |MI - CPU path| on 2,000 pairs at 256 channels; first call includes "
        "loading and compiling):\n",
        "| variant | pairs/s | max abs diff (nats) | first call s |",
        "|---|---|---|---|",
    ]
    md += [
        f"| {v['variant']} | {v['pairs_per_s']:,.0f} | {v['max_abs_diff_vs_cpu']:.5f} | {v['first_call_s']:.1f} |"
        if "error" not in v
        else f"| {v['variant']} | failed: {v['error']} | | |"
        for v in variants
    ]
    write_results(f"gpu_path_{slug}", data, "\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
