"""Held-out evaluation protocols with Monte-Carlo ground truth (the paper's Tables 2 and 3).

Test distributions are drawn from their own seeds, disjoint from training, and
cached under bench/cache/ (recomputed when missing). Ground truth for a mixture
is the Monte-Carlo mean of log p(x, y) - log p(x) - log p(y) over samples of
the mixture, with its standard error reported beside it.

    python -m training.evaluate [--weights models/infonet-v1.safetensors] [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .mixtures import GaussianMixture, mc_mutual_information, random_mixture

CACHE = Path(__file__).resolve().parent.parent / "bench" / "cache"
LEVELS = tuple(round(0.1 * i, 1) for i in range(10))
LEVEL_SEED = 7_000_001
ORDER_SEED = 7_000_002

Estimate = Callable[[np.ndarray, np.ndarray], np.ndarray]  # x, y (P, T) -> (P,)


@dataclass
class LevelSet:
    mixtures: list[GaussianMixture]
    mi: np.ndarray  # (N,) ground truth, nats
    se: np.ndarray  # (N,) its Monte-Carlo standard error
    level: np.ndarray  # (N,) the MI level each mixture was accepted for


def _pack(mixtures: list[GaussianMixture]) -> dict[str, np.ndarray]:
    k = np.array([m.weights.shape[0] for m in mixtures])
    kmax, d = int(k.max()), mixtures[0].dim
    w = np.zeros((len(mixtures), kmax))
    mu = np.zeros((len(mixtures), kmax, d))
    cov = np.tile(np.eye(d), (len(mixtures), kmax, 1, 1))
    for i, m in enumerate(mixtures):
        w[i, : k[i]], mu[i, : k[i]], cov[i, : k[i]] = m.weights, m.means, m.covs
    return {"k": k, "w": w, "mu": mu, "cov": cov}


def _unpack(z: dict[str, np.ndarray]) -> list[GaussianMixture]:
    return [GaussianMixture(z["w"][i, :k], z["mu"][i, :k], z["cov"][i, :k]) for i, k in enumerate(z["k"])]


def level_set(n_per_level: int = 100, mc_samples: int = 100_000, width: float = 0.02) -> LevelSet:
    """Table 2 protocol: paper-generator mixtures accepted when their MI is within +-width of a level."""
    path = CACHE / f"levels_{n_per_level}_{mc_samples}.npz"
    if path.exists():
        z = dict(np.load(path))
        return LevelSet(_unpack(z), z["mi"], z["se"], z["level"])
    rng = np.random.default_rng(LEVEL_SEED)
    counts = dict.fromkeys(LEVELS, 0)
    mixtures, mis, ses, levels = [], [], [], []
    while min(counts.values()) < n_per_level:
        gm = random_mixture(rng)
        rough, _ = mc_mutual_information(gm, rng, n=2000)
        lvl = min(LEVELS, key=lambda v: abs(v - rough))
        if counts[lvl] >= n_per_level or abs(rough - lvl) > 3 * width:
            continue
        mi, se = mc_mutual_information(gm, rng, n=mc_samples)
        if abs(mi - lvl) <= width:
            counts[lvl] += 1
            mixtures.append(gm)
            mis.append(mi)
            ses.append(se)
            levels.append(lvl)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.savez(path, **_pack(mixtures), mi=np.array(mis), se=np.array(ses), level=np.array(levels))  # type: ignore[arg-type]
    return LevelSet(mixtures, np.array(mis), np.array(ses), np.array(levels))


def order_set(k: int, n: int = 500, mc_samples: int = 20_000) -> tuple[list[GaussianMixture], np.ndarray, np.ndarray]:
    """Table 3 protocol: 3-D mixtures of K components; GT I(x, y) and I(x, y') (n, 2) and their SEs."""
    path = CACHE / f"order_k{k}_{n}_{mc_samples}.npz"
    if path.exists():
        z = dict(np.load(path))
        return _unpack(z), z["mi"], z["se"]
    rng = np.random.default_rng(ORDER_SEED + k)
    mixtures = [random_mixture(rng, dim=3, k=k) for _ in range(n)]
    mi, se = np.zeros((n, 2)), np.zeros((n, 2))
    for i, gm in enumerate(mixtures):
        zs = gm.sample(mc_samples, rng)
        for j, other in enumerate((1, 2)):
            pmi = gm.pointwise_pmi(zs, (0,), (other,))
            mi[i, j], se[i, j] = pmi.mean(), pmi.std(ddof=1) / np.sqrt(mc_samples)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.savez(path, **_pack(mixtures), mi=mi, se=se)  # type: ignore[arg-type]
    return mixtures, mi, se


def windows(mixtures: list[GaussianMixture], window_len: int, seed: int, dims: tuple[int, int] = (0, 1)) -> np.ndarray:
    """One window of window_len samples per mixture: (N, 2, T) for the coordinates in dims."""
    rng = np.random.default_rng(seed)
    return np.stack([gm.sample(window_len, rng)[:, dims].T for gm in mixtures])


def eval_levels(estimate: Estimate, ls: LevelSet, window_len: int = 2000, seed: int = 11) -> dict[str, object]:
    w = windows(ls.mixtures, window_len, seed)
    t0 = time.perf_counter()
    est = estimate(w[:, 0], w[:, 1])
    wall = time.perf_counter() - t0
    err = est - ls.mi
    rows = []
    for lvl in LEVELS:
        sel = ls.level == lvl
        rows.append(
            {
                "level": lvl,
                "n": int(sel.sum()),
                "mean_error": float(err[sel].mean()),
                "var_error": float(err[sel].var()),
                "mae": float(np.abs(err[sel]).mean()),
            }
        )
    return {
        "window_len": window_len,
        "rows": rows,
        "mae": float(np.abs(err).mean()),
        "max_abs_mean_error": float(max(abs(float(r["mean_error"])) for r in rows)),
        "gt_se_max": float(ls.se.max()),
        "wall_s": wall,
    }


def order_windows(k: int, n: int, window_len: int = 2000, seed: int = 13) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Table 3 windows (n, 3, T), ground truth (n, 2), and the oracle's estimates (n, 2).

    The oracle averages the true log density ratio over the same window: the best
    any estimator can do from T samples without bias, so its accuracy is the
    protocol's ceiling at this window length.
    """
    mixtures, mi, _ = order_set(k, n)
    rng = np.random.default_rng(seed + k)
    samples = np.stack([gm.sample(window_len, rng) for gm in mixtures])  # (N, T, 3)
    oracle = np.array(
        [[gm.pointwise_pmi(z, (0,), (j,)).mean() for j in (1, 2)] for gm, z in zip(mixtures, samples, strict=True)]
    )
    return samples.transpose(0, 2, 1), mi, oracle


def order_accuracy(est_xy: np.ndarray, est_xz: np.ndarray, mi: np.ndarray) -> float:
    return float(((est_xy > est_xz) == (mi[:, 0] > mi[:, 1])).mean())


def eval_order(estimate: Estimate, k: int, n: int, window_len: int = 2000) -> dict[str, float]:
    w, mi, oracle = order_windows(k, n, window_len)
    acc = order_accuracy(estimate(w[:, 0], w[:, 1]), estimate(w[:, 0], w[:, 2]), mi)
    return {
        "k": k,
        "n": n,
        "accuracy": acc,
        "oracle_accuracy": order_accuracy(oracle[:, 0], oracle[:, 1], mi),
        "near_ties": float((np.abs(mi[:, 0] - mi[:, 1]) < 0.02).mean()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default=None)
    ap.add_argument("--quick", action="store_true", help="30 mixtures per level, 100 triplets per K")
    args = ap.parse_args(argv)
    from streamcorr import Estimator

    est = Estimator(args.weights)
    n_lvl, n_ord = (30, 100) if args.quick else (100, 500)
    out = {
        "levels": eval_levels(est.estimate_batch, level_set(n_lvl)),
        "order": [eval_order(est.estimate_batch, k, n_ord) for k in range(1, 11)],
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
