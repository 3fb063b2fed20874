"""Choose among trained snapshots on a selection set of our own, before any acceptance table is run.

    python -m training.select A.safetensors B.safetensors ... [--average NAME=A,B,C ...] [--write-average DIR]
        [--digits 4]

The selection set is built from seeds of its own (8_300_00x), disjoint from the
training generator (config seed * 1000 + worker), the validation set (424242)
and every held-out acceptance set in bench/ (7_000_00x, 9_1xx_xxx), so picking a
snapshot here does not tune on the tables that judge it. It mirrors those
tables' kinds of data, not their items:

- paper mixtures stratified over MI 0-0.95 (40 per 0.1-wide level; Monte-Carlo
  ground truth, 50k samples), scored at T = 2000, 512 and 256;
- quantised mixtures (3-20 levels, x or both axes, both edge rules), T = 2000;
- bounded noise y = f(x) + U(-w, w) for every f in training.tasks at widths
  0.1-0.5 of the range, and Gaussians at |rho| = 0.9, 0.95, 0.99 (bias of the
  mean over 4 draws), T = 2000;
- order accuracy on 3-D mixtures with K = 3, 5, 8 (200 triplets each), T = 2000.

``--average`` scores the element-wise mean of several snapshots' weights (a
uniform weight average of points along one run); ``--write-average DIR`` saves
each average as DIR/NAME.safetensors with the first snapshot's metadata.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .mixtures import mc_mutual_information, random_mixture
from .tasks import NOISE_FUNCTIONS, Quantiser, bounded_noise_draw, gaussian_mi, quantised_draw

CACHE = Path(__file__).resolve().parent.parent / "bench" / "cache" / "selection_set.npz"
SEED = 8_300_001
LEVEL_WIDTH = 0.05


def _mixture_items(rng: np.random.Generator, per_level: int = 40) -> tuple[list[np.ndarray], list[float]]:
    counts = [0] * 10
    wins, mis = [], []
    while min(counts) < per_level:
        gm = random_mixture(rng)
        rough = round(mc_mutual_information(gm, rng, n=2000)[0] * 10)
        if rough > 9 or counts[max(rough, 0)] >= per_level:
            continue
        mi, _ = mc_mutual_information(gm, rng, n=50_000)
        lvl = round(mi * 10)
        if lvl > 9 or counts[lvl] >= per_level or abs(mi - lvl / 10) > LEVEL_WIDTH:
            continue
        counts[lvl] += 1
        wins.append(gm.sample(2000, rng).T)
        mis.append(mi)
    return wins, mis


def build() -> dict[str, np.ndarray]:
    if CACHE.exists():
        return dict(np.load(CACHE))
    rng = np.random.default_rng(SEED)
    mix_w, mix_mi = _mixture_items(rng)
    qrng = np.random.default_rng(SEED + 1)
    q_w, q_mi = [], []
    for i in range(120):
        levels = [int(qrng.integers(3, 21)), int(qrng.integers(3, 21))]
        if i % 2:
            levels[1] = 0
        d = quantised_draw(random_mixture(qrng), Quantiser((levels[0], levels[1]), i % 4 < 2), qrng, 2000, 20_000)
        q_w.append(d.window.T)
        q_mi.append(d.mi)
    nrng = np.random.default_rng(SEED + 2)
    n_w, n_mi = [], []
    for name in NOISE_FUNCTIONS:
        for width in (0.1, 0.15, 0.25, 0.5):
            draws = [bounded_noise_draw(name, width, nrng, 2000, 0) for _ in range(4)]
            n_w.append(np.stack([d.window.T for d in draws]))
            n_mi.append(draws[0].mi)
    for rho in (0.9, -0.95, 0.99, -0.99):
        n_w.append(nrng.multivariate_normal([0, 0], [[1, rho], [rho, 1]], size=(4, 2000)).transpose(0, 2, 1))
        n_mi.append(gaussian_mi(rho))
    orng = np.random.default_rng(SEED + 3)
    o_w, o_mi, o_k = [], [], []
    for k in (3, 5, 8):
        for _ in range(200):
            gm = random_mixture(orng, dim=3, k=k)
            z = gm.sample(20_000, orng)
            o_mi.append([gm.pointwise_pmi(z, (0,), (j,)).mean() for j in (1, 2)])
            o_w.append(gm.sample(2000, orng).T)
            o_k.append(k)
    out = {
        "mix_w": np.stack(mix_w),
        "mix_mi": np.array(mix_mi),
        "q_w": np.stack(q_w),
        "q_mi": np.array(q_mi),
        "noise_w": np.stack(n_w),
        "noise_mi": np.array(n_mi),
        "order_w": np.stack(o_w),
        "order_mi": np.array(o_mi),
        "order_k": np.array(o_k),
    }
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    np.savez(CACHE, **out)  # type: ignore[arg-type]
    return out


def score(estimate: Any, s: dict[str, np.ndarray]) -> dict[str, float]:
    """Selection metrics for estimate(x (P, T), y (P, T)) -> (P,)."""
    out: dict[str, float] = {}
    for t in (2000, 512, 256):
        err = estimate(s["mix_w"][:, 0, :t], s["mix_w"][:, 1, :t]) - s["mix_mi"]
        out[f"mix_mae_{t}"] = float(np.abs(err).mean())
        if t == 2000:
            lvl = np.round(s["mix_mi"] * 10).astype(int)
            out["mix_worst_level_bias"] = float(max(abs(err[lvl == v].mean()) for v in range(10)))
    err = estimate(s["q_w"][:, 0], s["q_w"][:, 1]) - s["q_mi"]
    out["quant_mae"], out["quant_bias"] = float(np.abs(err).mean()), float(err.mean())
    nw = s["noise_w"]
    est = estimate(nw[:, :, 0].reshape(-1, nw.shape[-1]), nw[:, :, 1].reshape(-1, nw.shape[-1]))
    bias = est.reshape(nw.shape[0], nw.shape[1]).mean(1) - s["noise_mi"]
    out["noise_worst_bias"] = float(np.abs(bias).max())
    out["noise_mean_abs_bias"] = float(np.abs(bias).mean())
    ow, omi = s["order_w"], s["order_mi"]
    right = (estimate(ow[:, 0], ow[:, 1]) > estimate(ow[:, 0], ow[:, 2])) == (omi[:, 0] > omi[:, 1])
    for k in (3, 5, 8):
        out[f"order_k{k}"] = float(right[s["order_k"] == k].mean())
    return out


def _average(paths: list[str], dest: Path) -> str:
    """Element-wise mean of several weights files of one architecture, saved with the first one's metadata."""
    import torch

    from streamcorr.estimate.weights import load_model, save_weights

    loaded = [load_model(p) for p in paths]
    model, meta = loaded[0]
    states = [m.state_dict() for m, _ in loaded]
    model.load_state_dict({k: torch.stack([sd[k] for sd in states]).mean(0) for k in states[0]})
    save_weights(model, dest, {**meta, "averaged_from": [Path(p).name for p in paths]})
    return str(dest)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("weights", nargs="*")
    ap.add_argument("--average", action="append", default=[], help="NAME=A,B,...: score the mean of these weights")
    ap.add_argument("--write-average", type=Path, default=Path(tempfile.gettempdir()), help="where averages go")
    ap.add_argument("--digits", type=int, default=4, help="decimal places in the table")
    args = ap.parse_args(argv)
    os.environ.setdefault("STREAMCORR_AOT", "0")  # eager network: no compiled package per candidate
    from streamcorr import Estimator

    s = build()
    cands = {Path(w).stem if Path(w).parent.name == "models" else w: w for w in args.weights}
    for spec in args.average:
        name, paths = spec.split("=", 1)
        args.write_average.mkdir(parents=True, exist_ok=True)
        cands[name] = _average(paths.split(","), args.write_average / f"{name}.safetensors")
    rows = {name: score(Estimator(path).estimate_batch, s) for name, path in cands.items()}
    keys = list(next(iter(rows.values())))
    print("| candidate | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(f"{r[k]:.{args.digits}f}" for k in keys) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
