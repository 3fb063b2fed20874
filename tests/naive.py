"""Slow, obviously-correct reference implementations that the fast kernels are tested against."""

from __future__ import annotations

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
