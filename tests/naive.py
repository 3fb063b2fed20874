"""Slow, obviously-correct reference implementations that the fast kernels are tested against."""

from __future__ import annotations

import math

import numpy as np


def midranks(x: np.ndarray) -> np.ndarray:
    """Mid-ranks of a 1-D array mapped to (r + 0.5) / n, by counting."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    out = np.empty(n)
    for k in range(n):
        below = np.sum(x < x[k])
        ties = np.sum(x == x[k])
        out[k] = (below + 0.5 * (ties - 1) + 0.5) / n
    return out


_MASK = 2**64 - 1


def _mix(z: int) -> int:
    """splitmix64 finaliser on Python ints, modulo 2**64."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def jittered_ranks(x: np.ndarray, salt: int = 0) -> np.ndarray:
    """The "jitter" tie policy by counting: a tied sample's rank is its group start plus the
    number of group members with a smaller key mix(position xor digest), the digest starting at
    salt times the golden-ratio constant (mod 2^64)."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    start = [int(np.sum(x < x[k])) for k in range(n)]
    size = [int(np.sum(x == x[k])) for k in range(n)]
    seed = (salt * 0x9E3779B97F4A7C15) & _MASK
    for k in range(n):
        if size[k] > 1:
            seed = (seed + _mix((start[k] << 32) ^ k ^ (size[k] - 1))) & _MASK
    keys = [_mix(k ^ seed) for k in range(n)]
    out = np.empty(n)
    for k in range(n):
        before = sum(1 for m in range(n) if x[m] == x[k] and keys[m] < keys[k])
        out[k] = (start[k] + before + 0.5) / n
    return out


def linear_binned_hist(u: np.ndarray, v: np.ndarray, grid: int) -> np.ndarray:
    """Joint histogram with bilinear weights on nodes g / (grid - 1), one sample at a time."""
    h = np.zeros((grid, grid))
    for a, b in zip(u, v, strict=True):
        pa, pb = a * (grid - 1), b * (grid - 1)
        i, j = min(int(pa), grid - 2), min(int(pb), grid - 2)
        wi, wj = pa - i, pb - j
        h[i, j] += (1 - wi) * (1 - wj)
        h[i + 1, j] += wi * (1 - wj)
        h[i, j + 1] += (1 - wi) * wj
        h[i + 1, j + 1] += wi * wj
    return h


def bilinear(table: np.ndarray, a: float, b: float) -> float:
    """Bilinear interpolation of a table on nodes g / (G - 1) at (a, b)."""
    g = table.shape[0]
    pa, pb = a * (g - 1), b * (g - 1)
    i, j = min(int(pa), g - 2), min(int(pb), g - 2)
    wi, wj = pa - i, pb - j
    return float(
        table[i, j] * (1 - wi) * (1 - wj)
        + table[i + 1, j] * wi * (1 - wj)
        + table[i, j + 1] * (1 - wi) * wj
        + table[i + 1, j + 1] * wi * wj
    )


def screen_statistic(u: np.ndarray, n_basis: int) -> np.ndarray:
    """T * sum_kl c_kl^2 per channel pair, one pair and one (k, l) at a time, features standardised by hand."""
    c, t = u.shape
    feats = []
    for a in range(c):
        rows = []
        for k in range(1, n_basis + 1):
            f = [math.cos(math.pi * k * x) for x in u[a]]
            mean = sum(f) / t
            sd = math.sqrt(sum((v - mean) ** 2 for v in f) / t)
            rows.append([(v - mean) / sd if sd > 1e-12 else 0.0 for v in f])
        feats.append(rows)
    out = np.zeros((c, c))
    for a in range(c):
        for b in range(c):
            total = 0.0
            for k in range(n_basis):
                for m in range(n_basis):
                    cross = sum(x * y for x, y in zip(feats[a][k], feats[b][m], strict=True)) / t
                    total += cross * cross
            out[a, b] = t * total
    return out


def quantile_slabs(u: np.ndarray, v: np.ndarray, slabs: int) -> tuple[np.ndarray, list[list[tuple[float, float]]]]:
    """Slab of each sample by its u rank, and each slab's (u, v) pairs in order of u, row by row."""
    p, t = u.shape
    size = t // slabs
    codes = np.empty((p, t))
    rows = []
    for r in range(p):
        order = sorted(range(t), key=lambda i: (u[r, i], i))
        for pos, i in enumerate(order):
            codes[r, i] = min(pos // size, slabs - 1)
        for k in range(slabs):
            rows.append([(float(u[r, i]), float(v[r, i])) for i in order[k * size : (k + 1) * size]])
    return codes, rows


def lagged_screen_statistic(fx: np.ndarray, fy: np.ndarray, lag: int) -> float:
    """The screen's statistic of features fx, fy (F, L) with y shifted by lag: x[t] against y[t + lag] over the
    overlapping samples, one feature pair and one sample at a time."""
    f, length = fx.shape
    ts = [t for t in range(length) if 0 <= t + lag < length]
    total = 0.0
    for k in range(f):
        for m in range(f):
            cross = sum(float(fx[k, t]) * float(fy[m, t + lag]) for t in ts) / len(ts)
            total += cross * cross
    return len(ts) * total


def merge_batches(batches: list) -> list:
    """Reference for Gather: one (channel, t_s, values) batch per channel in first-seen order, each channel's samples
    concatenated in order."""
    from streamcorr.ingest.source import Batch

    order: dict[str, list] = {}
    for b in batches:
        order.setdefault(b.channel, []).append(b)
    return [Batch(name, np.concatenate([g.t_s for g in group]), np.concatenate([g.values for g in group]))
            for name, group in order.items()]  # fmt: skip


def local_slope_correlations(levels: np.ndarray, a: np.ndarray, b: np.ndarray, bins: int) -> list[tuple[int, float]]:
    """Rows and correlation of a with b within each quartile bin of the level before each sample (the first
    sample's own), one bin at a time, by selecting the rows."""
    prior = np.concatenate([levels[:1], levels[:-1]])
    edges = np.quantile(levels, np.arange(1, bins) / bins)
    which = np.array([sum(p > e for e in edges) for p in prior])
    out = []
    for k in range(bins):
        sel = which == k
        r = float(np.corrcoef(a[sel], b[sel])[0, 1]) if sel.sum() > 1 and a[sel].std() > 0 and b[sel].std() > 0 else 0.0
        out.append((int(sel.sum()), r))
    return out
